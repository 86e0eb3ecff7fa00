"""One policy update over one rollout batch: PPO epochs x mini-batches x gradient accumulation.

The per-token log-probs are recomputed under the sampling temperature, the loss (clipped
surrogate + KL to the frozen reference + entropy bonus) is masked by the loss mask, so env and
padding tokens contribute nothing, and the engine receives the new weights after every
optimizer step.

Before the first optimizer step the trainer's own log-probs of the sampled tokens are known
(`lp_train_old`) and compared with the sampler's (`mismatch/*` stats, whatever the engine). With
one epoch of one mini-batch (the default, on-policy GRPO / PVPO), every micro-batch's forward runs
before the only optimizer step, so `lp_train_old` is that forward's own detached log-probs and no
separate no-grad pass is made (TRL's GRPO does the same when `num_iterations == 1`); otherwise one
no-grad pass computes it first.
With importance correction on, `lp_train_old` is the PPO ratio's denominator and each token's loss
is weighted by the truncated ratio `min(exp(lp_train_old - lp_sampler), cap)` (TRL's
`vllm_importance_sampling_correction`, verl's `tis_imp_ratio_cap`). With rollouts from older policy
versions (`rollout.max_staleness > 0`) the correction is always on and is AReaL's decoupled
objective: `lp_train_old` is the proximal policy, the sampler's log-probs the behaviour policy
(`algorithms/importance.py`). Injected GT trajectories (`batch.is_gt`) keep their own denominator
(pi_gt, in `old_logprobs`) and weight 1: their ratio is pi_theta / pi_gt, clipped, unweighted.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pvpo.progress import Progress
from pvpo.trainer.algorithms.advantages import broadcast_to_tokens
from pvpo.trainer.algorithms.importance import logprob_mismatch, truncated_fraction, truncated_importance_weights
from pvpo.trainer.algorithms.losses import CHUNK_ELEMENTS, LossConfig, entropy_from_logits, token_logprobs
from pvpo.trainer.config.schema import ImportanceCorrectionConfig, OptimConfig, RolloutConfig
from pvpo.trainer.model.device import step_optimizer
from pvpo.trainer.model.memory import check_fits, checkpointing_enabled, default_max_tokens
from pvpo.trainer.model.micro_batch import MicroBatch, accumulate, batch_forward, micro_batches
from pvpo.trainer.parallel.distributed import all_reduce_min, clip_grad_norm
from pvpo.trainer.rollout.trajectory import Batch, Trajectory, collate, response_logits


class WeightsReceiver(Protocol):
    """What the update hands the new weights to after each optimizer step (a rollout engine)."""

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def importance_for(rollout: RolloutConfig) -> ImportanceCorrectionConfig:
    """The importance correction an update applies: `rollout.importance_correction`, always on
    when rollouts run ahead of the update (`max_staleness > 0`: AReaL's decoupled objective, its
    behaviour weight pi_prox / pi_behav clamped as the section says) unless `rollout.decoupled` is
    false (naive PPO against the stale sampler's log-probs: the ablation of Fu et al. 2025)."""
    ic = rollout.importance_correction
    return ic.model_copy(update={"enabled": True}) if rollout.max_staleness > 0 and rollout.decoupled else ic


def loss_config(optim: OptimConfig, *, default_agg: str = "token-mean", norm_len: int | None = None) -> LossConfig:
    """The objective of `optim`: its `loss_agg`, or `default_agg` (the estimator's own) when unset;
    `seq-mean-token-sum-norm` divides by `optim.loss_norm_len`, else `norm_len` (the run's
    response budget), a constant as Dr.GRPO requires."""
    return LossConfig(
        clip_low=optim.clip_low,
        clip_high=optim.clip_high,
        dual_clip=optim.dual_clip,
        agg=optim.loss_agg or default_agg,
        norm_len=optim.loss_norm_len or norm_len,
        kl_coef=optim.kl_coef,
        kl_kind=optim.kl_estimator,
        entropy_coef=optim.entropy_coef,
    )


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float, micro: int = 16, max_tokens: int | None = None
) -> torch.Tensor:
    """Log-probs `[B, R]` of the response's model tokens (loss mask 1) under `model` (the frozen
    reference, or the policy before its update), without gradient, `micro` rows and at most
    `max_tokens` padded tokens at a time (0 at env tokens and beyond each row's response)."""
    batch = batch.to(next(model.parameters()).device)
    return batch_forward(
        batch,
        lambda sub: token_logprobs(response_logits(model, sub), sub.response_ids, temperature, mask=sub.loss_mask),
        max_tokens=max_tokens,
        max_rows=micro,
    )


def reference_logprobs(
    ref_model: torch.nn.Module, model: torch.nn.Module, trajs: list[Trajectory], pad_id: int, cfg: Any
) -> None:
    """Set each trajectory's `old_logprobs` (pi_gt) to `ref_model`'s at the rollout temperature
    (`cfg`: the run's `TrainConfig`), 0 on env tokens, in micro-batches of the update's token
    budget for `model`."""
    batch = collate(trajs, pad_id)
    budget = update_token_budget(model, cfg.optim, batch.input_ids.shape[1])
    lp = batch_logprobs(ref_model, batch, cfg.rollout.temperature, max_tokens=budget)
    for i, t in enumerate(trajs):
        n = len(t.response_ids)
        t.old_logprobs = [float(x) if m else 0.0 for x, m in zip(lp[i, :n].tolist(), t.loss_mask, strict=True)]


def update_token_budget(model: torch.nn.Module, optim: OptimConfig, seq_len: int) -> int | None:
    """The padded tokens a micro-batch of rows up to `seq_len` long may hold in an update:
    `optim.max_tokens_per_micro_batch`, else (without gradient accumulation) `default_max_tokens`
    from the model's shape and the memory free; None = by row count. No-gradient passes over the
    same batch (the reference's log-probs) take the same budget."""
    if optim.max_tokens_per_micro_batch is not None or optim.grad_accum != 1:
        return optim.max_tokens_per_micro_batch
    device = next(model.parameters()).device
    return default_max_tokens(model, device, checkpointing=checkpointing_enabled(model), seq_len=seq_len)


def micro_batch_loss(
    model: torch.nn.Module,
    batch: Batch,
    advantages: torch.Tensor,
    loss_cfg: LossConfig,
    *,
    temperature: float,
    ref_logprobs: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    denominator: Callable[[torch.Tensor], tuple[torch.Tensor | None, torch.Tensor | None]] | None = None,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """(loss, stats, logits) of one micro-batch; `advantages` is `[B]` per trajectory, or `[B, T]`
    per token (PPO's GAE), masked to the model tokens either way.
    `old_logprobs` replaces the batch's sampler log-probs as the ratio denominator. `denominator`,
    when given, is called with this forward's own detached log-probs (the weights that sampled the
    batch, before any optimizer step) and returns the (denominator, importance weights) to use."""
    logits = response_logits(model, batch)
    logp = token_logprobs(logits, batch.response_ids, temperature, mask=batch.loss_mask)  # 0 at env tokens
    if denominator is not None:
        old_logprobs, is_weights = denominator(logp.detach())
    entropy = (
        entropy_from_logits(logits, temperature, mask=batch.loss_mask)  # 0 at env tokens, as logp
        if loss_cfg.entropy_coef
        else logged_entropy(logits, batch.loss_mask, temperature)
    )
    adv_tok = broadcast_to_tokens(advantages.to(logp.dtype), batch.loss_mask)
    old = batch.old_logprobs if old_logprobs is None else old_logprobs
    loss, stats = loss_cfg(
        logp, old, adv_tok, batch.loss_mask, ref_logprobs=ref_logprobs, entropy=entropy, is_weights=is_weights
    )
    if bool(batch.is_gt.any()):
        stats.update(gt_ratio_stats(logp.detach(), batch, loss_cfg.clip_high))
    return loss, stats, logits


@torch.no_grad()
def logged_entropy(logits: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy `[B, T]` for the logs only (no bonus in the loss): computed on the model tokens
    alone, without gradient, 0 elsewhere: no softmax over the vocabulary at padded and env
    positions, and no autograd graph kept for it."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
    rows, cols = (mask > 0).nonzero(as_tuple=True)
    step = max(1, CHUNK_ELEMENTS // max(1, logits.shape[-1]))  # gathered positions at a time, not all at once
    for s in range(0, len(rows), step):
        r, c = rows[s : s + step], cols[s : s + step]
        out[r, c] = entropy_from_logits(logits[r, c].unsqueeze(0), temperature).squeeze(0)
    return out


def gt_ratio_stats(logp: torch.Tensor, batch: Batch, clip_high: float | None = None) -> dict[str, float]:
    """PPO ratio pi_theta / pi_gt over the model tokens of the batch's injected GT trajectories
    (PVPO: the GT source's own probabilities are the denominator); `gt/ratio_mean`, `gt/ratio_max`
    and, given `clip_high`, `gt/above_clip_frac`: the share of those tokens whose ratio is past
    1 + clip_high, which under a positive advantage (a GT row's, usually) give no gradient. pi_gt is
    fixed for the run, so once the policy has raised a GT token that far the row stops teaching it
    (the recipe's lr arm logged GT ratios up to 10^5 in its last steps)."""
    m = (batch.loss_mask > 0) & batch.is_gt.unsqueeze(1)
    if not bool(m.any()):
        return {}
    ratio = torch.exp((logp - batch.old_logprobs).clamp(-20.0, 20.0))[m]
    stats = {"gt/ratio_mean": float(ratio.mean()), "gt/ratio_max": float(ratio.max())}
    if clip_high is not None:
        stats["gt/above_clip_frac"] = float((ratio > 1.0 + clip_high).float().mean())
    return stats


def _sampled(batch: Batch) -> torch.Tensor:
    """The loss mask of the policy's own samples (GT tokens excluded: their denominator is pi_gt)."""
    return batch.loss_mask * (~batch.is_gt).unsqueeze(1).to(batch.loss_mask.dtype)


def mismatch_stats(
    lp_train_old: torch.Tensor, batch: Batch, correction: ImportanceCorrectionConfig | None
) -> dict[str, float]:
    """`mismatch/*`: the trainer's log-probs of `batch`'s sampled tokens before the update against
    the sampler's, and the fraction of tokens the importance cap would truncate."""
    cap = correction.cap if correction is not None else 2.0
    sampled = _sampled(batch)
    return {
        **logprob_mismatch(lp_train_old, batch.old_logprobs, sampled),
        "mismatch/truncated_frac": truncated_fraction(lp_train_old, batch.old_logprobs, sampled, cap=cap),
    }


def importance_denominator(
    lp_train_old: torch.Tensor, batch: Batch, correction: ImportanceCorrectionConfig | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(ratio denominator, per-token weights) for `batch` given the trainer's log-probs of its
    tokens before the update; both None when correction is off (the sampler's log-probs are the
    denominator then)."""
    if correction is None or not correction.enabled:
        return None, None
    gt = batch.is_gt.unsqueeze(1)
    # seam for GT injection: its rows keep pi_gt as denominator and an importance weight of 1
    old = torch.where(gt, batch.old_logprobs, lp_train_old)
    weights = truncated_importance_weights(
        lp_train_old, batch.old_logprobs, _sampled(batch), cap=correction.cap, mode=correction.mode
    )
    weights = torch.where(gt, batch.loss_mask, weights)
    return old, weights


def importance_terms(
    lp_train_old: torch.Tensor, batch: Batch, correction: ImportanceCorrectionConfig | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, float]]:
    """(ratio denominator, per-token weights, mismatch stats) for `batch`: `importance_denominator`
    and `mismatch_stats` together."""
    old, weights = importance_denominator(lp_train_old, batch, correction)
    return old, weights, mismatch_stats(lp_train_old, batch, correction)


def _split(idx: torch.Tensor, parts: int) -> list[torch.Tensor]:
    return [c for c in torch.tensor_split(idx, min(parts, len(idx))) if len(c)]


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    advantages: torch.Tensor,
    optim: OptimConfig,
    *,
    temperature: float,
    seed: int,
    engine: WeightsReceiver | None = None,
    ref_model: torch.nn.Module | None = None,
    importance: ImportanceCorrectionConfig | None = None,
    default_agg: str = "token-mean",
    norm_len: int | None = None,
    separate_old_pass: bool = False,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Run the configured epochs of updates on `batch`; returns the mean of each stat, plus the
    sampler/trainer `mismatch/*` stats and, with `importance.enabled`, the corrected loss.
    `default_agg` / `norm_len`: see `loss_config`. `separate_old_pass`: compute the trainer's
    pre-update log-probs in their own no-grad pass even where the loss pass gives them (a check).
    `progress` (a `pvpo.progress.Progress`) counts the micro-batches as their backward ends."""
    loss_cfg = loss_config(optim, default_agg=default_agg, norm_len=norm_len)
    if loss_cfg.norm_len is None:  # micro-batches are trimmed: keep the batch's width as the constant divisor
        loss_cfg = dataclasses.replace(loss_cfg, norm_len=batch.loss_mask.shape[-1])
    device = next(model.parameters()).device
    batch, advantages = batch.to(device), advantages.to(device)
    ckpt = checkpointing_enabled(model)
    max_tokens = update_token_budget(model, optim, batch.input_ids.shape[1])
    ref_lp = (
        batch_logprobs(ref_model, batch, temperature, max_tokens=max_tokens)
        if ref_model is not None and optim.kl_coef > 0
        else None
    )
    model.train()
    # every rank takes the same number of optimizer steps (FSDP's collectives)
    n_minis = min(optim.mini_batches, all_reduce_min(len(batch)))
    # One epoch of one mini-batch: every forward of the loss pass sees the weights that sampled the
    # batch, so its own log-probs are lp_train_old (filled in as it goes). Measured with SmolLM2 on
    # CPU (docs/benchmarks/training-step.md): the separate no-grad pass cost a third of a step.
    fused = optim.epochs == 1 and n_minis <= 1 and not separate_old_pass
    old_lp: torch.Tensor | None = None
    is_w: torch.Tensor | None = None
    if fused:
        lp_train_old = torch.zeros_like(batch.old_logprobs)
    else:
        lp_train_old = batch_logprobs(model, batch, temperature, max_tokens=max_tokens)  # the weights that sampled
        old_lp, is_w = importance_denominator(lp_train_old, batch, importance)
    inert = inert_rows(advantages, batch.loss_mask) if optim.kl_coef == 0 and optim.entropy_coef == 0 else set()
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, list[float]] = defaultdict(list)
    for _ in range(optim.epochs):
        order = torch.randperm(len(batch), generator=gen)
        for mini in _split(order, n_minis):
            optimizer.zero_grad(set_to_none=True)
            rows = mini.tolist()
            skip = inert & set(rows[1:]) if inert.issuperset(rows) else inert  # one micro-batch at least
            micros = micro_batches(
                batch, rows, agg=loss_cfg.agg, max_tokens=max_tokens, parts=optim.grad_accum, skip=skip
            )
            big = max(micros, key=lambda mb: mb.batch.input_ids.numel()).batch.input_ids
            check_fits(model, device, big.numel(), checkpointing=ckpt, seq_len=big.shape[1])
            if progress is not None and progress.total is None:
                progress.total = len(micros) * n_minis * optim.epochs

            def run(mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
                ix, r = mb.rows, mb.r

                def own(lp: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
                    lp_train_old[ix, :r] = lp
                    return importance_denominator(lp, mb.batch, importance)

                loss, stats, _ = micro_batch_loss(
                    model,
                    mb.batch,
                    advantages[ix] if advantages.dim() == 1 else advantages[ix, :r],
                    loss_cfg,
                    temperature=temperature,
                    ref_logprobs=ref_lp[ix, :r] if ref_lp is not None else None,
                    old_logprobs=old_lp[ix, :r] if old_lp is not None else None,
                    is_weights=is_w[ix, :r] if is_w is not None else None,
                    denominator=own if fused else None,
                )
                if progress is not None:
                    progress.update(1)
                return loss, stats

            mini_loss, micro_stats = accumulate(micros, run)
            for stats in micro_stats:
                for k, v in stats.items():
                    sums[k].append(v)
            sums["loss/mini_batch"].append(mini_loss)  # the loss over the whole mini-batch, all ranks
            sums["grad_norm"].append(clip_grad_norm(list(model.parameters()), optim.grad_clip))
            step_optimizer(optimizer)
            if engine is not None:
                engine.sync_weights(model)
    computed = [i for i in range(len(batch)) if i not in inert] if fused else list(range(len(batch)))
    if len(computed) < len(batch):  # a skipped row's pre-update log-probs were never computed
        mismatch = mismatch_stats(lp_train_old[computed], batch.select(computed), importance)
    else:
        mismatch = mismatch_stats(lp_train_old, batch, importance)
    budget = {"micro_batch/max_tokens": float(max_tokens)} if max_tokens is not None else {}
    skipped = {"update/skipped_rows_frac": len(inert) / max(1, len(batch))}
    return {**{k: sum(v) / len(v) for k, v in sums.items()}, **mismatch, **budget, **skipped}


def inert_rows(advantages: torch.Tensor, loss_mask: torch.Tensor) -> set[int]:
    """Rows whose advantage is 0 on every model token. Without a KL or entropy term their loss,
    the clipped surrogate of A = 0, is 0 whatever the ratio, and so is its gradient: the update
    skips their forward and backward (their tokens still count in the aggregation). Under PVPO
    with Group Sampling most rows of a prompt given a GT trajectory are such rows: a wrong but
    well-formed answer earns the format floor, as the reference's did, so r - anchor = 0."""
    if advantages.dim() == 1:
        zero = advantages == 0
    else:
        zero = ((advantages != 0) & (loss_mask[:, : advantages.shape[1]] > 0)).sum(-1) == 0
    return {int(i) for i in zero.nonzero().flatten().tolist()}
