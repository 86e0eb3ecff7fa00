"""The data-parallel operations an estimator's state needs under torchrun, and batch statistics
pooled over the ranks.

Under torchrun each rank holds whole prompt groups (`trainer.parallel.distributed`), so group
statistics are local and exact; what spans the batch (PPO's advantage whitening and its critic's
loss normalisation, GDPO's batch normalisation, V0.5's rounds of extra rollouts, the value model's
entries) needs the other ranks. The trainer hands these operations in (`EstimatorContext.parallel`,
built by `trainer.parallel.shared_state.data_parallel`), so this package still imports nothing of
the trainer but trajectories; the defaults are those of a single process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


def _gather_one(obj: Any) -> list[Any]:
    return [obj]


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone()


def _same_int(n: int) -> int:
    return int(n)


def _same_module(m: torch.nn.Module) -> torch.nn.Module:
    return m


def _clip(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    ps = [p for p in params if p.grad is not None]
    if not ps:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(ps, max_norm if max_norm is not None else float("inf")))


@dataclass(frozen=True)
class DataParallel:
    """What a state may do across ranks (each a collective: every rank calls it, in the same
    order). `all_gather`: an object from every rank, in rank order; `all_sum`: a tensor summed over
    ranks (a new tensor); `all_max`: the largest int; `any_rank`: whether a flag holds somewhere;
    `shard`: FSDP2 over the ranks, as the policy is; `whole`: a plain module with the whole weights
    of a (sharded) policy; `clip_grad_norm`: the total gradient norm over all ranks' shards,
    clipped when a max is given."""

    world_size: int = 1
    is_main: bool = True
    all_gather: Callable[[Any], list[Any]] = _gather_one
    all_sum: Callable[[torch.Tensor], torch.Tensor] = _copy
    all_max: Callable[[int], int] = _same_int
    any_rank: Callable[[bool], bool] = bool
    shard: Callable[[torch.nn.Module], torch.nn.Module] = _same_module
    whole: Callable[[torch.nn.Module], torch.nn.Module] = _same_module
    clip_grad_norm: Callable[[Iterable[torch.nn.Parameter], float | None], float] = _clip

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


SINGLE = DataParallel()


def pooled_mean_std(values: torch.Tensor, all_sum: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, float, int]:
    """(mean, unbiased std, count) of the 1-D `values` of every rank together, in two passes (the
    mean first, then the squared deviations from it), as `torch.std` computes them in one process;
    std is 0 for fewer than 2 values."""
    v = values.detach().double().reshape(-1)
    s = all_sum(torch.stack([v.sum(), torch.tensor(float(v.numel()), dtype=torch.float64, device=v.device)]))
    n = int(round(float(s[1])))
    mean = float(s[0]) / max(n, 1)
    ss = float(all_sum(((v - mean) ** 2).sum().reshape(1))[0])
    return mean, (math.sqrt(ss / (n - 1)) if n > 1 else 0.0), n
