"""Correction for the mismatch between the sampler's log-probs and the trainer's.

vLLM samples with its own kernels (and often another dtype), so the log-prob it reports for a
sampled token differs from the one the trainer recomputes with the same weights. The policy
gradient then uses off-policy samples; truncated importance sampling (TIS, as in TRL and verl)
reweights each model token by `w = min(exp(lp_train_old - lp_sampler), C)`. The mismatch itself
is logged so a drifting engine is visible.
"""

from __future__ import annotations

import math

import torch


def truncated_importance_weights(
    train_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
) -> torch.Tensor:
    """Per-token `min(exp(train - sampler), cap)` on model tokens (mask 1), 0 elsewhere.

    `train_logprobs` are the trainer's log-probs of the sampled tokens under the policy that
    sampled them (no gradient flows through the weights)."""
    if train_logprobs.shape != sampler_logprobs.shape or train_logprobs.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(train_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    keep = mask.bool()
    diff = train_logprobs.detach() - sampler_logprobs.detach()
    # Padding positions may hold anything (even -inf - -inf = nan): zero them before exp.
    diff = torch.where(keep, diff, torch.zeros_like(diff)).clamp(max=math.log(cap))
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
