"""New weights for an engine whose episodes keep running: each turn (or episode) holds the gate
while it samples, and a sync waits until none holds it, so no turn is sampled by two policies.

`rollout.max_staleness > 0` runs the rollouts beside the update (`trainer/steps/pipelined.py`). After
each update the trainer publishes the new weights (`publish`); the gate lets the turns in flight
finish with the weights that started them, holds back the turns submitted meanwhile, loads the
new weights in the engine's thread, drops what the session computed with the old ones (saved KV
prefixes) and lets the held turns go on. An episode in flight thus continues on the new weights
from its next turn (partial rollouts, AReaL's interruptible generation at turn boundaries), and
each turn records the version that sampled it (`Completion.version`). The drain costs at most one
turn's decoding (`rollout.max_new_tokens` steps) of the turns in flight.

Engines whose spec says they cannot take weights while episodes are in flight
(`EngineSpec.partial_rollouts` False) hold the gate for a whole episode instead: a sync waits until
no episode runs (one step off, as verl's one-step-off pipeline).

The gate also pauses the rollouts while the trainer uses the engine itself (an evaluation, an
anchor refresh): `pause` waits for the holders to finish, `resume` lets them go on.

Threads: `publish`, `pause`, `resume` and `wait_applied` are called from the trainer's thread;
everything else runs in the rollout thread's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor

from pvpo.trainer.rollout.engine import AsyncGenerate, Completion, SamplingConfig


class WeightGate:
    """Holders (turns, or episodes), pending weights and pauses of one rollout event loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, executor: Executor, *, per_turn: bool, version: int = 0
    ) -> None:
        """`executor`: the engine's thread, where new weights are loaded; `per_turn`: turns hold
        the gate (partial rollouts), else episodes do (one step off); `version`: the version of the
        weights the engine holds now."""
        self.loop, self.executor, self.per_turn = loop, executor, per_turn
        self.version = version
        self.holders = 0
        self._open = asyncio.Event()  # set while nothing waits for the holders to drain
        self._open.set()
        self._pending: tuple[int, Callable[[], None]] | None = None
        self._paused = False
        self._drained = threading.Event()  # set once a pause found no holder
        self._applied = threading.Event()  # set once the last published weights are loaded
        self._applied.set()
        self._resets: list[Callable[[], None]] = []
        self.error: BaseException | None = None

    # ---- holding (rollout thread) ------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[int]:
        """Hold the gate while sampling; yields the version of the weights that will sample."""
        while not self._open.is_set():
            await self._open.wait()
        self.holders += 1
        try:
            yield self.version
        finally:
            self.holders -= 1
            self._drain()

    def session(self, inner: AsyncGenerate) -> AsyncGenerate:
        """`inner` whose turns hold the gate (when `per_turn`) and carry the version that sampled
        them; its `reset` runs after each sync."""
        self._resets.append(inner.reset)

        async def generate(prompt: Sequence[int], sampling: SamplingConfig) -> Completion:
            if not self.per_turn:  # the episode holds the gate: the weights cannot change meanwhile
                return dataclasses.replace(await inner.generate(prompt, sampling), version=self.version)
            async with self.hold() as version:
                return dataclasses.replace(await inner.generate(prompt, sampling), version=version)

        return AsyncGenerate(generate, inner.close, inner.reset)

    def _drain(self) -> None:
        """With no holder left: load pending weights, or report a pause as drained."""
        if self.holders:
            return
        if self._pending is not None:
            version, apply = self._pending
            self._pending = None
            asyncio.ensure_future(self._apply(version, apply))
        elif self._paused:
            self._drained.set()

    async def _apply(self, version: int, apply: Callable[[], None]) -> None:
        try:
            await self.loop.run_in_executor(self.executor, apply)
            for reset in self._resets:
                reset()
            self.version = version
        except BaseException as e:  # the trainer sees it at its next wait (wait_applied)
            self.error = e
        finally:
            self._applied.set()
            if self._pending is not None:  # published again while this one loaded
                self._drain()
            elif self._paused:
                self._drained.set()
            else:
                self._open.set()

    def _close_gate(self) -> None:
        self._open.clear()
        self._drain()

    # ---- the trainer's side (its own thread) -------------------------------------------------
    def publish(self, version: int, apply: Callable[[], None]) -> None:
        """Load new weights (`apply()`, in the engine's thread) once the holders drain; turns
        that start meanwhile wait for them and are sampled by `version`."""
        self._applied.clear()

        def post() -> None:
            self._pending = (version, apply)
            self._close_gate()

        self.loop.call_soon_threadsafe(post)

    def wait_applied(self, timeout: float | None = None) -> None:
        """Block until the weights last published are loaded (the trainer may then write the
        module they were read from); re-raise what loading them raised."""
        if not self._applied.wait(timeout):
            raise TimeoutError(f"the rollout engine did not load the new weights within {timeout} s")
        if self.error is not None:
            raise self.error

    def pause(self, timeout: float | None = None) -> None:
        """Hold back new turns and episodes, and block until the ones in flight are done (and any
        published weights loaded): the engine is then free for the caller."""
        self._drained.clear()

        def post() -> None:
            self._paused = True
            self._close_gate()

        self.loop.call_soon_threadsafe(post)
        if not self._drained.wait(timeout):
            raise TimeoutError(f"the rollouts in flight did not finish within {timeout} s")

    def resume(self) -> None:
        """Let the rollouts held back by `pause` go on."""

        def post() -> None:
            self._paused = False
            if self._pending is None:
                self._open.set()

        self.loop.call_soon_threadsafe(post)
