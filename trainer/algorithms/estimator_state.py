"""What an estimator keeps across steps and needs beyond rewards, uids and anchors.

The trainer makes one `EstimatorState` per run from the estimator's spec and calls the same five
methods every step whatever the estimator; the base class does nothing, so GRPO, Dr.GRPO, RLOO
and PVPO keep none. GDPO builds its per-component reward matrix (`gdpo.py`), V0.5 its priors and
adaptive rollout budget (`prior_fusion.py`), PPO its critic (`gae.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pvpo.trainer.algorithms.data_parallel import SINGLE, DataParallel
from pvpo.trainer.algorithms.value_model import Embed
from pvpo.trainer.rollout.trajectory import Batch, Trajectory

Rollout = Callable[[list[Any], int], list[Trajectory]]


@dataclass
class EstimatorContext:
    """What a state may need from the run: the `algorithm` config section, the group size
    (`rollout.n`), the policy model (a critic copies its trunk), the device, the path of the
    state's own file in the run dir (read by every rank, written by the main one), a
    prompt-embedding factory (V0.5's value model), and the data-parallel operations of a torchrun
    run (`data_parallel.py`; a single process's by default)."""

    algorithm: Any
    rollout_n: int
    model: torch.nn.Module | None = None
    device: torch.device | str = "cpu"
    value_model_path: Path | None = None
    embed: Callable[[str | None], Embed] | None = None
    parallel: DataParallel = SINGLE


class EstimatorState:
    """The no-op state; estimators with state subclass it."""

    def trains_policy(self, step: int) -> bool:
        """Whether step `step` (1-based) updates the policy (PPO's critic warm-up does not)."""
        return True

    def extra_rollouts(
        self,
        examples: Sequence[Any],
        trajs: Sequence[Trajectory],
        rollout: Rollout,
        anchors: Mapping[str, float] | None,
    ) -> list[Trajectory]:
        """More trajectories for the step's prompts `examples` given their first `trajs`;
        `rollout(examples, round)` samples one trajectory each through the trainer (counted)."""
        return []

    def kwargs(self, trajs: Sequence[Trajectory], batch: Batch) -> dict[str, Any]:
        """Keyword arguments of this step's estimator call beyond rewards, uids and anchors."""
        return {}

    def after_step(self, batch: Batch, kwargs: Mapping[str, Any], *, seed: int = 0) -> dict[str, float]:
        """What the estimator learns from the step (critic steps, value-model entries), and its
        logged figures."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What the trainer's checkpoint keeps (plain tensors and values, the same on every rank)."""
        return {}

    def sharded_modules(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """Name -> (module sharded over the ranks, its optimizer): what a torchrun run's checkpoint
        saves beside the policy through DCP and restores on resume (PPO's critic). In one process
        there are none: the state's `state_dict` holds its modules."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (the checkpoint's `extra`, which may hold others' keys)."""
        return None
