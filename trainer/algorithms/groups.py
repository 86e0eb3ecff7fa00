"""Group statistics over a batch whose rows are grouped by prompt `uid` (not by position): each
row's group sum, size, mean and unbiased standard deviation, broadcast back to the row. They
reduce over dim 0 and work on `[B]` as well as `[B, K]` (K reward components, GDPO).

`rows` (bool `[B]`, optional) names the rows the statistics are taken over; every row still gets
its group's figures. The trainer passes the policy's own rollouts (not the injected GT rows): a
group baseline is "the empirical mean of the rollouts" (V0.5, GRPO), and a GT trajectory is not a
rollout of the policy.

A normalised estimator (GRPO, GDPO) divides by a spread, and the group a GT row is injected into
is usually one the policy never solves, whose rows all sit at the format floor: spread 0. The
policy rows' std would then scale the GT row by 1 / eps (10^6). `normalised` scales a GT row by
the std of its whole group, GT rows included, as LUFFY scales the off-policy traces it mixes into
a group (Yan et al. 2025, arXiv:2504.14945, Sec. 3: the advantage's mean and std over the mixed
group); a policy row keeps its policy rows' mean and std, so a GT row changes none of them. The
GT row's advantage is then at most sqrt(n) in a group of n rows (n - 1 policy rows at one value,
the GT row apart: d / (d / sqrt(n))).
"""

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


def row_weights(rewards: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """`rows` as a float `[B]` weight (1 = counted), all ones when None; a ValueError when its
    length is not the batch's."""
    if rows is None:
        return torch.ones(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    if rows.dim() != 1 or rows.shape[0] != rewards.shape[0]:
        raise ValueError(f"rows must be [B] with B={rewards.shape[0]}, got {tuple(rows.shape)}")
    return rows.to(device=rewards.device, dtype=rewards.dtype)


def group_stats(
    rewards: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample `(group_sum, group_count, group_mean)` over the group's `rows` (module
    docstring; all rows when None), each broadcast back to the sample (same shape as `rewards`;
    count has the leading shape `[B]` plus singleton dims). A group with no counted row has
    count 0 and mean 0."""
    check_rewards(rewards, uids)
    idx, groups = group_index(uids, rewards.device)
    wt = row_weights(rewards, rows)
    shape = (-1, *([1] * (rewards.dim() - 1)))
    sums = torch.zeros((len(groups), *rewards.shape[1:]), dtype=rewards.dtype, device=rewards.device)
    sums.index_add_(0, idx, rewards * wt.view(shape))
    counts = torch.zeros(len(groups), dtype=rewards.dtype, device=rewards.device)
    counts.index_add_(0, idx, wt)
    counts = counts.view(shape)
    s, c = sums[idx], counts[idx]
    return s, c, s / c.clamp(min=1)


def group_std(rewards: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample unbiased (Bessel, n-1) standard deviation of its group's `rows`, as `torch.std`
    computes it (the convention of TRL and verl). Groups of one counted row or none get std 0."""
    _, count, mean = group_stats(rewards, uids, rows)
    idx, groups = group_index(uids, rewards.device)
    wt = row_weights(rewards, rows).view(-1, *([1] * (rewards.dim() - 1)))
    sq = torch.zeros((len(groups), *rewards.shape[1:]), dtype=rewards.dtype, device=rewards.device)
    sq.index_add_(0, idx, wt * (rewards - mean) ** 2)
    var = sq[idx] / (count - 1).clamp(min=1)
    return var.sqrt()


def normalised(
    values: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """`(v - mean) / (std + eps)` per group (`[B]` or `[B, K]`), the mean over the group's `rows`
    (the policy's own rollouts) and the unbiased std over them for a row among them, over the whole
    group (GT rows included: module docstring) for a row outside them. 0 where no signal is defined:
    a policy row with fewer than 2 policy rows in its group, a GT row in a group without a policy row
    or of a single row."""
    _, count, mean = group_stats(values, uids, rows)
    _, n_all, _ = group_stats(values, uids)
    own = row_weights(values, rows).view(-1, *([1] * (values.dim() - 1))) > 0
    scale = torch.where(own, group_std(values, uids, rows), group_std(values, uids))
    defined = torch.where(own, count > 1, (count > 0) & (n_all > 1))
    adv = (values - mean) / (scale + eps)
    return torch.where(defined, adv, torch.zeros_like(adv))
