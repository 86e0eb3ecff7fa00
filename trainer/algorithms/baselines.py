"""The group-baseline estimators and PVPO's static anchor: GRPO, Dr.GRPO, RLOO, PVPO (signature
in `spec.py`). A group of size 1 has no baseline to compare with and gets advantage 0, except
under PVPO, whose baseline is the reference anchor.

`policy_rows` (bool `[B]`, the trainer passes `~batch.is_gt`): the group statistics (mean, std,
leave-one-out mean) are taken over the policy's own rollouts only; an injected GT row gets its
reward measured against that same baseline (a GT row is not a rollout of the policy), and under
GRPO is scaled by the std of the policy rows and itself (`groups.py`'s GT credit rule: at most
sqrt(n) in a group of n). Deviations come from `groups.deviations` (float64, around a pivot), so a
group whose policy rows share one reward gives them exactly 0 under GRPO, Dr.GRPO and RLOO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from pvpo.trainer.algorithms.groups import check_rewards, deviations, group_stats, normalised, row_weights
from pvpo.trainer.algorithms.spec import register_estimator


@register_estimator("grpo")
def grpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    policy_rows: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """GRPO (Shao et al. 2024, arXiv:2402.03300): `(r - mean_group) / (std_group + eps)` with the
    unbiased (n-1) group std, like `torch.std` in TRL and verl, over the group's `policy_rows`; an
    injected GT row is measured against the policy rows' mean and scaled by the std of the policy
    rows and itself (`groups.py`'s GT credit rule: `|A| <= sqrt(n)`, never 1 / eps; not LUFFY's
    mixed mean and std, and a GT row gets less than a policy row of equal reward where the policy
    rows have spread). A policy row with fewer than 2 policy rows in its group (no baseline to
    compare with) gets 0; a group whose policy rows share one reward gets exactly 0."""
    check_rewards(rewards, uids)
    return normalised(rewards, uids, policy_rows, eps)


# Dr.GRPO's loss divides each sequence's token sum by one constant (the generation budget), so
# neither a response's length nor the batch's longest response rescales a token's gradient
# (`spec.OWN_AGGREGATION`).
@register_estimator("dr_grpo")
def dr_grpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    policy_rows: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025): `r - mean_group` over the group's `policy_rows`, no std
    normalisation (a size-1 group gets 0; a group without a policy row too)."""
    dev, count, _ = deviations(rewards, uids, policy_rows)
    return torch.where(count > 0, dev, torch.zeros_like(dev)).to(rewards.dtype)


@register_estimator("rloo")
def rloo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    policy_rows: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): `r - mean(other policy rows of the group)`; a GT row (not in
    `policy_rows`) is measured against the mean of all the policy rows. No other policy row -> 0.
    A policy row's `r - (S - r) / (m - 1)` is `m / (m - 1) * (r - mean)` over m policy rows, so it is
    computed from `groups.deviations` (exactly 0 in a group without spread)."""
    dev, count, _ = deviations(rewards, uids, policy_rows)
    own = row_weights(dev, policy_rows).view(-1, *([1] * (rewards.dim() - 1)))
    others = count - own
    adv = torch.where(own > 0, dev * count / others.clamp(min=1), dev)
    return torch.where(others > 0, adv, torch.zeros_like(adv)).to(rewards.dtype)


@register_estimator("pvpo", needs_anchors=True)
def pvpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    missing: Literal["error", "group_mean"] = "error",
    **kwargs: Any,
) -> torch.Tensor:
    """PVPO (Feng et al. 2025): `r - anchors[uid]`, where the anchor is the mean reward of M
    reference-policy rollouts of the same prompt (a static value estimate); no std normalisation.

    `missing="error"` (default) raises KeyError naming the uids without an anchor;
    `missing="group_mean"` falls back to Dr.GRPO's in-batch group mean for those uids."""
    check_rewards(rewards, uids)
    if missing not in ("error", "group_mean"):
        raise ValueError(f"missing must be 'error' or 'group_mean', got {missing!r}")
    anchors = anchors if anchors is not None else {}
    absent = sorted({u for u in uids if u not in anchors})
    if absent and missing == "error":
        shown = ", ".join(absent[:10]) + (f" ... ({len(absent)} in all)" if len(absent) > 10 else "")
        raise KeyError(f"pvpo: no reference anchor for uid(s): {shown}")
    if absent:
        _, _, fallback = group_stats(rewards, uids, kwargs.get("policy_rows"))
        base = [anchors[u] if u in anchors else float(fallback[i]) for i, u in enumerate(uids)]
    else:
        base = [anchors[u] for u in uids]
    baseline = torch.tensor(base, dtype=rewards.dtype, device=rewards.device)
    return rewards - baseline.view(-1, *([1] * (rewards.dim() - 1)))
