"""Where a lone query's time goes in `pvpo retriever serve`: the one-client latency that
`bench/retriever/retriever.py` compares with Search-R1's server, cut into its parts.

In this process, over the musique_mini Flat index that `bench/retriever/retriever.py` builds (the same
folder, built here when missing), one query at a time over the query pool, median and p90 in
milliseconds of: the tokenizer alone; the query encoder at batch 1 (tokenizer included, at
`--threads` threads: the server's solo lane uses every core); the FAISS search of one vector; the
corpus fetch of its top-k passages; the reply's JSON (orjson, as the server). Then the served
round trip from one keep-alive HTTP client (httpx, this process): `GET /health` (HTTP and the
event loop alone) and `POST /retrieve`, once per server flag set (`--variant`, default: the
server's defaults and `--solo-threads=1`), each server in a process of its own. What the round
trip costs beyond encoder + search + fetch + JSON is the server's own share (HTTP, validation, the
batcher's hand-off).

    .venv/bin/python bench/retriever/retriever_latency.py [--requests 400] [--variant=--solo-threads=1 ...]

Prints the machine, the command and two tables. A 2-core machine with nothing else running gives
the figures the retriever page records; the client shares the cores with the server, as wrk does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.http_load import DEFAULT_DATA, body, musique_corpus, questions_and_queries, start_server
from pvpo.machine import machine_line
from pvpo.retriever.thread_budget import cpu_cores

PACKAGES = ("onnxruntime", "faiss-cpu", "torch", "fastapi", "uvicorn", "httpx")
TOPK = 3


def timed_ms(fn: Callable[[Any], Any], items: Sequence[Any], warmup: int = 20) -> list[float]:
    """Milliseconds of `fn(item)` for each item, after `warmup` untimed calls."""
    for item in items[:warmup]:
        fn(item)
    out = []
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(ms: Sequence[float]) -> tuple[float, float]:
    """(median, p90) of `ms`."""
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def in_process(index_dir: Path, queries: Sequence[str], threads: int) -> list[tuple[str, list[float]]]:
    """Each part of one query's search, timed alone in this process."""
    import orjson

    from pvpo.retriever.index import load_retriever
    from pvpo.retriever.thread_budget import set_thread_budget

    retriever: Any = load_retriever(index_dir)
    enc = retriever.encoder
    vectors = {q: enc.encode_queries([q]) for q in queries[:1]}  # loads the runtime before timing
    set_thread_budget(threads)  # as the server's solo lane sets its thread's
    try:
        encode = timed_ms(lambda q: vectors.__setitem__(q, enc.encode_queries([q])), queries)
    finally:
        set_thread_budget(None)
    tokenize = timed_ms(lambda q: enc._tokenizer([q]), queries)  # the tokenizer the encoder calls
    found: dict[str, Any] = {}
    search = timed_ms(lambda q: found.__setitem__(q, retriever.index.search(vectors[q], TOPK)), queries)
    fetch = timed_ms(lambda q: retriever.corpus.passages(found[q][1][0], found[q][0][0]), queries)
    replies = {q: retriever.search([q], TOPK) for q in queries}
    dump = timed_ms(  # the server's reply body (retriever/server.py)
        lambda q: orjson.dumps(
            {"result": [[{"document": {"id": p.id, "contents": p.contents}} for p in r] for r in replies[q]]}
        ),
        queries,
    )
    retriever.close()
    return [
        ("tokenizer", tokenize),
        (f"query encoder, batch 1, {threads} thread(s), tokenizer included", encode),
        ("FAISS search of one vector", search),
        ("corpus fetch of the top-k", fetch),
        ("the reply's JSON", dump),
    ]


def served(index_dir: Path, queries: Sequence[str], flags: Sequence[str], log: Path) -> list[tuple[str, list[float]]]:
    """One keep-alive client's round trips to a server started with `flags`."""
    import httpx

    from pvpo.retriever.testing import stop_server

    proc, url = start_server(index_dir, extra=tuple(flags), log=log)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            health = timed_ms(lambda q: client.get("/health").raise_for_status(), queries)
            retrieve = timed_ms(lambda q: client.post("/retrieve", json=body(q, TOPK)).raise_for_status(), queries)
    finally:
        stop_server(proc)
    name = " ".join(flags) or "defaults"
    return [(f"GET /health ({name})", health), (f"POST /retrieve ({name})", retrieve)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pvpo" / "bench-retriever")
    ap.add_argument("--requests", type=int, default=400, help="queries timed per measurement (the pool cycled)")
    ap.add_argument(
        "--threads",
        type=int,
        default=cpu_cores(),
        help="the encoder's threads in process (default: this process's cores)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="server flags of one served variant, space-separated (repeatable; default: the defaults and "
        "--solo-threads=1)",
    )
    args = ap.parse_args()
    corpus_file = musique_corpus(args.data, "bench/retriever/retriever_latency.py")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.build import build_index

    print(f"machine: {machine_line(PACKAGES)}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    index_dir = build_index(corpus_file, args.work_dir / "musique_mini_Flat", index_type="Flat", show_progress=False)
    _, pool = questions_and_queries(args.data)
    queries = [pool[i % len(pool)] for i in range(args.requests)]
    variants = [v.split() for v in args.variant] if args.variant else [[], ["--solo-threads=1"]]
    rows = in_process(index_dir, queries, args.threads)
    for flags in variants:
        rows += served(index_dir, queries, flags, args.work_dir / "latency-server.log")
    print(f"\n{len(queries)} single-query requests each, one at a time, topk {TOPK}, musique_mini Flat\n")
    print("| part | median ms | p90 ms |")
    print("|---|---|---|")
    for name, ms in rows:
        med, p90 = summary(ms)
        print(f"| {name} | {med:.2f} | {p90:.2f} |")


if __name__ == "__main__":
    main()
