"""bench/retriever/retriever.py: our server's mean batch size per measured round, read from its /info
counters (how batches form after a level change is what the 8 -> 32 clients rule turns on);
none for a server without them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx

from pvpo.retriever.testing import build_tiny_index, free_port, start_server, stop_server

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

# by its path: the name `retriever` is also the source folder of pvpo.retriever at the repository root
_spec = importlib.util.spec_from_file_location("bench_retriever", BENCH / "retriever" / "retriever.py")
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


def _round(beside: float) -> dict[str, float]:
    return {"qps": 100.0, "beside_cores": beside}


def test_a_level_with_other_processes_beside_it_is_named_not_quiet() -> None:
    """A round during which something else kept cores busy (a unit-test run beside the bench read
    +0.37 to +0.99 cores) names its level and server; quiet rounds (-0.45 to +0.20) do not."""
    levels = [
        {"clients": 1, "rounds": {"ours": [_round(0.57), _round(0.37)], "search_r1": [_round(0.99), _round(0.85)]}},
        {"clients": 8, "rounds": {"ours": [_round(-0.13), _round(0.2)], "search_r1": [_round(-0.45), _round(0.01)]}},
        {"clients": 32, "rounds": {"ours": [_round(0.01), _round(0.31)], "search_r1": [_round(0.0), _round(0.0)]}},
    ]
    assert retriever_bench.not_quiet(levels) == [
        "1 client, ours (0.57 cores)",
        "1 client, Search-R1 (0.99 cores)",
        "32 clients, ours (0.31 cores)",
    ]
    assert retriever_bench.not_quiet(levels[1:2]) == []
    measured = {"p50": 1, "p99": 2, "errors": 0, "server_cores": 1, "gen_cores": 0, "machine_cores": 1, "stolen": 0}
    assert retriever_bench.summarise([_round(0.1) | measured, _round(0.4) | measured])["beside_cores"] == 0.4


def test_cores_beside_takes_the_stolen_the_servers_and_the_generators_cores_from_the_machines() -> None:
    from bench.retriever.http_load import cores_beside

    # run 2's 1-client level (2026-12-03): a unit-test run beside ours
    run = {"machine_cores": 1.9983, "stolen": 0.0255, "server_cores": 1.4653, "gen_cores": 0.0088}
    assert abs(cores_beside(run, 2) - 0.4732) < 1e-3
    # run 1's 8-client level: 39% of the machine stolen, nothing beside
    run = {"machine_cores": 1.77, "stolen": 0.391, "server_cores": 1.08, "gen_cores": 0.01}
    assert cores_beside(run, 2) < 0.3
