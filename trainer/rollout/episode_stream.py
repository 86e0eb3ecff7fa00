"""Episodes sampled beside the update: one rollout thread runs an event loop that starts the
planned episodes as AReaL's admission rule allows and buffers them as they finish, while the
trainer's thread updates the policy (`rollout.max_staleness > 0`, `trainer/steps/pipelined.py`).

The trainer plans each step's episodes (`plan`: the examples, their seeds and places, exactly as
the synchronous loop would roll them out) and says when a new policy version exists (`publish`).
An episode starts when the rule of Fu et al. 2025 (AReaL, arXiv:2505.24298) allows it:

    accepted + running <= (eta + version + 1) x batch

where `accepted` counts the episodes that finished, `running` those in flight, `version` the
optimizer steps the policy has taken and `batch` a step's episodes (`Admission`; a step's own
count where steps differ). At eta = 0 the episodes of step k start only once the policy of step
k - 1 exists: the synchronous loop. At most `concurrency` episodes are in flight at once, each its
own task in the one episode driver (`agent_loop.run_episode`); the weights reach them through
`weight_gate.WeightGate`, between two turns.

The trainer takes its batch with `take` (what to take is its choice: `steps/pipelined.py`), which
ends in `TimeoutError` past its timeout, or at once when every planned episode has finished and
the choice still waits (nothing more can come); `close` discards what is in flight or unclaimed and says how many (a resume regenerates them).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.hardware import carry_torch_threads
from pvpo.retriever.types import Searcher
from pvpo.trainer.rollout.agent_loop import LoopConfig, TokenTurns, run_episode
from pvpo.trainer.rollout.engine import RolloutEngine, stop_token_ids
from pvpo.trainer.rollout.tick_batching import SearchBatcher
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.rollout.weight_gate import WeightGate


@dataclass(frozen=True)
class Planned:
    """One episode of a step's plan: the step, its place in the step's rollout list, the example,
    and the seed and index its turns sample with (`agent_loop.turn_seed`)."""

    step: int
    position: int
    example: QAExample
    seed: int
    index: int


@dataclass
class Finished:
    """A finished episode, in the order episodes finished."""

    planned: Planned
    trajectory: Trajectory
    started_version: int = 0


class Admission:
    """AReaL's admission rule over the planned steps' episode counts: the episodes of steps up to
    `version + 1 + eta` may have started (`capacity`), i.e. accepted + running <= (eta + version
    + 1) x batch when every step plans `batch` episodes."""

    def __init__(self, eta: int) -> None:
        if eta < 0:
            raise ValueError(f"max_staleness must be >= 0, got {eta}")
        self.eta = eta
        self.sizes: dict[int, int] = {}

    def plan(self, step: int, size: int) -> None:
        self.sizes[step] = size

    def capacity(self, version: int) -> int:
        """Episodes that may have started (finished or running) at policy `version`."""
        return sum(n for s, n in self.sizes.items() if s <= version + 1 + self.eta)

    def allows(self, accepted: int, running: int, version: int) -> bool:
        """Whether one more episode may start."""
        return accepted + running + 1 <= self.capacity(version)


@dataclass
class StreamCounts:
    """What the stream has done so far (read under its lock)."""

    started: int = 0
    finished: int = 0
    taken: int = 0
    outstanding: Counter[int] = field(default_factory=Counter)  # step -> planned episodes not finished


Choose = Callable[[Sequence[Finished], Counter[int]], list[int] | None]


class EpisodeStream:
    """A rollout thread sampling planned episodes with `engine` while the trainer updates."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        searcher: Searcher,
        episode_config: EpisodeConfig,
        loop: LoopConfig,
        *,
        eta: int,
        per_turn: bool,
        concurrency: int,
        version: int = 0,
        on_start: Callable[[int, int, int], None] | None = None,
    ) -> None:
        """`per_turn`: weights change between turns (the engine's `partial_rollouts`), else only
        between episodes; `version`: the policy version the engine holds now; `on_start(accepted,
        running, version)` is called as each episode starts (the rule's inputs, before it counts)."""
        self.engine, self.tokenizer, self.searcher = engine, tokenizer, searcher
        self.episode_config, self.loop_config = episode_config, loop
        self.per_turn, self.concurrency, self.on_start = per_turn, max(1, concurrency), on_start
        self.admission = Admission(eta)
        self.version = version  # the newest policy version published (the rule's)
        self.counts = StreamCounts()
        self.error: BaseException | None = None
        self._queue: deque[Planned] = deque()
        self._buffer: list[Finished] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Condition()
        self._idle_since: float | None = time.perf_counter()
        self._idle_total = 0.0
        self._ready = threading.Event()
        self._threads_here = carry_torch_threads()  # the trainer's torch threads, in the rollout threads
        self._thread = threading.Thread(target=self._serve, args=(version,), name="pvpo-rollouts", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self.error is not None:
            raise self.error

    # ---- the rollout thread ------------------------------------------------------------------
    def _serve(self, version: int) -> None:
        self._threads_here()  # vLLM's steps run in this thread
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        # one engine thread: torch's OpenMP pool is per calling thread (agent_loop.run_episodes_async)
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pvpo-rollout", initializer=self._threads_here
        )
        self._search_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pvpo-search")
        try:
            self.gate = WeightGate(self.loop, self._pool, per_turn=self.per_turn, version=version)
            stop_ids = getattr(self.engine, "stop_ids", None) or stop_token_ids(self.tokenizer)
            self.source = TokenTurns(
                self.gate.session(self.engine.async_session(self._pool)),
                self.tokenizer,
                chat_template=self.loop_config.chat_template,
                stop_ids=stop_ids,
            )
            self.searches = SearchBatcher(self.searcher, self.episode_config.topk, self._search_pool)
            self.reward_fn = self.episode_config.reward_fn()
        except BaseException as e:
            self.error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.source.close()
            for _ in range(3):  # a cancelled episode may leave a weight load scheduled behind it
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._search_pool.shutdown(wait=False, cancel_futures=True)
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.loop.close()

    def _admit(self) -> None:
        """Start the queued episodes the rule and the concurrency bound allow (event loop)."""
        c = self.counts
        while self._queue and self.error is None:
            running = c.started - c.finished
            if running >= self.concurrency or not self.admission.allows(c.finished, running, self.version):
                return
            planned = self._queue.popleft()
            if self.on_start is not None:
                self.on_start(c.finished, running, self.version)
            with self._lock:
                c.started += 1
                if self._idle_since is not None:
                    self._idle_total += time.perf_counter() - self._idle_since
                    self._idle_since = None
            task = self.loop.create_task(self._episode(planned))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _episode(self, planned: Planned) -> None:
        try:
            if self.per_turn:
                version = self.gate.version
                traj = await self._run(planned)
            else:  # the episode holds the weights from its first turn to its last
                async with self.gate.hold() as version:
                    traj = await self._run(planned)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the trainer sees it at its next `take`
            with self._lock:
                self.error = e
                self._lock.notify_all()
            return
        with self._lock:
            self.counts.finished += 1
            self.counts.outstanding[planned.step] -= 1
            if self.counts.started == self.counts.finished:
                self._idle_since = time.perf_counter()
            self._buffer.append(Finished(planned, traj, version))
            self._lock.notify_all()
        self._admit()

    async def _run(self, planned: Planned) -> Trajectory:
        return await run_episode(
            planned.index,
            planned.example,
            self.source,
            self.searches,
            self.episode_config,
            self.reward_fn,
            self.loop_config,
            planned.seed,
        )

    # ---- the trainer's side (its own thread) -------------------------------------------------
    def plan(self, step: int, episodes: Sequence[Planned]) -> None:
        """Queue step `step`'s episodes, in order; they start as the rule allows."""
        episodes = list(episodes)
        with self._lock:
            self.counts.outstanding[step] += len(episodes)

        def post() -> None:
            self.admission.plan(step, len(episodes))
            self._queue.extend(episodes)
            self._admit()

        self.loop.call_soon_threadsafe(post)

    def publish(self, version: int, apply: Callable[[], None]) -> None:
        """Policy `version` exists: its weights load between turns (`apply()`, in the engine's
        thread) and the rule admits the episodes it allows."""
        self.gate.publish(version, apply)

        def post() -> None:
            self.version = version
            self._admit()

        self.loop.call_soon_threadsafe(post)

    def take(self, choose: Choose, timeout: float | None = None) -> list[Finished]:
        """Block until `choose(buffer, outstanding)` names the finished episodes to take (their
        indices in the buffer, which holds them in finishing order; None: wait for more), and
        return those, removed from the buffer. `outstanding`: per step, its planned episodes not
        finished yet. Re-raises an episode's error; raises TimeoutError after `timeout` seconds,
        or as soon as the choice waits with no planned episode left to finish."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self.error is not None:
                    raise self.error
                picked = choose(self._buffer, self.counts.outstanding)
                if picked is not None:
                    chosen = set(picked)
                    out = [self._buffer[i] for i in sorted(chosen)]
                    self._buffer = [f for i, f in enumerate(self._buffer) if i not in chosen]
                    self.counts.taken += len(out)
                    return out
                if not any(n > 0 for n in self.counts.outstanding.values()):
                    raise TimeoutError(
                        f"every planned episode has finished and {len(self._buffer)} untaken ones do not make the batch"
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch within {timeout:g} s")
                self._lock.wait(left)

    def idle_seconds(self) -> float:
        """Seconds so far with no episode in flight."""
        with self._lock:
            since = self._idle_since
            return self._idle_total + (time.perf_counter() - since if since is not None else 0.0)

    def in_flight(self) -> tuple[int, int]:
        """(episodes running or queued, finished episodes not taken)."""
        with self._lock:
            return self.counts.started - self.counts.finished + len(self._queue), len(self._buffer)

    def close(self) -> tuple[int, int]:
        """Cancel the episodes in flight and stop the rollout thread; (episodes discarded while
        running or queued, finished episodes discarded untaken)."""
        discarded = self.in_flight()

        if self._thread.is_alive():  # the thread cancels what runs as its loop stops
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        return discarded
