"""GDPO: group reward-decoupled normalisation of several rewards (Liu et al. 2026, arXiv:2601.05242).

GRPO on a summed reward maps distinct reward combinations to one advantage: in a group of two
rollouts with two binary rewards, summed rewards (0, 1), (0, 2) and (1, 2) all give
(-0.7071, +0.7071). GDPO normalises each component in its group first (Eq. 4),

    A_k = (r_k - mean_group(r_k)) / (std_group(r_k) + eps),

sums them with the component weights, A = sum_k w_k A_k (Eq. 5), and normalises A over the
whole batch (Eq. 6), so (0, 2) gets (-1.4142, +1.4142) before the batch step: twice the signal of
the patterns where one reward differs. Conditioned rewards (Sec. 3.2): a component counts only
where another reaches a threshold (r_k <- r_k * 1[r_l >= t]), applied before normalisation.

Injected GT rows (Group Sampling) and bounds. The group step is `groups.normalised` (GRPO's: a GT
row over the std of its group's policy rows and itself, `|A_k| <= sqrt(n)` in a group of n). The
batch step is taken over the policy rows only, every rank's (the batch is every rank's): a policy
row is divided by their std, so it is bounded by `(B_p - 1) / sqrt(B_p)` over B_p policy rows
(Samuelson's inequality), as Eq. 6 makes it (17.8 at 64 groups of 5, 25.3 on two such ranks, when
one row alone has spread). A GT row enters no batch statistic and is not divided by the policy
rows' std: it gets the weighted mean of its group-step advantages, `sum_k w_k A_k / sum_k |w_k|`,
on the unit scale the batch step gives the policy rows and bounded by sqrt(n) whatever the batch
and world size. Rejected: dividing it by the std of the batch with the GT rows, which let it reach
sqrt(batch rows): 2.83 at 2 groups of 4, 17.89 at 64 groups of 5.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pvpo.trainer.algorithms.data_parallel import SINGLE, pooled_mean_std
from pvpo.trainer.algorithms.estimator_state import EstimatorContext, EstimatorState
from pvpo.trainer.algorithms.groups import check_rewards, normalised, row_weights
from pvpo.trainer.algorithms.spec import register_estimator
from pvpo.trainer.rollout.trajectory import Batch, Trajectory


def component_matrix(
    components: Sequence[Mapping[str, float]], names: Sequence[str] | None = None
) -> tuple[torch.Tensor, list[str]]:
    """`[B, K]` float32 tensor of the named reward components of each trajectory, and the names
    (one column each, in order; `names=None` = every name any trajectory has, sorted). A
    trajectory without components (a reward that failed, scoring 0: `pvpo.reward`'s totality
    rule) gets 0 in every column; one that has components but lacks a named one is a KeyError
    naming it and the components it has."""
    if names is None:
        names = sorted({k for c in components for k in c})
    names = list(names)
    rows = []
    for i, comp in enumerate(components):
        missing = [n for n in names if n not in comp]
        if missing and comp:
            raise KeyError(f"trajectory {i} has no reward component(s) {missing}; it has {sorted(comp)}")
        rows.append([float(comp.get(n, 0.0)) for n in names])
    return torch.tensor(rows, dtype=torch.float32).reshape(len(components), len(names)), names


def condition(components: torch.Tensor, names: Sequence[str], conditions: Sequence[Any]) -> torch.Tensor:
    """Apply GDPO's conditioned rewards: for each `(component, when, threshold)` (a tuple or an
    object with those attributes), column `component` is zeroed where column `when` < threshold.
    Conditions read the unconditioned columns, so their order does not matter."""
    names = list(names)
    out = components.clone()
    for c in conditions:
        comp, on, thr = (c.component, c.when, c.threshold) if hasattr(c, "component") else c
        for n in (comp, on):
            if n not in names:
                raise KeyError(f"gdpo condition names component {n!r}; components: {names}")
        out[:, names.index(comp)] *= (components[:, names.index(on)] >= thr).to(out.dtype)
    return out


def weight_vector(
    names: Sequence[str], weights: Mapping[str, float] | Sequence[float] | None, like: torch.Tensor
) -> torch.Tensor:
    """`[K]` component weights: a mapping by name (unnamed components weigh 1), a sequence of K,
    or None (all 1). A name that is not a component is a KeyError listing the components."""
    k = len(names)
    if weights is None:
        return torch.ones(k, dtype=like.dtype, device=like.device)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise KeyError(f"gdpo weights name unknown component(s) {unknown}; components: {list(names)}")
        vals = [float(weights.get(n, 1.0)) for n in names]
    else:
        vals = [float(w) for w in weights]
        if len(vals) != k:
            raise ValueError(f"gdpo: {len(vals)} weights for {k} components {list(names)}")
    return torch.tensor(vals, dtype=like.dtype, device=like.device)


class GDPOState(EstimatorState):
    """Builds `components=` `[B, K]` from each trajectory's reward components, with the names,
    weights, conditions and batch-norm flag of `algorithm.gdpo`. Under torchrun the columns are
    the components of every rank's trajectories and the batch normalisation is over every rank's."""

    def __init__(self, context: EstimatorContext) -> None:
        self.cfg, self.parallel = context.algorithm.gdpo, context.parallel

    def kwargs(self, trajs: Sequence[Trajectory], batch: Batch) -> dict[str, Any]:
        names = self.cfg.components
        if names is None and self.parallel.distributed:
            mine = sorted({k for t in trajs for k in t.reward_components})
            names = sorted({k for part in self.parallel.all_gather(mine) for k in part})
        comps, names = component_matrix([t.reward_components for t in trajs], names)
        return {
            "components": comps,
            "component_names": names,
            "weights": self.cfg.weights,
            "conditions": self.cfg.conditions,
            "batch_norm": self.cfg.batch_norm,
            "all_sum": self.parallel.all_sum if self.parallel.distributed else None,
        }


@register_estimator("gdpo", state=GDPOState)
def gdpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    components: torch.Tensor | None = None,
    component_names: Sequence[str] | None = None,
    weights: Mapping[str, float] | Sequence[float] | None = None,
    conditions: Sequence[Any] = (),
    batch_norm: bool = True,
    policy_rows: torch.Tensor | None = None,
    all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """GDPO advantages `[B]` (arXiv:2601.05242, Eqs. 4-6): per-component group normalisation
    (`groups.normalised`, as our `grpo`: mean and unbiased std over the group's `policy_rows`; an
    injected GT row is measured against the policy rows' mean and scaled by the std of the policy
    rows and itself; a policy row with fewer than 2 policy rows in its group gets 0),
    weighted sum over components, then the batch step over the batch's policy rows when
    `batch_norm` (`batch_normalise`; a GT row gets its weighted mean instead: module docstring).
    A group whose policy rows share every component gives them exactly 0.

    `components`: `[B, K]`, one column per reward component (required: the trainer builds it
    from `Trajectory.reward_components`); `component_names` names the columns for `weights`
    given by name and for `conditions`; `all_sum` (a tensor summed over the ranks of a torchrun
    run): the batch of Eq. 6 is every rank's."""
    check_rewards(rewards, uids)
    if components is None:
        raise ValueError(
            "gdpo needs components= ([B, K] reward components); the trainer passes them, a direct call must too"
        )
    comps = components.to(device=rewards.device, dtype=rewards.dtype)
    if comps.dim() != 2 or comps.shape[0] != rewards.shape[0]:
        raise ValueError(f"components must be [B, K] with B={rewards.shape[0]}, got {tuple(comps.shape)}")
    names = list(component_names) if component_names is not None else [str(i) for i in range(comps.shape[1])]
    if len(names) != comps.shape[1]:
        raise ValueError(f"{len(names)} component names for {comps.shape[1]} columns")
    if conditions:
        comps = condition(comps, names, conditions)
    per = normalised(comps, uids, policy_rows, eps)
    w = weight_vector(names, weights, per)
    adv = per @ w
    if batch_norm:
        adv = batch_normalise(adv, policy_rows, eps, all_sum, gt_scale=float(w.abs().sum()))
    return adv


def batch_normalise(
    adv: torch.Tensor,
    rows: torch.Tensor | None,
    eps: float,
    all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    gt_scale: float = 1.0,
) -> torch.Tensor:
    """GDPO's batch step (arXiv:2601.05242, Eq. 6), `(A - mean) / (std + eps)` over `rows` (the
    policy's own rollouts; all rows when None), every rank's with `all_sum` (a tensor summed over
    the ranks of a torchrun run). `adv` is the group step's weighted sum, whose mean over the policy
    rows is 0 by construction (each group's policy rows are centred; a group of one policy row gives
    0), so the mean is not subtracted: its float64 rounding would only move the rows of groups
    without spread off exactly 0. A policy row is divided by the policy rows' unbiased std (left as
    it is with fewer than 2 of them); a row outside `rows` (an injected GT row) is divided by
    `gt_scale` (gdpo: the sum of the weights' magnitudes) and by no batch statistic (module
    docstring: its bound)."""
    total = all_sum or SINGLE.all_sum
    own = row_weights(adv, rows) > 0
    _, std, n = pooled_mean_std(adv[own], total)
    a = adv.double()
    policy = a / (std + eps) if n > 1 else a
    injected = a / gt_scale if gt_scale > 0 else torch.zeros_like(a)
    return torch.where(own, policy, injected).to(adv.dtype)
