"""Token-level losses over multi-turn trajectories: clipped policy-gradient surrogate, KL to the
reference policy, entropy, and the aggregation modes that turn `[B, T]` into a scalar.

All functions take a loss mask `[B, T]` (1 = token the model produced, 0 = environment or
padding token). Masked positions contribute nothing to any loss and receive exactly zero
gradient, whatever garbage the log-prob tensors hold there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pvpo.registry import Registry
from pvpo.trainer.algorithms.spec import AGGREGATION_MODES, check_aggregation

# ---------------------------------------------------------------------------------------------
# Aggregation


def _token_mean(values: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    lengths = mask.sum(dim=-1)
    seq = (values * mask).sum(dim=-1) / lengths.clamp(min=1)
    has_tokens = (lengths > 0).to(values.dtype)
    return (seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def _seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    norm = float(norm_len if norm_len is not None else mask.shape[-1])
    if norm <= 0:
        raise ValueError(f"norm_len must be positive, got {norm_len}")
    return ((values * mask).sum(dim=-1) / norm).mean()


Aggregator = Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
AGGREGATORS: Registry[Aggregator] = Registry("loss aggregation")  # the modes of spec.AGGREGATION_MODES
for _mode, _fn in zip(AGGREGATION_MODES, (_token_mean, _seq_mean_token_mean, _seq_mean_token_sum_norm), strict=True):
    AGGREGATORS.register(_mode, _fn)


def check_dual_clip(dual_clip: float | None) -> float | None:
    """`dual_clip` if it is None (off) or > 1 (Ye et al. 2020's bound); ValueError otherwise."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or null: off), got {dual_clip}")
    return dual_clip


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_len: int | None = None) -> torch.Tensor:
    """Reduce per-token `values [B, T]` under `mask [B, T]` to a scalar.

    - `token-mean`: sum over masked tokens / number of masked tokens.
    - `seq-mean-token-mean`: mean over sequences (with >= 1 masked token) of each sequence's token mean.
    - `seq-mean-token-sum-norm`: each sequence's masked sum / `norm_len` (default T), mean over B.
    """
    agg = AGGREGATORS.get(check_aggregation(mode))
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask.to(values.dtype)
    # where() instead of a bare product: a NaN/inf at a masked position must not leak (0 * inf = nan)
    return agg(torch.where(m > 0, values, torch.zeros_like(values)), m, norm_len)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask > 0
    return float(values[m].mean()) if m.any() else 0.0


# ---------------------------------------------------------------------------------------------
# Policy loss


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_len: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, per token, aggregated under `mask` with mode `agg`.

    ratio = exp(logprobs - old_logprobs); loss = max(-A * ratio, -A * clip(ratio, 1-clip_low,
    1+clip_high)). With `dual_clip = c > 1` (Ye et al. 2020), the loss of negative-advantage
    tokens is further capped at `c * |A|`. `is_weights` (e.g. truncated importance weights of a
    vLLM sampler) multiply the per-token loss and are treated as constants. `advantages` may be
    per trajectory `[B]` or per token `[B, T]`.

    Returns `(loss, stats)`; stats over masked tokens: `clip_frac` (tokens whose clipped term is
    active), `dual_clip_frac`, `approx_kl` (k1 estimate of KL(old || new)), `ratio_mean`, `ratio_max`.
    """
    check_dual_clip(dual_clip)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError(
            "shape mismatch: logprobs {}, old_logprobs {}, advantages {}, mask {}".format(
                *(tuple(t.shape) for t in (logprobs, old_logprobs, advantages, mask))
            )
        )
    valid = mask > 0
    adv = advantages.detach().to(logprobs.dtype)
    # masked positions get log-ratio 0 through where(), so their gradient is exactly zero;
    # the clamp (as verl does) keeps exp() finite for wildly off-policy tokens
    log_ratio = torch.where(valid, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    log_ratio = log_ratio.clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(valid)
    if dual_clip is not None:
        cap = -adv * dual_clip  # = dual_clip * |A| where A < 0
        dual_active = (adv < 0) & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    if is_weights is not None:
        if is_weights.shape != loss.shape:
            raise ValueError(f"is_weights {tuple(is_weights.shape)} must match {tuple(loss.shape)}")
        loss = loss * is_weights.detach().to(loss.dtype)
    pg = aggregate(loss, mask, agg, norm_len=norm_len)
    with torch.no_grad():
        r = ratio.detach()
        stats = {
            "pg_loss": float(pg.detach()),
            "clip_frac": _masked_mean((clipped > unclipped).to(r.dtype), mask),
            "dual_clip_frac": _masked_mean(dual_active.to(r.dtype), mask),
            "approx_kl": _masked_mean(-log_ratio.detach(), mask),
            "ratio_mean": _masked_mean(r, mask),
            "ratio_max": float(r[valid].max()) if valid.any() else 0.0,
        }
    return pg, stats


# ---------------------------------------------------------------------------------------------
# KL penalty


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # Schulman's unbiased, always-positive estimator, with x = ref - lp: exp(x) - x - 1.
    # Clamps follow verl's "low_var_kl": x in [-20, 20] keeps exp finite; the result in
    # [-10, 10] bounds the gradient of tokens where the policies disagree wildly.
    x = (-log_ratio).clamp(-20.0, 20.0)
    return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("KL estimator")
KL_ESTIMATORS.register("k1", _k1)
KL_ESTIMATORS.register("k2", _k2)
KL_ESTIMATORS.register("k3", _k3)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate `[B, T]` of KL(pi || pi_ref) from sampled-token log-probs (Schulman 2020):
    k1 = lp - ref, k2 = (lp - ref)^2 / 2, k3 = exp(ref - lp) - (ref - lp) - 1 (clamped as verl does).
    The reference log-probs are constants. Aggregate with the same mask and mode as the pg loss.

    As a loss on tokens sampled from pi, each is differentiated through lp only, and its expected
    gradient is not the same KL's: k1's is E[grad lp] = 0 (the config refuses it as a penalty:
    it does nothing); k2's is E[(lp - ref) grad lp], the reverse KL(pi || pi_ref)'s gradient; k3's
    (verl's `low_var_kl`) is E[(1 - pi_ref / pi) grad lp] = -sum pi_ref grad lp, the forward
    KL(pi_ref || pi)'s gradient, a biased estimate of the reverse KL's (a two-action example:
    `tests/test_trainer_algorithms_kl_gradients.py`)."""
    fn = KL_ESTIMATORS.get(kind)  # UnknownNameError (a ValueError) listing the estimators
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref {tuple(ref_logprobs.shape)} differ")
    return fn(logprobs - ref_logprobs.detach())


# ---------------------------------------------------------------------------------------------
# Log-probs and entropy from logits


# elements of one chunk's float32 [b, t, V] slice: 2^25 floats = 128 MiB, whatever the vocabulary
CHUNK_ELEMENTS = 1 << 25


def _chunks(shape: torch.Size, chunk_size: int | None) -> list[slice]:
    """Slices along dim 1 of `chunk_size` positions each (default: as many as fit CHUNK_ELEMENTS
    over the batch and vocabulary)."""
    if chunk_size is None:
        chunk_size = max(1, CHUNK_ELEMENTS // max(1, shape[0] * shape[-1]))
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return [slice(s, s + chunk_size) for s in range(0, shape[1], chunk_size)]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / temperature` in float32 (float32 logits at temperature 1 as they are: a view)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def _per_chunk(fn: Callable[[torch.Tensor], torch.Tensor], chunk: torch.Tensor) -> torch.Tensor:
    """`fn(chunk)`, through activation checkpointing when it builds a graph: the backward keeps only
    the chunk's logits (a view of the model's), not its float32 / softmax intermediates, so a
    chunked pass holds one chunk's `[b, t, V]` temporaries at a time in the backward too."""
    if torch.is_grad_enabled() and chunk.requires_grad:
        from torch.utils.checkpoint import checkpoint

        out = checkpoint(fn, chunk, use_reentrant=False)
        assert isinstance(out, torch.Tensor)
        return out
    return fn(chunk)


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability `[B, T]` (float32) of `token_ids [B, T]` under `logits [B, T, V] / temperature`,
    the distribution the sampler drew from: `logit[id] - logsumexp(logits)` in float32, a chunk of
    positions at a time (see `_chunks`, `_per_chunk`), so no `[B, T, V]` float32 log-softmax is
    ever held, in the forward or the backward (a selective log-softmax).

    With `mask [B, T]`, only the positions where it is non-zero are computed (the same floats as
    without it) and the others are 0: a multi-turn response is mostly env tokens (the recipe's:
    ~180 model tokens of ~590), whose vocabulary-wide softmax and its backward no loss uses."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match token_ids {tuple(token_ids.shape)}")
    if mask is not None:
        return _at_mask(
            lambda x, ids: token_logprobs(x, ids, temperature, chunk_size=chunk_size), logits, mask, token_ids
        )
    out = []
    for sl in _chunks(logits.shape, chunk_size):
        ids = token_ids[:, sl].long().unsqueeze(-1)

        def lp(x: torch.Tensor, ids: torch.Tensor = ids) -> torch.Tensor:
            z = _scaled(x, temperature)
            return z.gather(-1, ids).squeeze(-1) - torch.logsumexp(z, dim=-1)

        out.append(_per_chunk(lp, logits[:, sl]))
    return torch.cat(out, dim=1) if out else logits.new_zeros(token_ids.shape, dtype=torch.float32)


def _at_mask(
    compute: Callable[..., torch.Tensor], logits: torch.Tensor, mask: torch.Tensor, *per_position: torch.Tensor
) -> torch.Tensor:
    """`compute(logits, *per_position)` (a per-position float32 `[B, T]`; `per_position`: `[B, T]`
    tensors such as the token ids) at the positions where `mask` is non-zero, gathered into one
    row, 0 elsewhere: the same floats at those positions, since each position's value depends on
    its own logits only. Without such a position, every position (the graph a zero-weight
    micro-batch's backward needs, times 0)."""
    if mask.shape != logits.shape[:-1]:
        raise ValueError(f"mask {tuple(mask.shape)} does not match the logits' positions {tuple(logits.shape[:-1])}")
    rows, cols = (mask > 0).nonzero(as_tuple=True)
    if len(rows) == 0:
        return compute(logits, *per_position) * 0.0
    picked = compute(logits[rows, cols].unsqueeze(0), *(t[rows, cols].unsqueeze(0) for t in per_position)).squeeze(0)
    out = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((rows, cols), picked)


def _entropy(z: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Entropy `[B, T]` (float32) of softmax(logits [B, T, V] / temperature), the distribution the
    sampler drew from: `logsumexp(z) - sum(softmax(z) * z)`, in float32, a chunk of positions at
    a time (as `token_logprobs`). With `mask [B, T]`, only the positions where it is non-zero are
    computed (the same floats as without it), 0 elsewhere, as `token_logprobs(mask=)`."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if mask is not None:
        return _at_mask(lambda x: entropy_from_logits(x, temperature, chunk_size=chunk_size), logits, mask)
    out = []
    for sl in _chunks(logits.shape, chunk_size):
        out.append(_per_chunk(lambda x: _entropy(_scaled(x, temperature)), logits[:, sl]))
    return torch.cat(out, dim=1) if out else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Combined objective


@dataclass(frozen=True)
class LossConfig:
    """The objective's settings; validated on construction, so a config loader fails early.

    total = pg_loss + kl_coef * KL(pi || pi_ref) - entropy_coef * entropy, all aggregated by `agg`.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg: str = "token-mean"
    norm_len: int | None = None
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        check_aggregation(self.agg)
        KL_ESTIMATORS.get(self.kl_kind)
        check_dual_clip(self.dual_clip)
        if self.clip_low < 0 or self.clip_high < 0 or self.clip_low >= 1:
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Same as `total_loss` with this config's settings."""
        return total_loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            self,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            is_weights=is_weights,
        )


def total_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """pg loss + kl_coef * KL - entropy_coef * entropy, each aggregated with `cfg.agg` and `mask`.

    `ref_logprobs` is required when `cfg.kl_coef != 0`; `entropy` (`[B, T]`, e.g. from
    `entropy_from_logits`) when `cfg.entropy_coef != 0`. When given with a zero coefficient they
    are still reported. Stats: loss, pg_loss, kl, entropy, clip_frac, and the policy_loss stats.
    """
    pg, stats = policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
        agg=cfg.agg,
        norm_len=cfg.norm_len,
        is_weights=is_weights,
    )
    loss = pg
    if cfg.kl_coef != 0 and ref_logprobs is None:
        raise ValueError("kl_coef is non-zero but no ref_logprobs were given")
    if cfg.entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef is non-zero but no entropy was given")
    if ref_logprobs is not None:
        kl = aggregate(kl_penalty(logprobs, ref_logprobs, cfg.kl_kind), mask, cfg.agg, norm_len=cfg.norm_len)
        if cfg.kl_coef != 0:
            loss = loss + cfg.kl_coef * kl
        stats["kl"] = float(kl.detach())
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.agg, norm_len=cfg.norm_len)
        if cfg.entropy_coef != 0:
            loss = loss - cfg.entropy_coef * ent
        stats["entropy"] = float(ent.detach())
    stats["loss"] = float(loss.detach())
    return loss, stats
