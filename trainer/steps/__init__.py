"""The step as a strategy: how a run's steps get their trajectories. `synchronous.py` rolls a
step's episodes out, then trains on them; `pipelined.py` samples them beside the update
(`rollout.max_staleness > 0`). Both build on one step plan and seed derivation (`plan.py`) and
answer the trainer through one interface (`plan.StepMode`); the trainer never asks which mode runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pvpo.trainer.steps.pipelined import PipelinedSteps
from pvpo.trainer.steps.plan import StepHost, StepMode, StepPlan, derive_seed, plan_step
from pvpo.trainer.steps.synchronous import SynchronousSteps

__all__ = [
    "PipelinedSteps",
    "StepHost",
    "StepMode",
    "StepPlan",
    "SynchronousSteps",
    "derive_seed",
    "make_steps",
    "plan_step",
    "resumed_record",
]


def make_steps(host: StepHost, resumed: Mapping[str, Any] | None = None) -> StepMode:
    """The run's step mode: rollouts beside the update when `rollout.max_staleness > 0` (with the
    decoupled objective), else the synchronous loop; `resumed`: the checkpoint's record of the
    mode (`resumed_record`)."""
    if host.cfg.rollout.max_staleness:
        return PipelinedSteps(host, resumed)
    return SynchronousSteps(host)


def resumed_record(extra: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint's extra state recorded of its step mode (`StepMode.state_dict`)."""
    return dict(extra.get("pipeline", {}))
