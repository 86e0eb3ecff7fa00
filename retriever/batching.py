"""Cross-request dynamic batching with bounded batches: requests that arrive while the retriever
is busy (or within a short wait) are coalesced into one encoder batch and one index search, run on
a worker thread so the event loop keeps accepting connections.

A batch holds at most `max_batch_size` queries, and its padded size stays within
`max_batch_chars`, so no batch runs long. A query costs `min(len, QUERY_CHAR_CAP) +
QUERY_OVERHEAD_CHARS`; the padded size is what the encoder computes on: it sorts a batch longest
first and pads each group of `pad_group` queries to the group's longest (sentence-transformers
and our exported runtimes both do; 16 on CPU, one group on GPU), so the padded size is the sum
over groups of queries x the group's widest cost. Padding matters: 16 short queries took 56 ms
and 4 of 2048 characters 475 ms, but the 20 together in one group took 1852 ms (one thread,
loaded machine), so short and long queries do not share a group. Counting the whole batch as
one group instead (the first model, with a 4096 bound) cut every batch holding one 224-character
MuSiQue question to 16 queries, which is what the encoder runs as one group anyway.

A large request is cut into several batches (half-size ones while other requests wait), and each
batch is filled least-served-first: a request not yet started goes before the remainder of one
that has already had batches, except that a third of the worker's time goes to batches taking
the oldest requests first. A small request therefore waits for a few bounded batches, not for a
large request (an unbounded batch of one 1024 x 8 KB request would hold the single worker for
about 107 s while a one-query request waits behind it), and a large request still advances under a steady
stream of small ones. A request whose client went away
(its future cancelled) is dropped before its next batch.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pvpo.retriever.thread_budget import set_thread_budget
from pvpo.retriever.types import Passage

SearchFn = Callable[[Sequence[str], Sequence[int]], list[list[Passage]]]

# MiniLM reads at most 256 tokens (~1.5K characters of English); encoding cost per query stops
# growing there: 1 CPU thread took 11 ms/query at 256 chars, 52-58 ms at 2048 and 61 ms at 8192.
QUERY_CHAR_CAP = 1536
QUERY_OVERHEAD_CHARS = 32  # per-query work besides the tokens: tokenizer call, FAISS row, reply


FIFO_EVERY = 3  # a third of the worker's time serves the oldest requests first, so a large one advances


def query_cost(query: str) -> int:
    """What a query counts against `max_batch_chars`."""
    return min(len(query), QUERY_CHAR_CAP) + QUERY_OVERHEAD_CHARS


def padded_size(costs: Sequence[int], pad_group: int | None) -> int:
    """The padded size of a batch of queries with these costs: sorted longest first, each group
    of `pad_group` queries padded to its first (None: the whole batch is one group)."""
    return _padded_ascending(sorted(costs), pad_group)


def _padded_ascending(ascending: Sequence[int], pad_group: int | None) -> int:
    """`padded_size` of costs already sorted shortest first (the batcher keeps them so)."""
    n = len(ascending)
    group = pad_group or n or 1
    return sum(ascending[n - 1 - i] * min(group, n - i) for i in range(0, n, group))


class Overloaded(RuntimeError):
    """More queries are waiting than the batcher accepts."""


@dataclass(eq=False)
class _Job:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)
    seq: int = 0  # submission order
    taken: int = 0  # queries handed to batches so far
    done: int = 0  # queries answered so far
    results: list[list[Passage]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.results = [[] for _ in self.queries]

    @property
    def left(self) -> int:
        return len(self.queries) - self.taken


@dataclass
class _Slice:
    job: _Job
    start: int
    stop: int


class DynamicBatcher:
    """Coalesces concurrent `submit` calls into bounded batches. A batch keeps collecting while
    requests keep arriving - it closes once none came for `max_wait_ms`, or `max_delay_ms` after
    its first request, or once it is full, or once it holds as many queries as were in flight
    when the previous batch ended: that batch's, whose clients are expected back, and those that
    arrived while it ran, before its first group was answered (a lone client is thus never kept
    waiting). So clients answered together, whose next requests trickle in as the event loop
    parses them, land in one batch instead of a small one and a large one.

    Counting only the previous batch (the first rule) let any short batch split the clients for
    good: at 32 closed-loop clients, a batch cut at 16 by the padded-size bound left 16 waiting,
    each next batch closed as soon as it held the 16 that waited, and every batch after that held
    16 (4.55 ms of encoder CPU a query vs 4.15 at batch 32 and 3.75 at 64, one thread).

    A batch is searched one pad group at a time, shortest first, and each group's requests are
    answered as soon as it is done, so their clients' next requests arrive while the later groups
    encode. With `coalesce=False` each batch serves one request (the baseline the benchmark
    compares), still cut to the batch bounds.

    `workers` threads search a batch's groups at once, each with a budget of `worker_threads` CPU
    threads (`thread_budget`); with several workers a batch is cut into about two groups a worker
    (at most `pad_group` queries each), so each worker answers a group half-way through and those
    clients come back while it computes its second. A batch of one distinct query goes instead to
    a thread of its own with a budget of `solo_threads` (a lone query may use every core)."""

    def __init__(
        self,
        search_fn: SearchFn,
        *,
        max_batch_size: int = 64,
        max_batch_chars: int = 8192,
        max_wait_ms: float = 5.0,
        max_delay_ms: float = 20.0,
        coalesce: bool = True,
        max_pending: int = 16384,
        pad_group: int | None = None,
        workers: int = 1,
        worker_threads: int | None = None,
        solo_threads: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if max_batch_chars < 1:
            raise ValueError("max_batch_chars must be >= 1")
        self.search_fn = search_fn
        self.max_batch_size = max_batch_size
        self.max_batch_chars = max_batch_chars
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self.max_delay = max(self.max_wait, max_delay_ms / 1000.0)
        self.coalesce = coalesce
        self.max_pending = max_pending
        self.pad_group = pad_group
        self.workers = workers
        self.worker_threads = worker_threads
        self.solo_threads = solo_threads
        self._solo: ThreadPoolExecutor | None = None
        self._jobs: list[_Job] = []  # requests with queries not yet handed to a batch, oldest first
        self._pending_queries = 0  # their queries not yet searched
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._expected = 1  # queries in flight when the previous batch ended
        self._submitted = 0  # requests submitted so far
        self._fifo_turn = True  # this batch takes the oldest requests first
        self._batch_limit = max_batch_chars  # this batch's padded-size bound (halved for a large request)
        self._fifo_work = 0.0  # seconds the last oldest-first batch took
        self._since_fifo = 0.0  # seconds the batches since took
        self.batches = 0  # how many searches ran, for /info and tests
        self.queries = 0
        self.dropped = 0  # queries never searched because their client went away

    async def start(self) -> None:
        """Starts the worker on the running event loop."""
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=self.workers,
            thread_name_prefix="retriever-search",
            initializer=set_thread_budget,
            initargs=(self.worker_threads,),
        )
        if self.solo_threads is not None:
            self._solo = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="retriever-solo",
                initializer=set_thread_budget,
                initargs=(self.solo_threads,),
            )
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stops the worker; requests still waiting fail with a RuntimeError."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in self._jobs:
            if not job.future.done():
                job.future.set_exception(RuntimeError("retriever server is shutting down"))
        self._jobs.clear()
        for executor in (self._executor, self._solo):
            if executor is not None:
                executor.shutdown(wait=True)
        self._executor = self._solo = None

    @property
    def pending(self) -> int:
        """Queries accepted and not yet searched."""
        return self._pending_queries

    async def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Top-`topk` passages of each query, computed in batches shared with other requests.
        Cancelling the awaiting task (the client went away) drops the queries not yet searched."""
        if self._task is None or self._wakeup is None:
            raise RuntimeError("batcher is not started")
        if self._pending_queries + len(queries) > self.max_pending:
            raise Overloaded(f"{self._pending_queries} queries are already waiting (limit {self.max_pending})")
        self._submitted += 1
        job = _Job(list(queries), topk, asyncio.get_running_loop().create_future(), seq=self._submitted)
        self._jobs.append(job)
        self._pending_queries += len(queries)
        self._wakeup.set()
        try:
            return await job.future
        finally:
            if job.future.cancelled():
                self._forget(job)

    def _forget(self, job: _Job) -> None:
        """Drop a cancelled job's queries that no batch has taken."""
        if job in self._jobs:
            self._jobs.remove(job)
            self._pending_queries -= job.left
            self.dropped += job.left
            job.taken = len(job.queries)

    def _take(self, batch: list[_Slice], room: int, costs: list[int]) -> int:
        """Moves waiting queries into `batch`, least-served request first, while it has `room`
        queries left and its padded size stays within the batch's bound; `costs` (the batch's
        query costs, shortest first) grows with it. Returns the room left. An empty batch always
        takes at least one query."""
        # Least served first (stable: oldest first among equals), but oldest first for a batch
        # once the batches since the last such turn took (FIFO_EVERY - 1) times as long as it
        # did: under a steady stream of small requests a large one would otherwise never be
        # served (256 small clients: 0 large requests done in 30 s). Counting time, not batches:
        # with batches of 5 long queries (275 ms) every third batch gave the large requests most
        # of the worker and raised the small ones' p99 from 553 to 1543 ms (bench/retriever/load.py);
        # counting padded size missed the per-query cost of repeated small queries. A
        # per-request starvation bonus was tried and rejected: each of two large requests earned
        # its own turn, so long batches took 2 of every 3 and the small requests' p99 rose from
        # 1.4 s to 9 s.
        fifo = self._fifo_turn
        for job in list(self._jobs) if fifo else sorted(self._jobs, key=lambda j: j.taken):
            start = stop = job.taken
            # While other requests wait, one larger than a batch is served in half-size batches
            # (small ones not padded up to its width either): a small request waits behind one
            # no longer than behind a 4096-character batch (a full one of 5 long queries takes
            # 275 ms on one thread and raises the small requests' p99 from 553 to 855 ms under 2
            # large clients; bench/retriever/load.py). Alone (a trainer's batch of
            # rollouts), it gets full batches.
            n = len(job.queries)
            large = start > 0 or n > self.max_batch_size or n * query_cost(job.queries[start]) > self.max_batch_chars
            if large and (len(self._jobs) > 1 or batch):  # others wait, or share this batch
                self._batch_limit = self.max_batch_chars // 2  # for the rest of the batch too
            while stop < len(job.queries) and room > 0:
                cost = query_cost(job.queries[stop])
                at = bisect.bisect(costs, cost)
                costs.insert(at, cost)
                if len(costs) > 1 and _padded_ascending(costs, self.pad_group) > self._batch_limit:
                    del costs[at]
                    break
                stop, room = stop + 1, room - 1
            if stop == start:
                continue  # its next query does not fit; a shorter one further on may
            batch.append(_Slice(job, start, stop))
            job.taken = stop
            if job.left == 0:
                self._jobs.remove(job)
            if not self.coalesce or room == 0 or stop < len(job.queries):
                break
        return room

    async def _collect(self) -> list[_Slice]:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        self._fifo_turn = self._since_fifo >= (FIFO_EVERY - 1) * self._fifo_work
        self._batch_limit = self.max_batch_chars
        batch: list[_Slice] = []
        costs: list[int] = []
        while not batch:
            while not self._jobs:
                self._wakeup.clear()
                await self._wakeup.wait()
            room = self._take(batch, self.max_batch_size, costs)
        if not self.coalesce:
            return batch
        last_deadline = loop.time() + self.max_delay
        while (
            room > 0
            and self.max_batch_size - room < self._expected
            and (remaining := min(self.max_wait, last_deadline - loop.time())) > 0
        ):
            if not self._jobs:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    break  # a gap of max_wait with no arrival: the burst is over
            before = room
            room = self._take(batch, room, costs)
            if room == before and self._jobs:
                break  # what waits does not fit: run this batch now
        return batch

    def _groups(self, batch: list[_Slice]) -> list[list[tuple[_Job, int]]]:
        """The batch's queries as the encoder groups them (longest first, `pad_group` distinct
        queries at a time: the retriever encodes a repeated query once, so its repeats join the
        group of its first), in the order they are searched: the group of shortest queries first.
        Cutting by count instead split the repeats of a query over several searches (256 clients
        sending 12 distinct questions: 1539 -> 1188 req/s, bench/retriever/load.py)."""
        items = [(s.job, i) for s in batch for i in range(s.start, s.stop)]
        items.sort(key=lambda it: (-query_cost(it[0].queries[it[1]]), it[0].queries[it[1]]))
        size = self.pad_group
        if self.workers > 1:  # two groups a worker (see the class docstring)
            n = len({job.queries[i] for job, i in items})
            size = min(size or n, max(1, -(-n // (2 * self.workers))))
        groups: list[list[tuple[_Job, int]]] = []
        distinct: set[str] = set()
        for job, i in items:
            query = job.queries[i]
            if not groups or (query not in distinct and size and len(distinct) >= size):
                groups.append([])
                distinct = set()
            groups[-1].append((job, i))
            distinct.add(query)
        return groups[::-1]

    def _search_groups(
        self,
        loop: asyncio.AbstractEventLoop,
        groups: list[list[tuple[_Job, int]]],
        todo: deque[int],
        delivered: list[int],
        cutoff: list[int],
    ) -> None:
        """On a worker thread: searches the groups whose index it takes from `todo` (shared by
        the batch's workers), each answered as soon as it is done. With the whole batch answered
        at its end, the search thread slept 7-10% of the time at 32-64 clients while the answered
        clients came back (1-6% with groups answered as they finish and the /retrieve fast path;
        thread schedstat)."""
        while True:
            try:
                k = todo.popleft()  # atomic: two workers never take one group
            except IndexError:
                return
            g = groups[k]
            results = self.search_fn([job.queries[i] for job, i in g], [job.topk for job, i in g])
            loop.call_soon_threadsafe(self._deliver, g, results, cutoff)
            delivered.append(k)

    def _deliver(self, group: list[tuple[_Job, int]], results: list[list[Passage]], cutoff: list[int]) -> None:
        """Hands a searched group's results to their requests; a request whose queries are all
        answered completes. The batch's first answer sets its `cutoff`."""
        if not cutoff:
            cutoff.append(self._submitted + 1)
        self.queries += len(group)
        for (job, i), passages in zip(group, results):
            job.results[i] = passages
            job.done += 1
            self._pending_queries -= 1
            if job.done == len(job.queries) and not job.future.done():
                job.future.set_result(job.results)

    def _account(self, took: float) -> None:
        """Adds a batch's time to its turn's account (see `_take`)."""
        if self._fifo_turn:
            self._fifo_work, self._since_fifo = took, 0.0
        else:
            self._since_fifo += took

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            collected = await self._collect()
            batch = []
            for s in collected:
                if s.job.future.done():  # cancelled while the batch collected: its client went away
                    self._pending_queries -= s.stop - s.start
                    self.dropped += s.stop - s.start
                else:
                    batch.append(s)
            if not batch:
                continue
            groups = self._groups(batch)
            todo = deque(range(len(groups)))
            delivered: list[int] = []  # the groups answered
            cutoff: list[int] = []  # the first request submitted after its first group was answered
            self.batches += 1
            started = loop.time()
            lone = self._solo is not None and len({job.queries[i] for g in groups for job, i in g}) == 1
            runs = [
                loop.run_in_executor(executor, self._search_groups, loop, groups, todo, delivered, cutoff)
                for executor in ([self._solo] if lone else [self._executor] * min(self.workers, len(groups)))
            ]
            outcomes = await asyncio.gather(*runs, return_exceptions=True)
            self._account(loop.time() - started)
            error = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if error is not None:  # it goes to every request not yet answered
                answered = set(delivered)
                for k, g in enumerate(groups):
                    if k in answered:
                        continue
                    for job, _ in g:
                        self._pending_queries -= 1
                        self._forget(job)
                        if not job.future.done():
                            job.future.set_exception(error)
                if not isinstance(error, Exception):
                    raise error
                continue
            # The clients in flight: those answered now, expected back, and those that came
            # while this batch ran and before its first group was answered (later ones may be
            # its own clients back already). Counting only the previous batch let a batch cut
            # short split the clients for good (at 32 clients every batch then held 16).
            others = sum(job.left for job in self._jobs if job.seq < (cutoff[0] if cutoff else self._submitted + 1))
            self._expected = sum(len(groups[k]) for k in delivered) + others
