"""The dynamic batcher's collection policy: a lone client never waits, a burst that trickles in
with short gaps lands in one batch, and max_delay_ms bounds how long a batch keeps collecting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from pvpo.retriever.batching import DynamicBatcher
from pvpo.retriever.types import Passage


class Recorder:
    """A search function that records the size of each batch it gets."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        self.sizes.append(len(queries))
        return [[Passage(id=q, contents=q, score=float(k))] for q, k in zip(queries, topks)]


async def _spaced(batcher: DynamicBatcher, names: list[str], gap_s: float) -> list[list[list[Passage]]]:
    async def one(i: int, q: str) -> list[list[Passage]]:
        await asyncio.sleep(i * gap_s)
        return await batcher.submit([q], 1)

    return await asyncio.gather(*[one(i, q) for i, q in enumerate(names)])


def test_a_lone_client_is_served_without_waiting_for_a_batch_to_fill() -> None:
    rec = Recorder()

    async def run() -> list[float]:
        b = DynamicBatcher(rec, max_wait_ms=2000, max_delay_ms=5000)
        await b.start()
        took = []
        for q in ("a", "b", "c"):
            t0 = time.perf_counter()
            [[p]] = await b.submit([q], 1)
            assert p.id == q
            took.append(time.perf_counter() - t0)
        await b.stop()
        return took

    took = asyncio.run(run())
    assert rec.sizes == [1, 1, 1]
    assert max(took) < 1.0  # far below the 2 s max_wait a fixed window would have cost


def test_a_burst_arriving_with_short_gaps_is_one_batch_even_past_max_wait() -> None:
    rec = Recorder()

    async def run() -> list[list[list[Passage]]]:
        b = DynamicBatcher(rec, max_wait_ms=150, max_delay_ms=5000)
        await b.start()
        await asyncio.gather(*[b.submit([f"warm{i}"], 1) for i in range(4)])  # the previous batch held 4
        # 4 requests 60 ms apart: 180 ms from first to last, more than max_wait, each gap less.
        out = await _spaced(b, ["w", "x", "y", "z"], 0.06)
        await b.stop()
        return out

    out = asyncio.run(run())
    assert rec.sizes == [4, 4]
    assert [r[0][0].id for r in out] == ["w", "x", "y", "z"]


def test_max_delay_bounds_how_long_a_batch_keeps_collecting() -> None:
    rec = Recorder()

    async def run() -> None:
        b = DynamicBatcher(rec, max_wait_ms=150, max_delay_ms=100)
        await b.start()
        await asyncio.gather(*[b.submit([f"warm{i}"], 1) for i in range(8)])
        await _spaced(b, [f"q{i}" for i in range(4)], 0.06)  # arrivals at 0, 60, 120, 180 ms
        await b.stop()

    asyncio.run(run())
    assert rec.sizes[0] == 8 and sum(rec.sizes[1:]) == 4
    assert len(rec.sizes) >= 3  # the batch closed at 100 ms instead of waiting for all 4


def test_without_coalescing_each_request_is_its_own_batch() -> None:
    rec = Recorder()

    async def run() -> None:
        b = DynamicBatcher(rec, coalesce=False)
        await b.start()
        await asyncio.gather(*[b.submit([f"q{i}"], 1) for i in range(6)])
        await b.stop()

    asyncio.run(run())
    assert rec.sizes == [1] * 6


def test_server_torch_threads_default_leaves_one_core_to_the_event_loop() -> None:
    import os

    import torch

    from pvpo.retriever.server import set_torch_threads

    before = torch.get_num_threads()
    try:
        assert set_torch_threads(None) == max(1, (os.cpu_count() or 2) - 1) == torch.get_num_threads()
        assert set_torch_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -3])
def test_batch_size_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(Recorder(), max_batch_size=bad)


class BatchLog:
    """A search function that records each batch's queries and takes `per_batch_s`."""

    def __init__(self, per_batch_s: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.per_batch_s = per_batch_s

    def __call__(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        self.batches.append(list(queries))
        time.sleep(self.per_batch_s)
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]


def test_a_large_request_is_cut_into_batches_and_a_later_small_one_goes_first() -> None:
    log = BatchLog(per_batch_s=0.02)

    async def run() -> tuple[list, list]:
        b = DynamicBatcher(log, max_batch_size=16, max_wait_ms=1, max_delay_ms=2)
        await b.start()
        big = asyncio.ensure_future(b.submit([f"big{i}" for i in range(100)], 1))
        await asyncio.sleep(0.03)  # the large request is under way
        small = await b.submit(["small"], 1)
        out = await big
        await b.stop()
        return out, small

    big, small = asyncio.run(run())
    assert [r[0].id for r in big] == [f"big{i}" for i in range(100)] and small[0][0].id == "small"
    assert max(len(x) for x in log.batches) <= 16
    at = next(i for i, x in enumerate(log.batches) if "small" in x)
    assert at <= 3 < len(log.batches) - 1  # served within a batch or two of arriving, long before the big one ends


def test_short_and_long_queries_do_not_share_a_padded_batch() -> None:
    from pvpo.retriever.batching import QUERY_CHAR_CAP, QUERY_OVERHEAD_CHARS

    log = BatchLog()
    longs = [f"{i}" + "x" * 3000 for i in range(12)]

    async def run() -> None:
        b = DynamicBatcher(log, max_batch_size=64, max_batch_chars=8192, max_wait_ms=50, max_delay_ms=100)
        await b.start()
        await asyncio.gather(b.submit([f"s{i}" for i in range(20)], 1), b.submit(longs, 1))
        await b.stop()

    asyncio.run(run())
    kinds = [{len(q) > 100 for q in x} for x in log.batches]
    assert all(len(k) == 1 for k in kinds), [len(x) for x in log.batches]  # never mixed
    per_long_batch = 8192 // (QUERY_CHAR_CAP + QUERY_OVERHEAD_CHARS)  # alone once the short ones are done
    assert [len(x) for x in log.batches if len(x[0]) > 100] == [per_long_batch, per_long_batch, 12 - 2 * per_long_batch]


def test_while_others_wait_a_request_larger_than_a_batch_goes_in_half_size_batches() -> None:
    from pvpo.retriever.batching import QUERY_CHAR_CAP, QUERY_OVERHEAD_CHARS

    log = BatchLog(per_batch_s=0.01)

    async def run() -> None:
        b = DynamicBatcher(log, max_batch_size=64, max_batch_chars=8192, max_wait_ms=1, max_delay_ms=2)
        await b.start()
        big = asyncio.ensure_future(b.submit([f"{i}" + "x" * 3000 for i in range(12)], 1))
        stop = False

        async def small_client(c: int) -> None:
            i = 0
            while not stop:
                await b.submit([f"s{c}-{i}"], 1)
                i += 1

        clients = [asyncio.ensure_future(small_client(c)) for c in range(4)]
        await asyncio.wait_for(big, timeout=20)
        stop = True
        await asyncio.gather(*clients)
        await b.stop()

    asyncio.run(run())
    long_batches = [len(x) for x in log.batches if len(x[0]) > 100]
    assert long_batches == [4096 // (QUERY_CHAR_CAP + QUERY_OVERHEAD_CHARS)] * 6, long_batches  # 2, not 5


def test_a_large_request_still_advances_under_a_steady_stream_of_small_ones() -> None:
    log = BatchLog(per_batch_s=0.005)

    async def run() -> int:
        b = DynamicBatcher(log, max_batch_size=8, max_wait_ms=1, max_delay_ms=2)
        await b.start()
        big = asyncio.ensure_future(b.submit([f"big{i}" for i in range(24)], 1))
        stop = False

        async def small_client(c: int) -> None:
            i = 0
            while not stop:
                await b.submit([f"s{c}-{i}"], 1)
                i += 1

        clients = [asyncio.ensure_future(small_client(c)) for c in range(16)]  # always more than a batch waiting
        await asyncio.wait_for(big, timeout=20)
        stop = True
        await asyncio.gather(*clients)
        await b.stop()
        return len(log.batches)

    batches = asyncio.run(run())
    big_batches = [x for x in log.batches if any(q.startswith("big") for q in x)]
    assert len(big_batches) == 3  # 24 queries in batches of 8
    assert batches < 3 * 3 + 8  # at least every third batch served the large request


def test_padded_size_counts_the_encoders_length_sorted_groups() -> None:
    from pvpo.retriever.batching import padded_size

    costs = [256] + [72] * 31  # one 224-character question among 31 of 40 characters
    assert padded_size(costs, None) == 32 * 256  # one padded tensor: the first model
    assert padded_size(costs, 16) == 16 * 256 + 16 * 72  # the long one pads its own group only
    assert padded_size([10, 30, 20], 2) == 2 * 30 + 10 and padded_size([], 16) == 0


def test_one_long_query_no_longer_cuts_a_batch_of_short_ones_to_one_group() -> None:
    log = BatchLog()

    async def run() -> int:
        b = DynamicBatcher(log, max_batch_size=64, max_batch_chars=8192, max_wait_ms=50, max_delay_ms=200, pad_group=16)
        await b.start()
        await asyncio.gather(*[b.submit(["x" * 224 if i == 0 else f"{i:02d}" + "y" * 38], 1) for i in range(32)])
        await b.stop()
        return b.batches

    assert asyncio.run(run()) == 1  # with the whole batch counted as one group (32 x 256 > 8192) it took 2
    assert sorted(len(g) for g in log.batches) == [16, 16]  # searched in the encoder's two groups


def test_groups_are_answered_as_they_finish_shortest_first() -> None:
    finished: dict[str, float] = {}

    def search(queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        time.sleep(0.1)
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]

    async def run() -> float:
        b = DynamicBatcher(
            search, max_batch_size=8, max_batch_chars=10**6, max_wait_ms=50, max_delay_ms=200, pad_group=2
        )

        async def one(q: str) -> None:
            await b.submit([q], 1)
            finished[q] = time.perf_counter()

        await b.start()
        t0 = time.perf_counter()
        await asyncio.gather(*[one(q) for q in ("s1", "s2", "long query 1", "long query 2")])
        await b.stop()
        return t0

    t0 = asyncio.run(run())
    assert max(finished["s1"], finished["s2"]) - t0 < 0.18  # after the first group, not the batch's 0.2 s
    assert min(finished["long query 1"], finished["long query 2"]) - t0 >= 0.2


def test_closed_loop_clients_split_in_two_cohorts_merge_back_into_one_batch() -> None:
    sizes: list[int] = []

    def search(queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        sizes.append(len(queries))
        time.sleep(0.03)
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]

    async def run() -> None:
        b = DynamicBatcher(search, max_batch_size=64, max_wait_ms=10, max_delay_ms=50)
        await b.start()
        stop = False

        async def client(c: int) -> None:
            i = 0
            while not stop:
                await b.submit([f"c{c}-{i}"], 1)
                await asyncio.sleep(0.002)  # the reply's and the next request's trip over HTTP
                i += 1

        first = [asyncio.ensure_future(client(c)) for c in range(16)]
        await asyncio.sleep(0.01)  # the first 16 are in a batch when the next 16 arrive
        second = [asyncio.ensure_future(client(c)) for c in range(16, 32)]
        await asyncio.sleep(1.0)
        stop = True
        await asyncio.gather(*first, *second)
        await b.stop()

    asyncio.run(run())
    # The second cohort waited while the first one's batch ran; from then on one batch holds both
    # (when only the previous batch counted, every batch held 16: the two cohorts took turns).
    assert sizes[0] == 16 and len(sizes) > 10 and set(sizes[1:-1]) == {32}, sizes


def test_a_large_request_gets_a_third_of_the_workers_time_not_every_third_batch() -> None:
    order: list[str] = []

    def search(queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        big = queries[0].startswith("big")
        order.append("B" if big else "s")
        time.sleep(0.04 if big else 0.004)  # a batch of the large request takes 10x a small one
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]

    async def run() -> None:
        b = DynamicBatcher(search, max_batch_size=8, max_wait_ms=1, max_delay_ms=2)
        await b.start()
        big = asyncio.ensure_future(b.submit([f"big{i}" for i in range(24)], 1))
        stop = False

        async def small_client(c: int) -> None:
            i = 0
            while not stop:
                await b.submit([f"s{c}-{i}"], 1)
                i += 1

        clients = [asyncio.ensure_future(small_client(c)) for c in range(16)]
        await asyncio.wait_for(big, timeout=20)
        stop = True
        await asyncio.gather(*clients)
        await b.stop()

    asyncio.run(run())
    runs = [len(r) for r in "".join(order).strip("s").split("B") if r]  # small batches between large ones
    # 2 x 40 ms of small batches (about 20) between large ones, not 2 small batches as per batch count
    assert runs and min(runs) >= 5, order


class BudgetRecorder:
    """A search function that sleeps, and records each call's queries, thread budget and how
    many calls were running at once."""

    def __init__(self, seconds: float) -> None:
        import threading

        self.seconds = seconds
        self.calls: list[tuple[list[str], int | None]] = []
        self.running = self.most_at_once = 0
        self.lock = threading.Lock()

    def __call__(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        from pvpo.retriever.thread_budget import thread_budget

        with self.lock:
            self.calls.append((list(queries), thread_budget()))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]


def test_workers_search_a_batchs_groups_at_once_each_with_its_thread_budget() -> None:
    search = BudgetRecorder(0.2)

    async def run() -> float:
        b = DynamicBatcher(search, max_wait_ms=50, max_delay_ms=100, pad_group=16, workers=2, worker_threads=1)
        await b.start()
        t0 = time.perf_counter()
        await asyncio.gather(*[b.submit([f"q{i}"], 1) for i in range(8)])
        took = time.perf_counter() - t0
        await b.stop()
        return took

    took = asyncio.run(run())
    # two groups a worker (2 queries each), two workers at once: 2 rounds of 0.2 s, not 4
    assert sorted(len(q) for q, _ in search.calls) == [2, 2, 2, 2]
    assert search.most_at_once == 2 and took < 0.7
    assert {budget for _, budget in search.calls} == {1}


def test_a_lone_query_uses_the_solo_budget_and_a_batch_the_workers() -> None:
    search = BudgetRecorder(0.01)

    async def run() -> None:
        b = DynamicBatcher(search, max_wait_ms=50, max_delay_ms=100, workers=2, worker_threads=1, solo_threads=4)
        await b.start()
        await b.submit(["alone"], 1)
        await b.submit(["same", "same"], 1)  # one distinct query: still a lone query
        await asyncio.gather(*[b.submit([f"q{i}"], 1) for i in range(4)])
        await b.stop()

    asyncio.run(run())
    assert search.calls[0] == (["alone"], 4) and search.calls[1] == (["same", "same"], 4)
    assert sorted(q for qs, budget in search.calls[2:] if budget == 1 for q in qs) == ["q0", "q1", "q2", "q3"]


def test_a_failing_group_fails_only_the_requests_not_yet_answered() -> None:
    def search(queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        if "bad" in queries:
            raise RuntimeError("shard down")
        time.sleep(0.05)
        return [[Passage(id=q, contents=q, score=1.0)] for q in queries]

    async def run() -> list[object]:
        b = DynamicBatcher(search, max_wait_ms=50, max_delay_ms=100, pad_group=16, workers=2)
        await b.start()
        out = await asyncio.gather(*[b.submit([q], 1) for q in ("a", "b", "bad", "c")], return_exceptions=True)
        again = await b.submit(["after"], 1)  # the worker pool survives the failure
        await b.stop()
        return [*out, again]

    out = asyncio.run(run())
    assert isinstance(out[2], RuntimeError) and str(out[2]) == "shard down"
    assert [o[0][0].id for o in (out[0], out[1], out[3], out[4])] == ["a", "b", "c", "after"]  # type: ignore[index]
