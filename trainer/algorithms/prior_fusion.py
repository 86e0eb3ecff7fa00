"""V0.5's fused baseline: a value prior shrunk towards the group mean (Zhang et al. 2026,
arXiv:2603.10848, Sec. 3).

For a prompt with k rollouts of mean m and empirical variance s^2, and a prior value V:

    mu = w * m + (1 - w) * V,    w* = D^2 / (D^2 + s^2 / k),

the weight that minimises the baseline's MSE when the prior is off by D. D^2 is estimated by the
positive-part rule, D^2 = max(0, (m - V)^2 - s^2 / k): the squared deviation minus what sampling
noise alone explains, i.e. the prior is trusted fully (w = 0) unless the rollouts reject it. At w*
the MSE is D^2 (s^2/k) / (D^2 + s^2/k); the adaptive budget (`adaptive_budget.py`) reads it.

s^2 is the unbiased empirical variance of the k rewards: our rewards live in [0, 1] (PVPO's
0.1 format floor, F1), not the paper's {-1, +1}, so no Bernoulli formula applies. A prompt
without a prior (an empty value model) uses its group mean (w = 1). Advantage = r - mu, with no
std normalisation (the baseline is the point).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pvpo.trainer.algorithms.groups import check_rewards, group_stats, group_std


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
    rewards: torch.Tensor, uids: Sequence[str], prior: Mapping[str, float | None] | None
) -> tuple[torch.Tensor, dict[str, Fusion]]:
    """Per-sample fused baselines `[B]` and each prompt's `Fusion`."""
    check_rewards(rewards, uids)
    _, count, mean = group_stats(rewards, uids)
    var = group_std(rewards, uids) ** 2
    prior = prior or {}
    per: dict[str, Fusion] = {}
    for i, u in enumerate(uids):
        if u not in per:
            per[u] = fuse(float(mean[i]), float(var[i]), int(count[i]), prior.get(u))
    base = torch.tensor([per[u].mu for u in uids], dtype=rewards.dtype, device=rewards.device)
    return base, per


def fusion_stats(per: Mapping[str, Fusion]) -> dict[str, float]:
    """Logged figures: mean weight of the group mean, share of prompts whose prior was rejected
    (D^2 > 0), mean MSE of the baselines, and share of prompts whose rewards were all equal
    (s^2 = 0: any deviation from the prior rejects it and the budget adds nothing; on the demo's
    warm start at k=4 most rejections are these, see the issue-15 report)."""
    if not per:
        return {}
    fs = list(per.values())
    return {
        "v05/w_mean": sum(f.w for f in fs) / len(fs),
        "v05/prior_rejected_frac": sum(f.d2 > 0 for f in fs) / len(fs),
        "v05/baseline_mse": sum(f.mse for f in fs) / len(fs),
        "v05/zero_variance_frac": sum(f.noise == 0 for f in fs) / len(fs),
    }
