"""bench/retriever/retriever_latency.py: each part of a lone query's search is timed on a real index, in
process and over HTTP from a served process, once per request."""

from __future__ import annotations

import sys
from pathlib import Path

from pvpo.retriever.testing import build_tiny_index

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.retriever import retriever_latency as retriever_latency  # noqa: E402


def test_every_part_of_a_lone_query_is_timed_once_per_request_in_process_and_served(tmp_path: Path) -> None:
    index_dir = build_tiny_index(tmp_path)
    queries = ["who wrote the book", "capital of france", "when was it built"] * 10
    rows = retriever_latency.in_process(index_dir, queries, threads=1)
    rows += retriever_latency.served(index_dir, queries, ["--solo-threads=1"], tmp_path / "server.log")
    names = [name for name, _ in rows]
    assert names[1].startswith("query encoder, batch 1, 1 thread(s)")
    assert names[-2:] == ["GET /health (--solo-threads=1)", "POST /retrieve (--solo-threads=1)"]
    assert all(len(ms) == len(queries) and min(ms) > 0 for _, ms in rows)
    # a served search includes its encoder, so its round trip is slower than a health check's
    med = {name: retriever_latency.summary(ms)[0] for name, ms in rows}
    assert med["POST /retrieve (--solo-threads=1)"] > med["GET /health (--solo-threads=1)"]
    assert retriever_latency.summary([1.0, 2.0, 3.0, 4.0, 10.0]) == (3.0, 10.0)
