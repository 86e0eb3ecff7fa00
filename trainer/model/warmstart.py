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


def _draw(order: list[int], n: int, batch_size: int, steps: int, rng: random.Random) -> list[list[int]]:
    """`steps` batches of `batch_size` indices taken off the front of `order`, a fresh permutation
    of range(n) (drawn from `rng`) appended whenever fewer than `batch_size` are left."""
    batches = []
    for _ in range(steps):
        if len(order) < batch_size:
            fresh = list(range(n))
            rng.shuffle(fresh)
            order += fresh
        batches.append(order[:batch_size])
        order = order[batch_size:]
    return batches


def sft_batches(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The trajectory indices of each of a warm start's `steps` steps over `n` trajectories:
    epochs of a `random.Random(seed)` permutation, `batch_size` at a time."""
    return _draw([], n, batch_size, steps, random.Random(seed))


def continued_batches(
    n: int, batch_size: int, steps: int, *, seed: int, first_steps: int, first_seed: int
) -> list[list[int]]:
    """The batches of a warm start continued for `steps` more steps over the same `n` trajectories
    after a first one of `first_steps` steps with data-order seed `first_seed` (`sft_batches`):
    first the trajectories the first one never drew, then whole epochs, each shuffled with the
    continuation's own data-order `seed`."""
    seen = {i for batch in sft_batches(n, batch_size, first_steps, first_seed) for i in batch}
    rng = random.Random(seed)
    fresh = [i for i in range(n) if i not in seen]
    rng.shuffle(fresh)
    return _draw(fresh, n, batch_size, steps, rng)


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
    batches: Sequence[Sequence[int]] | None = None,
) -> list[float]:
    """`steps` AdamW steps of SFT on `trajs` (shuffled with `seed`: `sft_batches`), `max_tokens`
    padded tokens a micro-batch (see `sft_backward`); returns the loss per step. `batches`, when
    given, are the steps' trajectory indices instead (`continued_batches`: a warm start continued
    on the trajectories an earlier one left unseen); `seed` is then unused."""
    if batches is None:
        batches = sft_batches(len(trajs), batch_size, steps, seed)
    elif len(batches) != steps:
        raise ValueError(f"warm start: {len(batches)} batches given for {steps} steps")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.05, 1 - s / steps)
    )
    model.train()
    losses = []
    bar = Progress(batches, desc="warm start (SFT on GT)", unit="step", enabled=show_progress)
    for idx in bar:
        opt.zero_grad(set_to_none=True)
        loss = sft_backward(model, [trajs[i] for i in idx], pad_id, max_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step_optimizer(opt)
        sched.step()
        losses.append(loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses
