"""Group statistics over a batch whose rows are grouped by prompt `uid` (not by position): each
row's group sum, size, mean and unbiased standard deviation, broadcast back to the row. They
reduce over dim 0 and work on `[B]` as well as `[B, K]` (K reward components, GDPO).

Exactness: the statistics are float64, and each group's are taken around a pivot (its first
counted row), so rows equal to the pivot contribute exactly 0: a group whose counted rows share one
reward has deviation and spread exactly 0 whatever that reward (float32 2/3 included), and every
estimator built on `deviations` gives it exactly 0. The float32 mean and std of eight rows at
float32 2/3 left a same-sign residue that GRPO turned into +0.056 on every row.

`rows` (bool `[B]`, optional) names the rows the statistics are taken over; every row still gets
its group's figures. The trainer passes the policy's own rollouts (not the injected GT rows): a
group baseline is "the empirical mean of the rollouts" (V0.5, GRPO), and a GT trajectory is not a
rollout of the policy.

The GT credit rule of a normalised estimator (GRPO, GDPO's group step): a policy row gets
`(r - mean_p) / std_p` over its group's policy rows, so injecting a GT row changes no policy row; a
GT row gets `(r - mean_p) / std_p+1`, the same deviation from the policy rows' mean over the
unbiased std of the policy rows and that GT row alone. Dividing by `std_p` (a spread the GT row did
not enter) sent a GT row in a group at the format floor (spread 0) to 1 / eps; with the GT row in
its own std, `|A| <= sqrt(m + 1) <= sqrt(n)` for m policy rows in a group of n, whatever the other
GT rows hold (with `d = r - mean_p` and M2 the policy rows' squared deviations,
`std_p+1^2 = (M2 + m d^2 / (m + 1)) / m >= d^2 / (m + 1)`). This is not LUFFY's mixed-group rule
(Yan et al. 2025, arXiv:2504.14945, Sec. 3: every row, policy and off-policy, against the mixed
group's mean and std), which moves every policy row of a group when a GT row joins it (four
policy rows at the 0.1 format floor and a GT row at 1: each policy row -0.447, where the policy
never solved the prompt). Its cost: a GT row gets less credit than a policy row of equal reward
in a group whose policy rows have spread, because its std holds its own deviation (policy rows
[0, 0, 0, 1] and a GT row at 1: the policy row 1.5, the GT row 0.75 / 0.548 = 1.369).
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


def deviations(
    values: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 `(dev, count, m2)` per row: its value minus its group's mean over the group's `rows`
    (all rows when None), the number of counted rows of its group, and their sum of squared
    deviations, each broadcast to the row (`dev` and `m2` shaped as `values`; `count` `[B]` plus
    singleton dims). Taken around the group's first counted row (module docstring: exact zeros for
    a group without spread). A group with no counted row has count 0, m2 0 and dev 0."""
    dev, count, m2, _ = _moments(values, uids, rows)
    return dev, count, m2


def _moments(
    values: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`deviations` and the group mean (0 for a group without a counted row), float64."""
    check_rewards(values, uids)
    v = values.detach().double()
    idx, groups = group_index(uids, v.device)
    wt = row_weights(v, rows)
    shape = (-1, *([1] * (v.dim() - 1)))
    b, g = v.shape[0], len(groups)
    pos = torch.arange(b, device=v.device)
    counted = wt > 0
    first = torch.full((g,), b, dtype=torch.long, device=v.device)
    first.scatter_reduce_(0, idx[counted], pos[counted], reduce="amin")
    has = first < b
    pivot_row = torch.where(has, first, torch.zeros_like(first))
    shifted = v - v[pivot_row][idx]
    w = wt.view(shape)
    sums = torch.zeros((g, *v.shape[1:]), dtype=v.dtype, device=v.device).index_add_(0, idx, shifted * w)
    counts = torch.zeros(g, dtype=v.dtype, device=v.device).index_add_(0, idx, wt)
    count = counts[idx].view(shape)
    shift = sums[idx] / count.clamp(min=1)
    dev = shifted - shift
    m2 = torch.zeros_like(sums).index_add_(0, idx, w * dev**2)[idx]
    present = has[idx].view(shape)
    dev = torch.where(present, dev, torch.zeros_like(dev))
    mean = torch.where(present, v[pivot_row][idx] + shift, torch.zeros_like(dev))
    return dev, count, m2, mean


def group_stats(
    rewards: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample `(group_sum, group_count, group_mean)` over the group's `rows` (module
    docstring; all rows when None), each broadcast back to the sample in the rewards' dtype (same
    shape as `rewards`; count has the leading shape `[B]` plus singleton dims). A group with no
    counted row has count 0 and mean 0."""
    _, count, _, mean = _moments(rewards, uids, rows)
    return (mean * count).to(rewards.dtype), count.to(rewards.dtype), mean.to(rewards.dtype)


def group_std(rewards: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample unbiased (Bessel, n-1) standard deviation of its group's `rows`, as `torch.std`
    computes it (the convention of TRL and verl). Groups of one counted row or none get std 0."""
    _, count, m2 = deviations(rewards, uids, rows)
    return (m2 / (count - 1).clamp(min=1)).sqrt().to(rewards.dtype)


def normalised(
    values: torch.Tensor, uids: Sequence[str], rows: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """`(v - mean) / (std + eps)` per group (`[B]` or `[B, K]`), the mean over the group's `rows`
    (the policy's own rollouts), the unbiased std over them for a row among them and over them and
    the row itself for a row outside them (module docstring: `|A| <= sqrt(n)`). 0 where no signal
    is defined: a policy row with fewer than 2 policy rows in its group, a GT row in a group without
    a policy row; exactly 0 for a row equal to every policy row of its group."""
    dev, count, m2 = deviations(values, uids, rows)
    own = row_weights(values, rows).view(-1, *([1] * (values.dim() - 1))) > 0
    var_own = m2 / (count - 1).clamp(min=1)
    var_gt = (m2 + count / (count + 1) * dev**2) / count.clamp(min=1)
    scale = torch.where(own, var_own, var_gt).sqrt()
    defined = torch.where(own, count > 1, count > 0)
    adv = dev / (scale + eps)
    return torch.where(defined, adv, torch.zeros_like(adv)).to(values.dtype)
