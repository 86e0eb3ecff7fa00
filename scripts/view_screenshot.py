"""A screenshot of `pvpo view`'s page, for the documentation: two evaluation folders compared (the
first flipped question opened, A's and B's episodes side by side), or one folder or run dir.

    python scripts/view_screenshot.py WARM_START_EVAL RL_EVAL --out docs/guides/viewer-compare.png
    python scripts/view_screenshot.py RUN_DIR --out docs/guides/viewer-run.png --fragment 'gt=gt'

Headless Chromium (Debian's `chromium`, or `chromium-headless-shell`) renders the page from a
temporary file at `--width` x `--height` CSS pixels; `--fragment` sets the page's state as its URL
would (filters, `open=KEY`), by default the first flipped question of a comparison, opened.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from pvpo.viewer.headless import MISSING, find_chromium, headless_command
from pvpo.viewer.page import page_data, render_page
from pvpo.viewer.sources import read_source


def default_fragment(data: dict) -> str:
    """A comparison's first flipped question, opened (B's gains first); '' for other pages."""
    if data["kind"] != "compare":
        return ""
    for wanted in ("gained", "lost"):
        for i, j, flip in data["pairs"]:
            if flip == wanted:
                key = (data["episodes"][0][i] if i >= 0 else data["episodes"][1][j])["k"]
                return f"flip=flipped&open={quote(key, safe='/')}"
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path, help="one evaluation folder or run dir, or two evaluation folders")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--fragment", default=None, help="the page's state, as after # in its URL (default: see above)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1500)
    args = ap.parse_args(argv)
    exe = find_chromium()
    if exe is None:
        print(MISSING, file=sys.stderr)
        return 2
    data = page_data([read_source(p) for p in args.paths])
    fragment = default_fragment(data) if args.fragment is None else args.fragment
    with tempfile.TemporaryDirectory(prefix="pvpo-shot-") as tmp:
        page = Path(tmp) / "view.html"
        page.write_text(render_page(data), encoding="utf-8")
        url = page.as_uri() + (f"#{fragment}" if fragment else "")
        done = subprocess.run(
            headless_command(
                exe,
                Path(tmp) / "profile",
                "--hide-scrollbars",
                f"--window-size={args.width},{args.height}",
                "--virtual-time-budget=10000",
                f"--screenshot={args.out.resolve()}",
                url,
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
    if done.returncode != 0 or not args.out.is_file():
        print(done.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({url.split('#', 1)[-1] if fragment else 'the page as it opens'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
