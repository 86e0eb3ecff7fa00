"""Supervised warm start: cross-entropy on the model turns of given trajectories (env tokens
masked), e.g. the synthetic world's oracle trajectories replayed through the env against the real
retriever (`pvpo.trainer.rollout.replay`), or a QA dataset's own GT (`dataset` GT source). A random tiny model needs this to write any
well-formed answer at all."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from pvpo.progress import Progress
from pvpo.trainer.model.device import step_optimizer
from pvpo.trainer.model.memory import checkpointing_enabled, default_max_tokens
from pvpo.trainer.model.micro_batch import accumulate, micro_batches
from pvpo.trainer.rollout.trajectory import Batch, Trajectory, collate, response_logits


def sft_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Mean negative log-likelihood of the model tokens (loss mask 1) of `batch`."""
    from pvpo.trainer.algorithms.losses import aggregate, token_logprobs

    logp = token_logprobs(response_logits(model, batch), batch.response_ids, mask=batch.loss_mask)
    return -aggregate(logp, batch.loss_mask, "token-mean")


def sft_backward(model: torch.nn.Module, trajs: Sequence[Trajectory], pad_id: int, max_tokens: int | None) -> float:
    """Backward of the token-mean NLL of `trajs`, a micro-batch of at most `max_tokens` padded
    tokens at a time (the trainer's default budget when None: a real vocabulary's logits and a
    batch of 1k-token GT trajectories do not fit in one pass); returns the loss."""
    device = next(model.parameters()).device
    batch = collate(trajs, pad_id).to(device)
    if max_tokens is None:
        ckpt = checkpointing_enabled(model)
        max_tokens = default_max_tokens(model, device, checkpointing=ckpt, seq_len=batch.input_ids.shape[1])
    # one pass when it fits: the same floats as before budgets (trimmed micro-batches round
    # differently, and the 40-step demo test's held-out EM moved from 0.327 to 0.244 with them)
    if max_tokens is None or batch.input_ids.numel() <= max_tokens:
        whole = sft_loss(model, batch)
        whole.backward()
        return float(whole.detach())
    micros = micro_batches(batch, list(range(len(batch))), agg="token-mean", max_tokens=max_tokens)
    loss, _ = accumulate(micros, lambda mb: (sft_loss(model, mb.batch), {}))
    return loss


def warm_start(
    model: torch.nn.Module,
    trajs: Sequence[Trajectory],
    pad_id: int,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    max_tokens: int | None = None,
    show_progress: bool = True,
) -> list[float]:
    """`steps` AdamW steps of SFT on `trajs` (shuffled with `seed`), `max_tokens` padded tokens a
    micro-batch (see `sft_backward`); returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.05, 1 - s / steps)
    )
    model.train()
    order: list[int] = []
    losses = []
    bar = Progress(range(steps), desc="warm start (SFT on GT)", unit="step", enabled=show_progress)
    for _ in bar:
        if len(order) < batch_size:
            fresh = list(range(len(trajs)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:batch_size], order[batch_size:]
        opt.zero_grad(set_to_none=True)
        loss = sft_backward(model, [trajs[i] for i in idx], pad_id, max_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step_optimizer(opt)
        sched.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses
