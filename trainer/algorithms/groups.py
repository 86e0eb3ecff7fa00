"""Group statistics over a batch whose rows are grouped by prompt `uid` (not by position): each
row's group sum, size, mean and unbiased standard deviation, broadcast back to the row. They
reduce over dim 0 and work on `[B]` as well as `[B, K]` (K reward components, GDPO)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_index(uids: Sequence[str], device: torch.device | None = None) -> tuple[torch.Tensor, list[str]]:
    """Map each sample to its group: `(index[B] long, unique_uids)` with uids in first-seen order."""
    order: dict[str, int] = {}
    idx = [order.setdefault(u, len(order)) for u in uids]
    return torch.tensor(idx, dtype=torch.long, device=device), list(order)


def check_rewards(rewards: torch.Tensor, uids: Sequence[str]) -> None:
    if rewards.dim() == 0 or rewards.shape[0] != len(uids):
        raise ValueError(f"rewards has shape {tuple(rewards.shape)} but there are {len(uids)} uids")
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating tensor, got {rewards.dtype}")


def group_stats(rewards: torch.Tensor, uids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample `(group_sum, group_count, group_mean)`, each broadcast back to the sample (same
    shape as `rewards`; count has the leading shape `[B]` plus singleton dims)."""
    check_rewards(rewards, uids)
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
