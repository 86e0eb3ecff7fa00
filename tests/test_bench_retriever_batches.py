"""bench/retriever.py: our server's mean batch size per measured round, read from its /info
counters (how batches form after a level change is what the 8 -> 32 clients rule turns on);
none for a server without them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx

from pvpo.retriever.testing import build_tiny_index, free_port, start_server, stop_server

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:  # the bench scripts import their siblings by name
    sys.path.append(str(BENCH))

# by its path: the name `retriever` is also the source folder of pvpo.retriever at the repository root
_spec = importlib.util.spec_from_file_location("bench_retriever", BENCH / "retriever.py")
assert _spec is not None and _spec.loader is not None
retriever_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(retriever_bench)


def test_mean_batch_of_a_round_comes_from_the_servers_counters(tmp_path: Path) -> None:
    proc, (url,) = start_server(build_tiny_index(tmp_path), log=tmp_path / "server.log")
    try:
        before = retriever_bench.batch_counters(url)
        assert before is not None
        for q in ("who wrote the book", "capital of france", "when was it built"):
            httpx.post(url + "/retrieve", json={"queries": [q, q + " again"], "topk": 2}, timeout=60).raise_for_status()
        after = retriever_bench.batch_counters(url)
        assert after is not None and after[1] - before[1] == 6
        mean = retriever_bench.mean_batch(before, after)
        assert mean is not None and 1.0 <= mean <= 6.0
    finally:
        stop_server(proc)


def test_a_server_without_counters_has_no_mean_batch() -> None:
    assert retriever_bench.batch_counters(f"http://127.0.0.1:{free_port()}") is None
    assert retriever_bench.mean_batch(None, (3, 9)) is None
    assert retriever_bench.mean_batch((3, 9), (3, 9)) is None  # no batch in between
    assert retriever_bench.mean_batch((3, 9), (5, 17)) == 4.0
