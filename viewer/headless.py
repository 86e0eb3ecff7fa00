"""Headless Chromium on a `pvpo view` page, for the screenshot script, the viewer bench and the
browser tests: which binary, and the flags that keep a run self-contained (a fresh profile, no
network, no GPU, no first-run or update work)."""

from __future__ import annotations

import shutil
from pathlib import Path

# Debian's full browser first, then its headless shell (`chromium-headless-shell`)
BINARIES = ("chromium", "chromium-headless-shell", "chromium-browser")
MISSING = "headless Chromium is missing: apt-get install chromium"


def find_chromium() -> str | None:
    """The first of BINARIES on PATH; None where none is installed."""
    return next((found for name in BINARIES if (found := shutil.which(name))), None)


def headless_command(exe: str, profile: Path | str, *args: str) -> list[str]:
    """`exe` headless with a profile of its own at `profile`, then `args` (what to do, the URL last)."""
    return [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
