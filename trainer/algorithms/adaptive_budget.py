"""V0.5's adaptive rollout budget (Zhang et al. 2026, arXiv:2603.10848, Sec. 3.3): each prompt
starts with k_init rollouts and gets one more while a one-step look-ahead says it pays,

    J(k) = MSE(k) + c * k,    add a rollout while J(k + 1) < J(k) and k < k_max,

with MSE(k) the fused baseline's MSE (`prior_fusion.mse`) at the current estimates of D^2 and s^2
(paper: k_init 4, k_max 16, c = 1/256). When the rollouts agree with the prior (D^2 = 0) the MSE is
0 and the prompt stops at k_init; when they reject it, w -> 1 and more rollouts pay until
s^2 / (k (k + 1)) < c. The extra rollouts go through the trainer's own rollout function, so the
cost counters see every one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pvpo.trainer.algorithms.prior_fusion import fuse, mse


def objective(rewards: Sequence[float], prior: float | None, k: int, cost: float) -> float:
    """J(k) = MSE(k) + c k, with D^2 and s^2 estimated from `rewards` (k may exceed len(rewards):
    the look-ahead keeps the current estimates)."""
    n = len(rewards)
    mean = sum(rewards) / n
    var = statistics.variance(rewards) if n > 1 else 0.0
    d2 = fuse(mean, var, n, prior).d2
    return mse(d2, var, k) + cost * k


def wants_more(rewards: Sequence[float], prior: float | None, *, k_max: int, cost: float) -> bool:
    """Whether one more rollout lowers J (module docstring); never beyond `k_max`."""
    k = len(rewards)
    if k == 0:
        raise ValueError("wants_more needs the prompt's first rollouts")
    return k < k_max and objective(rewards, prior, k + 1, cost) < objective(rewards, prior, k, cost)


def extend_groups(
    examples: Sequence[Any],
    trajs: Sequence[Any],
    prior: Mapping[str, float | None],
    rollout: Callable[[list[Any], int], list[Any]],
    *,
    k_max: int,
    cost: float,
) -> tuple[list[Any], dict[str, float]]:
    """Rounds of one more rollout for every prompt of `examples` (objects with `.uid`) that
    `wants_more`, given its trajectories so far (`.uid`, `.reward`), until none does.
    `rollout(examples, round)` samples one trajectory per example. Returns the new trajectories
    and `v05/*` figures (extra rollouts, rounds, mean and max rollouts per prompt)."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        rewards[t.uid].append(float(t.reward))
    new: list[Any] = []
    rounds = 0
    while True:
        todo = [
            ex
            for ex in examples
            if rewards[ex.uid] and wants_more(rewards[ex.uid], prior.get(ex.uid), k_max=k_max, cost=cost)
        ]
        if not todo:
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
