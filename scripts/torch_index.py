"""Which index `make install` takes torch from on a machine without a CUDA driver.

PyPI's Linux torch wheel is the CUDA build (with gigabytes of nvidia wheels); PyTorch's CPU index
serves the CPU build of the same version. This prints that index's URL when its page for torch lists
a CPU wheel of the pinned version for this Python (what pip would resolve there, read from the
simple index page; nothing downloaded), and prints nothing when it does not or cannot be reached
within the timeout: pip's configured index then serves torch, as on a machine whose network reaches
only a registry mirror (an index pip cannot reach would stall it for minutes). The reason goes to
stderr, one line, which `make install` shows.

    python scripts/torch_index.py --version 2.13.0 [--index https://download.pytorch.org/whl/cpu]
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"


def wheel_prefix(version: str, py: tuple[int, int] = sys.version_info[:2]) -> str:
    """The start of the CPU wheel's file name for `version` and the Python `py` (PEP 427 naming)."""
    return f"torch-{version}+cpu-cp{py[0]}{py[1]}-"


def lists_cpu_wheel(page: str, version: str, py: tuple[int, int] = sys.version_info[:2]) -> bool:
    """Whether a simple-index page (PEP 503) names a CPU wheel of torch `version` for Python `py`
    on Linux x86-64 or aarch64 (the `+` of the local version appears as `%2B` in links)."""
    text = page.replace("%2B", "+").replace("%2b", "+")
    prefix = wheel_prefix(version, py)
    return any(
        prefix in line and ("linux_x86_64" in line or "linux_aarch64" in line or "manylinux" in line)
        for line in text.splitlines()
    )


def choose_index(index: str, version: str, timeout_s: float) -> tuple[str, str]:
    """(index URL to use or "", the reason in one line)."""
    url = index.rstrip("/") + "/torch/"
    if url.startswith("file:"):  # a local index (as pip reads one): the folder's page
        url += "index.html"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 (an https or file URL given by make)
            page = reply.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return "", f"{index} not reachable ({reason}); torch from pip's configured index"
    if not lists_cpu_wheel(page, version):
        py = ".".join(map(str, sys.version_info[:2]))
        return "", f"{index} lists no CPU wheel of torch {version} for Python {py}; torch from pip's configured index"
    return index, f"the CPU wheel of torch {version} from {index} (no CUDA driver here)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True, help="torch's pinned version, e.g. 2.13.0")
    parser.add_argument("--index", default=DEFAULT_INDEX, help=f"the CPU index (default {DEFAULT_INDEX})")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the index (default 5)")
    args = parser.parse_args(argv)
    chosen, reason = choose_index(args.index, args.version, args.timeout)
    print(f"torch index: {reason}", file=sys.stderr)
    print(chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
