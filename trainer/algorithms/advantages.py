"""Outcome-level advantage estimators (GRPO, Dr.GRPO, RLOO, PVPO) behind one registry.

Every estimator maps one scalar reward per trajectory to one scalar advantage per trajectory,
with the same keyword-only signature, so the training loop never branches on the algorithm:

    estimate(rewards: Tensor[B], uids: Sequence[str], *, anchors=None, eps=1e-6, **kwargs) -> Tensor[B]

Groups are formed by `uid` (the prompt id), never by position: members of one group may sit
anywhere in the batch. Extra keyword arguments are accepted and ignored by estimators that do not
use them, so later estimators (GDPO's per-component rewards, prior fusion's priors, GT-injection
flags) add keywords without changing the call site. The group helpers below reduce over dim 0 and
work on `[B]` as well as `[B, K]` (K reward components), which GDPO reuses.
Token-level estimators (PPO with GAE) register with `level="token"` and return `[B, T]`.

Registered here: `grpo`, `dr_grpo`, `rloo`, `pvpo`; in their own modules (imported at the end of
this one, so the registry is complete whichever is imported first): `gdpo` (gdpo.py), `v05` and
`v05_value` (prior_fusion.py), `ppo` (gae.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import torch

from pvpo.registry import Registry


class Estimator(Protocol):
    """An advantage estimator: per-trajectory rewards and group ids in, advantages out."""

    def __call__(
        self,
        rewards: torch.Tensor,
        uids: Sequence[str],
        *,
        anchors: Mapping[str, float] | None = None,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> torch.Tensor: ...


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_estimator(
    name: str,
    *,
    needs_anchors: bool = False,
    level: Literal["outcome", "token"] = "outcome",
    loss_agg: str = "token-mean",
) -> Callable[[Estimator], Estimator]:
    """Register an estimator under `name`. `needs_anchors` tells the trainer to build a reference
    anchor store before training; `level` says whether it returns `[B]` or `[B, T]`; `loss_agg` is
    the loss aggregation the method's paper pairs it with (used unless `optim.loss_agg` is set).
    All are stored as attributes on the function (`fn.needs_anchors`, `fn.level`, `fn.loss_agg`,
    `fn.name`)."""

    def decorate(fn: Estimator) -> Estimator:
        fn.name = name  # type: ignore[attr-defined]
        fn.needs_anchors = needs_anchors  # type: ignore[attr-defined]
        fn.level = level  # type: ignore[attr-defined]
        fn.loss_agg = loss_agg  # type: ignore[attr-defined]
        return ESTIMATORS.register(name, fn)

    return decorate


def get_estimator(name: str) -> Estimator:
    """The estimator registered as `name`; UnknownNameError listing the known names otherwise."""
    return ESTIMATORS.get(name)


def available_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    return ESTIMATORS.names()


# ---------------------------------------------------------------------------------------------
# Group helpers (reduce over dim 0; rewards may be [B] or [B, K])


def group_index(uids: Sequence[str], device: torch.device | None = None) -> tuple[torch.Tensor, list[str]]:
    """Map each sample to its group: `(index[B] long, unique_uids)` with uids in first-seen order."""
    order: dict[str, int] = {}
    idx = [order.setdefault(u, len(order)) for u in uids]
    return torch.tensor(idx, dtype=torch.long, device=device), list(order)


def _check(rewards: torch.Tensor, uids: Sequence[str]) -> None:
    if rewards.dim() == 0 or rewards.shape[0] != len(uids):
        raise ValueError(f"rewards has shape {tuple(rewards.shape)} but there are {len(uids)} uids")
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating tensor, got {rewards.dtype}")


def group_stats(rewards: torch.Tensor, uids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample `(group_sum, group_count, group_mean)`, each broadcast back to the sample (same
    shape as `rewards`; count has the leading shape `[B]` plus singleton dims)."""
    _check(rewards, uids)
    idx, groups = group_index(uids, rewards.device)
    sums = torch.zeros((len(groups), *rewards.shape[1:]), dtype=rewards.dtype, device=rewards.device)
    sums.index_add_(0, idx, rewards)
    counts = torch.bincount(idx, minlength=len(groups)).to(rewards.dtype)
    counts = counts.view(-1, *([1] * (rewards.dim() - 1)))
    s, c = sums[idx], counts[idx]
    return s, c, s / c


def group_std(rewards: torch.Tensor, uids: Sequence[str]) -> torch.Tensor:
    """Per-sample unbiased (Bessel, n-1) standard deviation of its group, as `torch.std` computes
    it (the convention of TRL and verl). Groups of size 1 get std 0."""
    _, count, mean = group_stats(rewards, uids)
    idx, groups = group_index(uids, rewards.device)
    sq = torch.zeros((len(groups), *rewards.shape[1:]), dtype=rewards.dtype, device=rewards.device)
    sq.index_add_(0, idx, (rewards - mean) ** 2)
    var = sq[idx] / (count - 1).clamp(min=1)
    return var.sqrt()


# ---------------------------------------------------------------------------------------------
# Estimators


@register_estimator("grpo")
def grpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    **kwargs: Any,
) -> torch.Tensor:
    """GRPO: `(r - mean_group) / (std_group + eps)` with the unbiased (n-1) group std, like
    `torch.std` in TRL and verl. A group of size 1 (no baseline to compare with) gets 0."""
    _, count, mean = group_stats(rewards, uids)
    adv = (rewards - mean) / (group_std(rewards, uids) + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


# Dr.GRPO's loss divides each sequence's token sum by one constant (the generation budget), so
# neither a response's length nor the batch's longest response rescales a token's gradient.
@register_estimator("dr_grpo", loss_agg="seq-mean-token-sum-norm")
def dr_grpo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    **kwargs: Any,
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025): `r - mean_group`, no std normalisation (a size-1 group gets 0)."""
    _, _, mean = group_stats(rewards, uids)
    return rewards - mean


@register_estimator("rloo")
def rloo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    **kwargs: Any,
) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): `r - mean(other members of the group)`; size-1 group -> 0."""
    total, count, _ = group_stats(rewards, uids)
    loo_mean = (total - rewards) / (count - 1).clamp(min=1)
    adv = rewards - loo_mean
    return torch.where(count > 1, adv, torch.zeros_like(adv))


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
    _check(rewards, uids)
    if missing not in ("error", "group_mean"):
        raise ValueError(f"missing must be 'error' or 'group_mean', got {missing!r}")
    anchors = anchors if anchors is not None else {}
    absent = sorted({u for u in uids if u not in anchors})
    if absent and missing == "error":
        shown = ", ".join(absent[:10]) + (f" ... ({len(absent)} in all)" if len(absent) > 10 else "")
        raise KeyError(f"pvpo: no reference anchor for uid(s): {shown}")
    if absent:
        _, _, fallback = group_stats(rewards, uids)
        base = [anchors[u] if u in anchors else float(fallback[i]) for i, u in enumerate(uids)]
    else:
        base = [anchors[u] for u in uids]
    baseline = torch.tensor(base, dtype=rewards.dtype, device=rewards.device)
    return rewards - baseline.view(-1, *([1] * (rewards.dim() - 1)))


# ---------------------------------------------------------------------------------------------
# Broadcasting and logging


def broadcast_to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantages `[B, T]`: each trajectory's advantage on its model tokens (mask 1),
    0 on environment and padding tokens (mask 0). Token-level advantages (`[B, T]` already, e.g.
    PPO's GAE) are masked the same way."""
    if adv.dim() == 2 and adv.shape == mask.shape:
        return adv * mask.to(adv.dtype)
    if adv.dim() != 1 or mask.dim() != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"expected adv [B] or [B, T] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}")
    return adv.unsqueeze(1) * mask.to(adv.dtype)


def advantage_stats(
    adv: torch.Tensor, uids: Sequence[str], *, atol: float = 1e-8, mask: torch.Tensor | None = None
) -> dict[str, float]:
    """Batch metrics for logging: mean/std/min/max of the per-trajectory advantages and the
    fraction of groups whose advantages are all (numerically) zero, i.e. groups that give no
    learning signal. Token-level advantages `[B, T]` with their loss `mask` are summarised over
    the model tokens only (padding and env tokens are not advantages)."""
    _check(adv, uids)
    flat = adv.detach().double().reshape(adv.shape[0], -1)
    idx, groups = group_index(uids, adv.device)
    nonzero = torch.zeros(len(groups), dtype=torch.float64, device=adv.device)
    nonzero.index_add_(0, idx, (flat.abs() > atol).any(dim=1).double())
    vals = (
        flat[mask.to(adv.device) > 0]
        if mask is not None and adv.dim() == 2 and bool((mask > 0).any())
        else flat.reshape(-1)
    )
    return {
        "adv/mean": float(vals.mean()),
        "adv/std": float(vals.std()) if vals.numel() > 1 else 0.0,
        "adv/min": float(vals.min()),
        "adv/max": float(vals.max()),
        "adv/zero_group_frac": float((nonzero == 0).double().mean()),
        "adv/num_groups": float(len(groups)),
    }


# The estimators of their own modules register on import (they import the helpers above).
from pvpo.trainer.algorithms import gae, gdpo, prior_fusion  # noqa: E402,F401
