"""One step's plan and the run's seed derivation, shared by both step modes (`synchronous.py`,
`pipelined.py`): the step's prompts (consecutive slices of a per-epoch permutation of Group
Sampling's pool), this rank's share of them, the examples to roll out (`rollout.n` each) with the
GT rows that replace some of them, and each episode's seed and index. A pipelined episode gets
the seed and index the synchronous loop gives it, so at `rollout.max_staleness: 0` the two modes
train on the same trajectories, figure for figure."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.progress import Progress
from pvpo.retriever.types import Searcher
from pvpo.trainer.algorithms.estimator_state import EstimatorState
from pvpo.trainer.algorithms.spec import EstimatorSpec
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.data import Data, step_examples
from pvpo.trainer.model.device import PhaseMemory
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.reference.machinery import Reference
from pvpo.trainer.rollout.agent_loop import LoopConfig
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.cost import CostCounter


def derive_seed(*parts: int | str) -> int:
    """The seed named by `parts` (the run's seed first, then what it seeds: `"step", 3`, ...):
    everything random in a run is a pure function of `(run.seed, step)`, so a resumed run samples
    what an unbroken one does."""
    return zlib.crc32("/".join(map(str, parts)).encode())


class StepPool(Protocol):
    """What a plan reads of the run's reference machinery (`reference.machinery.Reference`)."""

    def pool(self, train: list[QAExample]) -> list[QAExample]: ...

    def group(self, prompts: Sequence[QAExample], n: int) -> tuple[list[QAExample], list[Trajectory]]: ...


@dataclass(frozen=True)
class StepPlan:
    """What step `step` rolls out on this rank: `prompts` (its share of the step's prompts),
    `group` (the examples, `rollout.n` per prompt), `injected` (Group Sampling's GT rows), the
    position `offset` of `group[0]` in the step's whole list and the step's rollout `seed`."""

    step: int
    prompts: list[QAExample]
    group: list[QAExample]
    injected: list[Trajectory]
    offset: int
    seed: int


def plan_step(
    reference: StepPool, train: list[QAExample], step: int, *, prompts_per_step: int, n: int, run_seed: int
) -> StepPlan:
    """The plan of `step` (1-based): its prompts drawn from the pool now, whole groups per rank
    (`parallel/distributed.py`)."""
    prompts = step_examples(reference.pool(train), step, prompts_per_step, run_seed)
    prompts = ddp.rank_share(prompts)
    group, injected = reference.group(prompts, n)
    offset = ddp.exclusive_prefix_sum(len(group))
    return StepPlan(step, prompts, group, injected, offset, derive_seed(run_seed, "step", step))


def episode_batches(seed: int, offset: int, n: int, batch_size: int) -> list[tuple[int, int, int, int]]:
    """`(lo, hi, batch seed, first index)` of each batch of `n` episodes at `offset` in their
    step's list: batches aligned on the whole list (`ddp.aligned_batches`), so each episode's seed
    and index are the ones a single process rolling out the whole list gives it."""
    return [
        (lo, hi, derive_seed(seed, start), offset + lo - start)
        for lo, hi, start in ddp.aligned_batches(offset, n, batch_size)
    ]


class StepHost(Protocol):
    """What a step mode uses of the trainer that runs it (`loop.Trainer`): the run's config,
    estimator, engine and episode rules, its reference machinery and cost counter, its rollouts
    and its update (`learn`, steps 3-5 of a step)."""

    cfg: TrainConfig
    run_dir: Path
    data: Data
    searcher: Searcher
    spec: EstimatorSpec
    engine: RolloutEngine
    tokenizer: Any
    model: torch.nn.Module
    epcfg: EpisodeConfig
    loop: LoopConfig
    reference: Reference
    cost: CostCounter
    memory: PhaseMemory
    estimator_state: EstimatorState

    def ensure_reference(self, step: int) -> None: ...

    def rollout(
        self,
        examples: Sequence[QAExample],
        *,
        seed: int,
        engine: RolloutEngine | None = None,
        temperature: float | None = None,
        kind: str = "train",
        offset: int = 0,
        progress: Progress | None = None,
    ) -> list[Trajectory]: ...

    def meter(self, step: int, what: str, unit: str, total: int | None = None) -> Progress: ...

    def learn(
        self,
        step: int,
        trajs: list[Trajectory],
        injected: list[Trajectory],
        prompts: Sequence[QAExample],
        anchors: dict[str, float] | None,
        t0: float,
        t1: float,
    ) -> dict[str, float]: ...


class StepMode(Protocol):
    """How a run's steps get their trajectories (`synchronous.SynchronousSteps`: rolled out, then
    trained on; `pipelined.PipelinedSteps`: sampled beside the update) and what the update does
    with the engine meanwhile. The trainer asks the mode, never which mode it is."""

    def step(self, step: int) -> dict[str, float]:
        """Step `step`'s metrics: its trajectories, then `StepHost.learn` on them."""
        ...

    def update_scope(self) -> AbstractContextManager[None]:
        """Around the policy update: the engine asleep (synchronous) or left sampling."""
        ...

    def synced_engine(self) -> RolloutEngine | None:
        """The engine that takes each optimizer step's weights, or None (the mode publishes them)."""
        ...

    def after_update(self, step: int) -> None:
        """Once the update of `step` is done (the pipelined mode publishes the new policy)."""
        ...

    def idle_seconds(self) -> float | None:
        """Seconds of the current step with no episode in flight (None: the step's update time)."""
        ...

    def paused(self) -> AbstractContextManager[None]:
        """The engine free for the trainer's own use (an evaluation, an anchor refresh)."""
        ...

    def postfix(self, metrics: Mapping[str, float]) -> dict[str, str]:
        """The mode's figures on the progress line."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records of the mode (merged into the checkpoint's extra state)."""
        ...

    def close(self) -> None:
        """Stop what the mode runs beside the trainer."""
        ...
