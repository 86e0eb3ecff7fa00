"""The synchronous step (`rollout.max_staleness: 0`), read top to bottom: PVPO's reference, the
step's plan, its rollouts (and any the estimator asks for after seeing them, e.g. V0.5's adaptive
budget), then the update (`StepHost.learn`) with the engine asleep, each optimizer step's weights
pushed to it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.policy_engine import engine_asleep
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.steps.plan import StepHost, derive_seed, plan_step


class SynchronousSteps:
    """A trainer's steps with rollouts, then the update (a `plan.StepMode`)."""

    def __init__(self, host: StepHost) -> None:
        self.host = host

    def step(self, step: int) -> dict[str, float]:
        h, cfg, seed = self.host, self.host.cfg, self.host.cfg.run.seed
        # 1. PVPO's reference: the anchor, and Group Sampling's pool and GT trajectories
        h.ensure_reference(step - 1)
        plan = plan_step(
            h.reference, h.data.train, step, prompts_per_step=cfg.data.prompts_per_step, n=cfg.rollout.n, run_seed=seed
        )
        # 2. rollouts (the estimator may ask for more, e.g. V0.5's adaptive budget), rewards by the env
        t0 = time.perf_counter()
        h.engine.wake_up()
        with h.memory.phase("rollout"), h.meter(step, "rollouts", "rollout", len(plan.group)) as meter:
            trajs = h.rollout(plan.group, seed=plan.seed, offset=plan.offset, progress=meter)
            anchors = h.reference.anchors()
            trajs += h.estimator_state.extra_rollouts(
                plan.prompts,
                trajs,
                # one seed for all ranks (the trailing 0 keeps one process's), offset by the ranks before
                lambda exs, rnd: h.rollout(
                    exs, seed=derive_seed(seed, "v05", step, rnd, 0), offset=ddp.exclusive_prefix_sum(len(exs))
                ),
                anchors,
            )
            trajs += plan.injected
        return h.learn(step, trajs, plan.injected, plan.prompts, anchors, t0, time.perf_counter())

    def update_scope(self) -> AbstractContextManager[None]:
        return engine_asleep(self.host.engine)

    def synced_engine(self) -> RolloutEngine | None:
        return self.host.engine

    def after_update(self, step: int) -> None:
        return None

    def idle_seconds(self) -> float | None:
        return None

    def paused(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def postfix(self, metrics: Mapping[str, float]) -> dict[str, str]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None
