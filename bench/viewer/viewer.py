"""How long `pvpo view` takes for a large evaluation folder: making the page (CPU seconds of
`build_page`) and opening it in headless Chromium (the page's own clock from navigation to its
first render, `data-ready-ms`: HTML parse, the data block's JSON.parse, filters and one page of
rows), for N episodes of the shape of a Search-R1 run (two searches of three 100-word passages each,
a think block, an answer). Prints one markdown table.

    python bench/viewer/viewer.py [--episodes 1000 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from pvpo.reward import SEARCH_R1
from pvpo.viewer.headless import MISSING, find_chromium, headless_command
from pvpo.viewer.page import build_page

WORDS = "the city was founded by a merchant who traded wool along the river before the war began".split()


def response(i: int) -> str:
    """A Search-R1-shaped response: think, two searches with three passages each, an answer."""
    text = ""
    for s in range(2):
        passages = "\n".join(
            f"Doc {k}(Title: Title {i}-{s}-{k}) " + " ".join(WORDS[(i + k + n) % len(WORDS)] for n in range(100))
            for k in (1, 2, 3)
        )
        text += f"<think> step {s}: " + " ".join(WORDS[:30]) + f" </think>\n<search> query {i} {s} </search>"
        text += SEARCH_R1.wrap_observation(passages)
    return text + f"<think> so </think>\n<answer> answer {i % 7} </answer>"


def write_items(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            em = float(i % 7 == 0)
            item = {
                "id": f"test_{i}",
                "question": f"Who founded the city number {i}?",
                "golden_answers": [f"answer {0 if em else 1}"],
                "output": {
                    "final_response": response(i),
                    "pred": f"answer {i % 7}",
                    "metric_score": {"em": em, "f1": em, "acc": em},
                    "num_searches": 2,
                    "format_ok": True,
                    "stop_reason": "answer",
                },
            }
            f.write(json.dumps(item) + "\n")


def open_ms(page: Path, exe: str) -> tuple[int, float]:
    """(the page's ms from navigation to its first render, Chromium's wall seconds end to end)."""
    with tempfile.TemporaryDirectory(prefix="pvpo-bench-") as profile:
        t0 = time.perf_counter()
        out = subprocess.run(
            headless_command(exe, profile, "--dump-dom", page.as_uri()),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
        wall = time.perf_counter() - t0
    m = re.search(r'data-ready-ms="(\d+)"', out)
    assert m is not None, "the page did not render"
    return int(m.group(1)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    exe = find_chromium()
    if exe is None:
        raise SystemExit(MISSING)
    print(
        "| episodes | page size | build_page (CPU s) | first render in Chromium (ms, median) | Chromium end to end (s) |"
    )
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="pvpo-view-bench-") as tmp:
        for n in args.episodes:
            src = Path(tmp) / f"n{n}.jsonl"
            write_items(src, n)
            c0 = time.process_time()
            html = build_page([src])
            cpu = time.process_time() - c0
            page = Path(tmp) / f"n{n}.html"
            page.write_text(html, encoding="utf-8")
            runs = [open_ms(page, exe) for _ in range(args.repeats)]
            ms = statistics.median(r[0] for r in runs)
            wall = statistics.median(r[1] for r in runs)
            print(f"| {n:,} | {len(html.encode()) / 1e6:.1f} MB | {cpu:.2f} | {ms:.0f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
