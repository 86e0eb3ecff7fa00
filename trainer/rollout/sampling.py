"""Logit filters and forward keywords the transformers engine and its continuous-batching
scheduler both sample with (top-k, top-p, last-position-only logits): one module below both, so
neither imports the other."""

from __future__ import annotations

from typing import Any

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf the logits outside the smallest set whose probability reaches `top_p`."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token that crosses
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set to -inf the logits below the `top_k`-th largest of each row (`top_k <= 0`: none)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def last_logits_only(model: Any) -> dict[str, int]:
    """`{"logits_to_keep": 1}` where the model's forward takes it: a prefill then projects only its
    last position onto the vocabulary, not a `[b, prompt, V]` tensor (SmolLM2, 3k-token context:
    590 MB of float32 logits a row)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}
