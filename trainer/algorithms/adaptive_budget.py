"""V0.5's adaptive rollout budget (Zhang et al. 2026, arXiv:2603.10848, Sec. 3.3): each prompt
starts with k_init rollouts and gets one more while a one-step look-ahead says it pays,

    J(k) = MSE(k) + c * k,    add a rollout while J(k + 1) < J(k) and k < k_max,

with MSE(k) the fused baseline's MSE (`prior_fusion.mse`) at the current estimates of D^2 and s^2
(paper: k_init 4, k_max 16, c = 1/256). When the rollouts agree with the prior (D^2 = 0) the MSE is
0 and the prompt stops at k_init; when they reject it, w -> 1 and more rollouts pay until
s^2 / (k (k + 1)) < c. s^2 is the floored variance of `prior_fusion.floored_variance`, the same the
estimator uses, so a uniform group is no longer "noise-free".

The cost term is in the paper's units: its rewards are +-1 (range 2), ours live in
`prior_fusion.reward_range` (range R, default [0, 1]), and an MSE scales with R^2, so the price
of one rollout is c (R / 2)^2 (`scaled_cost`): 1/1024 for [0, 1] at the paper's c = 1/256.
The extra rollouts go through the trainer's own rollout function, so the cost counters see every one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pvpo.trainer.algorithms.prior_fusion import NoiseFloor, floored_variance, fuse, mse

PAPER_REWARD_RANGE = 2.0  # arXiv:2603.10848's rewards are +-1


def scaled_cost(cost: float, floor: NoiseFloor | None) -> float:
    """The price of one rollout in our reward units: `cost` (paper units, range 2) x (R / 2)^2."""
    span = floor.span if floor is not None else PAPER_REWARD_RANGE
    return cost * (span / PAPER_REWARD_RANGE) ** 2


def objective(
    rewards: Sequence[float], prior: float | None, k: int, cost: float, floor: NoiseFloor | None = None
) -> float:
    """J(k) = MSE(k) + c k, with D^2 and the floored s^2 estimated from `rewards` (k may exceed
    len(rewards): the look-ahead keeps the current estimates). `cost` is already in reward units."""
    n = len(rewards)
    mean = sum(rewards) / n
    var = floored_variance(mean, statistics.variance(rewards) if n > 1 else 0.0, n, floor)
    d2 = fuse(mean, var, n, prior).d2
    return mse(d2, var, k) + cost * k


def wants_more(
    rewards: Sequence[float], prior: float | None, *, k_max: int, cost: float, floor: NoiseFloor | None = None
) -> bool:
    """Whether one more rollout lowers J (module docstring); never beyond `k_max`."""
    k = len(rewards)
    if k == 0:
        raise ValueError("wants_more needs the prompt's first rollouts")
    return k < k_max and objective(rewards, prior, k + 1, cost, floor) < objective(rewards, prior, k, cost, floor)


def extend_groups(
    examples: Sequence[Any],
    trajs: Sequence[Any],
    prior: Mapping[str, float | None],
    rollout: Callable[[list[Any], int], list[Any]],
    *,
    k_max: int,
    cost: float,
    floor: NoiseFloor | None = None,
    any_rank: Callable[[bool], bool] = bool,
) -> tuple[list[Any], dict[str, float]]:
    """Rounds of one more rollout for every prompt of `examples` (objects with `.uid`) that
    `wants_more`, given its trajectories so far (`.uid`, `.reward`), until none does.
    `rollout(examples, round)` samples one trajectory per example. Returns the new trajectories
    and `v05/*` figures (extra rollouts, rounds, mean and max rollouts per prompt). `cost` is in
    the paper's units, scaled here by `scaled_cost`; `floor` as the estimator's. Under torchrun
    (`any_rank`: whether some rank still wants a round) the ranks go through the rounds together,
    a rank whose prompts are done calling `rollout` with none, so a round's rollouts are sampled
    (and seeded) as one process would sample them."""
    price = scaled_cost(cost, floor)
    rewards: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        rewards[t.uid].append(float(t.reward))
    new: list[Any] = []
    rounds = 0
    while True:
        todo = [
            ex
            for ex in examples
            if rewards[ex.uid] and wants_more(rewards[ex.uid], prior.get(ex.uid), k_max=k_max, cost=price, floor=floor)
        ]
        if not any_rank(bool(todo)):
            break
        rounds += 1
        got = rollout(todo, rounds)
        for t in got:
            rewards[t.uid].append(float(t.reward))
        new += got
    ks = [len(rewards[ex.uid]) for ex in examples]
    return new, {
        "v05/extra_rollouts": float(len(new)),
        "v05/rounds": float(rounds),
        "v05/k_mean": sum(ks) / max(1, len(ks)),
        "v05/k_max": float(max(ks, default=0)),
    }
