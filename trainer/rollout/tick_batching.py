"""Client-side micro-batching for the asynchronous agent loop: requests that concurrent
trajectories make in the same event-loop tick meet in one call (one retriever request for all the
searches of the trajectories that finished a turn together; one engine batch for engines without
their own scheduler). The call runs in a worker thread, so the event loop (and every other
trajectory) goes on while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

from pvpo.retriever.types import Passage, Searcher

T = TypeVar("T")
R = TypeVar("R")


class TickBatcher(Generic[T, R]):
    """`await submit(item)` -> `fn([items...])[k]`: the items submitted before the event loop
    next runs its callbacks go to `fn` together, in a thread of `executor` (None: the event
    loop's default executor)."""

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], executor: Executor | None) -> None:
        self.fn, self.executor = fn, executor
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._flushes: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)
        self.calls: list[int] = []  # the size of each call, in order

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        if not self._pending:
            # after the callbacks already queued (the other trajectories woken by the same event)
            loop.call_soon(self._start_flush)
        self._pending.append((item, fut))
        return await fut

    def _start_flush(self) -> None:
        task = asyncio.ensure_future(self._flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        self.calls.append(len(batch))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self.executor, self.fn, [item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call answered {len(results)} of {len(batch)} requests")
        except BaseException as e:  # every waiter sees the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), res in zip(batch, results, strict=True):
            if not fut.done():  # a waiter that timed out has cancelled its future
                fut.set_result(res)


class SearchBatcher:
    """The searches of concurrent trajectories in one `searcher.search` call per tick (duplicates
    asked once); `calls` counts retriever calls."""

    def __init__(self, searcher: Searcher, topk: int, executor: Executor | None) -> None:
        self.searcher, self.topk = searcher, topk
        self._batcher: TickBatcher[str, list[Passage]] = TickBatcher(self._search, executor)

    @property
    def calls(self) -> list[int]:
        return self._batcher.calls

    def _search(self, queries: list[str]) -> list[list[Passage]]:
        unique = list(dict.fromkeys(queries))
        results = self.searcher.search(unique, self.topk)
        if len(results) != len(unique):
            raise RuntimeError(f"retriever answered {len(results)} of {len(unique)} queries")
        found = dict(zip(unique, results, strict=True))
        return [found[q] for q in queries]

    async def search(self, query: str) -> list[Passage]:
        return await self._batcher.submit(query)

    async def search_alone(self, query: str) -> list[Passage]:
        """`query` in a call of its own (after a batched call that did not answer in time)."""
        self.calls.append(1)
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(self._batcher.executor, self._search, [query]))[0]
