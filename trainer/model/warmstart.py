"""Supervised warm start: cross-entropy on the model turns of given trajectories (env tokens
masked), e.g. the synthetic world's oracle trajectories replayed through the env against the real
retriever (`pvpo.trainer.rollout.replay`). A random tiny model needs this to write any
well-formed answer at all."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from pvpo.progress import Progress
from pvpo.trainer.rollout.trajectory import Trajectory, collate, response_logits


def sft_loss(model: torch.nn.Module, trajs: Sequence[Trajectory], pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the model tokens (loss mask 1) of `trajs`."""
    from pvpo.trainer.algorithms.losses import aggregate, token_logprobs

    batch = collate(trajs, pad_id).to(next(model.parameters()).device)
    logp = token_logprobs(response_logits(model, batch), batch.response_ids)
    return -aggregate(logp, batch.loss_mask, "token-mean")


def warm_start(
    model: torch.nn.Module,
    trajs: Sequence[Trajectory],
    pad_id: int,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    show_progress: bool = True,
) -> list[float]:
    """`steps` AdamW steps of SFT on `trajs` (shuffled with `seed`); returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.05, 1 - s / steps)
    )
    model.train()
    order: list[int] = []
    losses = []
    bar = Progress(range(steps), desc="warm start (oracle SFT)", unit="step", enabled=show_progress)
    for _ in bar:
        if len(order) < batch_size:
            fresh = list(range(len(trajs)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:batch_size], order[batch_size:]
        loss = sft_loss(model, [trajs[i] for i in idx], pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses
