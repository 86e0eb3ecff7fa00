"""The corpus store at wiki-18 scale: a generated Search-R1-shaped JSON-lines file (`--corpus-lines`
passages of about 100 words), opened by `pvpo.retriever.corpus.CorpusStore` in a fresh process
(for clean RSS): the first open (scans the lines, writes the offsets file), a cached reopen
(offsets memory-mapped), the RSS each adds, and the latency of fetching 512 random ids; the
figures extrapolated to wiki-18's 21M passages.

    .venv/bin/python bench/retriever/corpus_store.py [--corpus-lines 2100000]

`bench/retriever/index_scale.py` runs this as its corpus section. Prints the machine, the command and a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.synthetic_index import WIKI18, run_alone, write_corpus

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, time, sys
import numpy as np
t0 = time.perf_counter()
from pvpo.retriever.corpus import CorpusStore
t_import = time.perf_counter() - t0
def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon:", "RssFile:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out
before = rss()
t0 = time.perf_counter()
store = CorpusStore(sys.argv[1], sys.argv[2])
opened = time.perf_counter() - t0
after = rss()
rng = np.random.default_rng(0)
lat = []
for _ in range(30):
    rows = rng.integers(0, len(store), 512)
    t0 = time.perf_counter()
    store.passages(rows)
    lat.append(time.perf_counter() - t0)
print(json.dumps({"n": len(store), "open_s": opened, "rss_before": before, "rss_after": after,
                  "fetch512_first_ms": lat[0] * 1e3, "fetch512_p50_ms": float(np.median(lat)) * 1e3,
                  "fetch512_p90_ms": float(np.percentile(lat, 90)) * 1e3, "rss_end": rss()}))
"""


def corpus_probe(corpus: Path, offsets: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(corpus), str(offsets)], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def corpus_section(args: argparse.Namespace, *, keep_corpus: bool = False) -> list[str]:
    """The corpus store's table; `keep_corpus`: leave the generated file for the server section."""
    corpus = args.work_dir / "corpus.jsonl"
    offsets = args.work_dir / "corpus.offsets.npy"
    t0 = time.perf_counter()
    write_corpus(corpus, args.corpus_lines, args.seed)
    write_s = time.perf_counter() - t0
    offsets.unlink(missing_ok=True)
    first = corpus_probe(corpus, offsets)
    again = corpus_probe(corpus, offsets)
    size = corpus.stat().st_size
    scale = WIKI18 / args.corpus_lines
    lines = [
        "",
        f"## Corpus store: {args.corpus_lines:,}-line JSON-lines file ({size / 2**30:.2f} GiB, "
        f"{size / args.corpus_lines:.0f} bytes a passage; written in {write_s:.0f} s, so in page cache)",
        "",
        "| open | seconds | RssAnon after open | RssFile after open | 512-id fetch p50 / p90 (first) |",
        "|---|---|---|---|---|",
    ]
    for name, p in (("first (scans lines, writes offsets)", first), ("cached (offsets memory-mapped)", again)):
        lines.append(
            f"| {name} | {p['open_s']:.2f} | {p['rss_after']['RssAnon'] - p['rss_before']['RssAnon']:+.0f} MB | "
            f"{p['rss_after']['RssFile'] - p['rss_before']['RssFile']:+.0f} MB | "
            f"{p['fetch512_p50_ms']:.1f} / {p['fetch512_p90_ms']:.1f} ms ({p['fetch512_first_ms']:.1f}) |"
        )
    lines += [
        "",
        f"21M extrapolation: first open ~ {first['open_s'] * scale:.0f} s once (linear in bytes: the scan "
        f"reads the whole file, {size / args.corpus_lines * WIKI18 / 2**30:.1f} GiB at this passage length); "
        f"offsets file {WIKI18 * 16 / 2**20:.0f} MB; cached open {again['open_s']:.2f} s here and does not grow "
        "with N (np.load with mmap reads the header and the last row); a 512-id fetch touches 512 lines "
        "whatever N (warm page cache here; on a cold cache it costs up to 512 random reads).",
    ]
    print("\n".join(lines), flush=True)
    offsets.unlink(missing_ok=True)
    if not keep_corpus:
        corpus.unlink()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus-lines", type=int, default=2_100_000)
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "pvpo-index-scale")
    ap.add_argument("--seed", type=int, default=0)
    run_alone(corpus_section, ap.parse_args(), ("numpy",))


if __name__ == "__main__":
    main()
