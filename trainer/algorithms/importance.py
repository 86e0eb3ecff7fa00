"""Correction for the mismatch between the sampler's log-probs and the trainer's.

vLLM samples with its own kernels (and often another dtype), so the log-prob it reports for a
sampled token differs from the one the trainer recomputes with the same weights. The policy
gradient then uses off-policy samples; truncated importance sampling (TIS, as in TRL and verl)
reweights each model token by `w = min(exp(lp_train_old - lp_sampler), C)`. The mismatch itself
is logged so a drifting engine is visible.

The same weight is AReaL's behaviour weight (Fu et al. 2025, arXiv:2505.24298: the
decoupled PPO objective) when the sampler ran an older policy version (`rollout.max_staleness`):
`lp_train_old` is the proximal policy pi_prox (the weights the update starts from), `lp_sampler`
the behaviour policy pi_behav (the version that sampled the token, on its engine), and

    J(theta) = E[ w_t * min(u_t * A_t, clip(u_t, 1 - eps_low, 1 + eps_high) * A_t) ],
    u_t = pi_theta / pi_prox,   w_t = pi_prox / pi_behav (clamped at C),

so the clip bounds the step from pi_prox whatever the staleness, and `w` alone carries the
off-policy correction. The clamp either truncates `w` at C (`mode="truncate"`, TIS) or drops the
tokens above C (`mode="mask"`: weight 0, as AReaL's `behav_imp_weight_cap` filters them).
"""

from __future__ import annotations

import math

import torch

CLAMP_MODES = ("truncate", "mask")  # what the weight's cap does above it: truncate to it, or drop the token


def truncated_importance_weights(
    train_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
    mode: str = "truncate",
) -> torch.Tensor:
    """Per-token `min(exp(train - sampler), cap)` on model tokens (mask 1), 0 elsewhere; with
    `mode="mask"`, 0 instead of `cap` where the ratio exceeds `cap`.

    `train_logprobs` are the trainer's log-probs of the sampled tokens under the weights the
    update starts from (no gradient flows through the weights)."""
    if train_logprobs.shape != sampler_logprobs.shape or train_logprobs.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(train_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if mode not in CLAMP_MODES:
        raise ValueError(f"unknown clamp mode {mode!r}; known: {', '.join(CLAMP_MODES)}")
    keep = mask.bool()
    diff = train_logprobs.detach() - sampler_logprobs.detach()
    # Padding positions may hold anything (even -inf - -inf = nan): zero them before exp.
    diff = torch.where(keep, diff, torch.zeros_like(diff))
    if mode == "mask":
        keep = keep & (diff <= math.log(cap))
    diff = diff.clamp(max=math.log(cap))
    return torch.where(keep, torch.exp(diff), torch.zeros_like(diff))


def logprob_mismatch(
    train_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Metrics over model tokens: mean and max |lp_sampler - lp_train|, the mean token-level
    importance ratio exp(train - sampler) before truncation, and the token count."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"mismatch/abs_mean": 0.0, "mismatch/abs_max": 0.0, "mismatch/ratio_mean": 1.0, "mismatch/tokens": 0.0}
    diff = (train_logprobs.detach() - sampler_logprobs.detach()).float()[m]
    return {
        "mismatch/abs_mean": float(diff.abs().mean()),
        "mismatch/abs_max": float(diff.abs().max()),
        "mismatch/ratio_mean": float(torch.exp(diff).mean()),
        "mismatch/tokens": float(n),
    }


def truncated_fraction(
    train_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> float:
    """Fraction of model tokens whose importance ratio exceeds `cap` (was truncated)."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return 0.0
    ratio = torch.exp((train_logprobs.detach() - sampler_logprobs.detach()).float()[m])
    return float((ratio > cap).float().mean())
