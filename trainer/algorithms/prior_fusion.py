"""V0.5's fused baseline: a value prior shrunk towards the group mean (Zhang et al. 2026,
arXiv:2603.10848, Sec. 3).

For a prompt with k rollouts of mean m and empirical variance s^2, and a prior value V:

    mu = w * m + (1 - w) * V,    w* = D^2 / (D^2 + s^2 / k),

the weight that minimises the baseline's MSE when the prior is off by D. D^2 is estimated by the
positive-part rule, D^2 = max(0, (m - V)^2 - s^2 / k): the squared deviation minus what sampling
noise alone explains, i.e. the prior is trusted fully (w = 0) unless the rollouts reject it. At w*
the MSE is D^2 (s^2/k) / (D^2 + s^2/k); the adaptive budget (`adaptive_budget.py`) reads it.

s^2 is the unbiased empirical variance of the k rewards, shrunk towards a Bernoulli bound with a
pseudo-count `a` (`algorithm.prior_fusion.var_pseudo_count`, default 1) so that k equal rewards
(or k = 1) do not claim zero noise:

    p~ = (k (m - lo) / R + 1) / (k + 2)                      (Laplace-smoothed mean, rescaled to [0, 1])
    s~^2 = ((k - 1) s^2 + a R^2 p~ (1 - p~)) / (k - 1 + a)

with [lo, hi] the reward range (`prior_fusion.reward_range`, R = hi - lo). R^2 p (1 - p) is the
largest variance a reward in [lo, hi] with mean p can have, so the floor is an upper bound that
weighs like `a` extra rollouts and fades as k grows. Examples at R = 1, a = 1: four rewards 0 give
s~^2 = (5/36) / 4 = 0.035 (noise s~^2/k = 0.0087: a prior V = 0.3 is rejected, w = 0.90; V = 0.05
is kept, w = 0); one reward 0 gives s~^2 = 2/9. `a = 0` is the plain sample variance (a uniform
group then discards the prior, w = 1, and every advantage is 0).

The statistics are over the group's policy rollouts (`rows`): an injected GT trajectory is not a
rollout of the policy and gets r - mu of the policy rows. A prompt without a prior (an empty value
model) uses its group mean (w = 1). Advantage = r - mu, with no std normalisation (the baseline is
the point).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pvpo.trainer.algorithms.groups import check_rewards, group_stats, group_std


@dataclass(frozen=True)
class NoiseFloor:
    """The reward range `[lo, hi]` and the pseudo-count `a` of the variance floor (module docstring)."""

    lo: float = 0.0
    hi: float = 1.0
    pseudo_count: float = 1.0

    def __post_init__(self) -> None:
        if not self.hi > self.lo or self.pseudo_count < 0:
            raise ValueError(f"need lo < hi and pseudo_count >= 0, got {self.lo}, {self.hi}, {self.pseudo_count}")

    @property
    def span(self) -> float:
        return self.hi - self.lo


def floored_variance(mean: float, var: float, k: int, floor: NoiseFloor | None = None) -> float:
    """s~^2 of `k` rewards of mean `mean` and unbiased variance `var` (module docstring); the
    plain `var` when `floor` is None or its pseudo-count is 0."""
    var = max(var, 0.0)
    if floor is None or floor.pseudo_count == 0 or k < 1:
        return var
    r = floor.span
    p = min(1.0, max(0.0, (k * (mean - floor.lo) / r + 1) / (k + 2)))
    a = floor.pseudo_count
    return ((k - 1) * var + a * r * r * p * (1 - p)) / (k - 1 + a)


@dataclass(frozen=True)
class Fusion:
    """One prompt's fused baseline: `mu`, the weight `w` of the group mean, the positive-part
    estimate `d2` of the prior's squared bias, the noise `s2 / k`, and the MSE at `w`."""

    mu: float
    w: float
    d2: float
    noise: float
    mse: float


def fuse(mean: float, var: float, k: int, prior: float | None) -> Fusion:
    """The fused baseline of a prompt with `k` rollouts of mean `mean` and empirical variance
    `var` (module docstring). `prior=None`: the group mean, w = 1, D^2 unknown (inf)."""
    if k < 1:
        raise ValueError(f"a fused baseline needs k >= 1 rollouts, got {k}")
    noise = max(var, 0.0) / k
    if prior is None:
        return Fusion(mean, 1.0, float("inf"), noise, noise)
    d2 = max(0.0, (mean - prior) ** 2 - noise)
    w = d2 / (d2 + noise) if d2 + noise > 0 else 0.0  # no bias and no noise: m == V, either will do
    return Fusion(w * mean + (1 - w) * prior, w, d2, noise, mse(d2, var, k))


def mse(d2: float, var: float, k: int) -> float:
    """MSE of the fused baseline at the optimal weight: D^2 (s^2/k) / (D^2 + s^2/k); s^2/k when
    D^2 is unknown (inf: no prior, the group mean alone)."""
    noise = max(var, 0.0) / k
    if d2 == float("inf"):
        return noise
    return d2 * noise / (d2 + noise) if d2 + noise > 0 else 0.0


def fused_baselines(
    rewards: torch.Tensor,
    uids: Sequence[str],
    prior: Mapping[str, float | None] | None,
    *,
    rows: torch.Tensor | None = None,
    floor: NoiseFloor | None = None,
) -> tuple[torch.Tensor, dict[str, Fusion]]:
    """Per-sample fused baselines `[B]` and each prompt's `Fusion`, from the statistics of each
    group's `rows` (the policy's rollouts; all rows when None) with the variance `floor`. A group
    without a counted row takes its prior as baseline, or gets advantage 0 without one (it is left
    out of the returned `Fusion`s)."""
    check_rewards(rewards, uids)
    _, count, mean = group_stats(rewards, uids, rows)
    var = group_std(rewards, uids, rows) ** 2
    prior = prior or {}
    per: dict[str, Fusion] = {}
    base: list[float] = []
    for i, u in enumerate(uids):
        k = int(count[i])
        if k == 0:
            v = prior.get(u)
            base.append(float(rewards[i]) if v is None else float(v))
            continue
        if u not in per:
            m = float(mean[i])
            per[u] = fuse(m, floored_variance(m, float(var[i]), k, floor), k, prior.get(u))
        base.append(per[u].mu)
    return torch.tensor(base, dtype=rewards.dtype, device=rewards.device), per


def fusion_stats(per: Mapping[str, Fusion]) -> dict[str, float]:
    """Logged figures: mean weight of the group mean, share of prompts whose prior was rejected
    (D^2 > 0), mean MSE of the baselines, and share of prompts whose noise was 0 (only with
    `var_pseudo_count: 0` and all rewards equal: then any deviation from the prior rejects it and
    the budget adds nothing; without the floor most rejections on the demo's warm start at k=4 are
    these)."""
    if not per:
        return {}
    fs = list(per.values())
    return {
        "v05/w_mean": sum(f.w for f in fs) / len(fs),
        "v05/prior_rejected_frac": sum(f.d2 > 0 for f in fs) / len(fs),
        "v05/baseline_mse": sum(f.mse for f in fs) / len(fs),
        "v05/zero_variance_frac": sum(f.noise == 0 for f in fs) / len(fs),
    }
