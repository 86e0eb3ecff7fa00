"""Docker HEALTHCHECK of the two images: exit 0 when healthy, 1 (with one line why) when not.

    healthcheck.py retriever   this container's server answers GET /health (PVPO_SERVE_PORT)
    healthcheck.py trainer     every retriever in PVPO_RETRIEVER_URL answers GET /health: a trainer
                               that cannot reach its retriever cannot roll out

Standard library only: the images carry no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def health_urls(role: str) -> list[str]:
    """The /health URLs the given role's container depends on."""
    if role == "retriever":
        return [f"http://127.0.0.1:{os.environ.get('PVPO_SERVE_PORT', '8000')}/health"]
    if role == "trainer":
        urls = [u.strip().rstrip("/") for u in os.environ.get("PVPO_RETRIEVER_URL", "").split(",") if u.strip()]
        return [f"{u}/health" for u in urls]
    raise SystemExit(f"unknown role {role!r}: retriever or trainer")


def main(role: str) -> int:
    for url in health_urls(role):
        try:
            with urllib.request.urlopen(url, timeout=4) as reply:  # noqa: S310 - a local service URL
                if reply.status != 200:
                    print(f"{url}: HTTP {reply.status}")
                    return 1
        except OSError as e:
            print(f"{url}: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "retriever"))
