"""PPO's learned critic: a separate copy of the policy's decoder with a scalar value head, and its
clipped value loss (Schulman et al. 2017, arXiv:1707.06347, as in the PPO2 / verl implementations):

    L_V = 1/2 * mean_t max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)

over the model tokens only: the value at an environment token is never a target (GAE carries the
next model token's value across it, `gae.py`). Rejected: a value head on the policy's own trunk;
it couples the critic's gradient to the policy's and makes critic warm-up steps move the policy.

Under torchrun the critic is sharded with FSDP2 like the policy (`DataParallel.shard`), not
replicated with all-reduced gradients: it is as large as the policy's trunk, and a replica with
its AdamW state on every rank would cost each GPU the memory that sharding the policy saves. So,
as for the policy (`model/micro_batch.py`), every rank runs the same number of forwards (empty
micro-batches weigh 0) and each micro-batch's loss is weighted by its share of the model tokens of
all ranks, so the step is the token-mean loss over the whole batch whatever the world size.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch

from pvpo.trainer.algorithms.data_parallel import SINGLE, DataParallel, pooled_mean_std
from pvpo.trainer.rollout.trajectory import Batch


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    hf: Any = model  # transformers' / peft's API on top of nn.Module
    base = hf.get_base_model() if hasattr(hf, "get_base_model") else hf  # a peft wrapper
    decoder: torch.nn.Module = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    return decoder


class Critic(torch.nn.Module):
    """V(s_t) for each response position: the decoder's hidden state at the position before token
    t (the same position whose logits predict token t) through a linear head."""

    def __init__(self, policy_model: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(_decoder(policy_model)).float()
        self.backbone.requires_grad_(True)
        hf: Any = policy_model
        hidden = int(hf.config.hidden_size)
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)  # V = 0 at start: at lambda 1 a token's advantage is then its return
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Values `[B, R]` (float32) of the response positions of `batch`."""
        out = self.backbone(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        h = out.last_hidden_state[:, batch.prompt_len - 1 : -1]
        # the head's own dtype: FSDP2's mixed precision computes in it (autocast casts in one process)
        return self.head(h.to(self.head.weight.dtype)).float().squeeze(-1)

    @torch.no_grad()
    def values(self, batch: Batch, micro_rows: int = 16, parallel: DataParallel = SINGLE) -> torch.Tensor:
        """Values `[B, R]` on the batch's device, `micro_rows` rows at a time, without gradient
        (as many forwards on every rank: a sharded critic's collectives)."""
        device = next(self.parameters()).device
        self.eval()
        starts = list(range(0, len(batch), micro_rows))
        count = parallel.all_max(len(starts))
        parts = []
        for i in range(count):
            rows = list(range(starts[i], min(starts[i] + micro_rows, len(batch)))) if i < len(starts) else []
            out = self(batch.select(rows or [0]).to(device))
            if rows:
                parts.append(out)
        return torch.cat(parts).to(batch.response_ids.device)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (module docstring) as a token mean over `mask`; stats: `critic/vf_loss`,
    `critic/vf_clipfrac` (tokens where the clipped term is the larger)."""
    m = (mask > 0).to(values.dtype)
    n = m.sum().clamp(min=1)
    err = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        err_c = (clipped - returns) ** 2
        frac = float(((err_c > err).to(values.dtype) * m).sum() / n)
        err = torch.maximum(err, err_c)
    else:
        frac = 0.0
    loss = 0.5 * (err * m).sum() / n
    return loss, {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": frac}


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, parallel: DataParallel = SINGLE
) -> float:
    """1 - Var(R - V) / Var(R) over the model tokens of every rank (1 = perfect critic, <= 0 = no
    better than a constant)."""
    m = mask > 0
    r, v = returns[m], values[m]
    if parallel.distributed:
        _, std_r, n = pooled_mean_std(r, parallel.all_sum)
        _, std_d, _ = pooled_mean_std(r - v, parallel.all_sum)
        return 0.0 if n < 2 or std_r == 0.0 else 1 - std_d**2 / std_r**2
    if r.numel() < 2 or float(r.var()) == 0.0:
        return 0.0
    return float(1 - (r - v).var() / r.var())


def critic_update(
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    clip: float | None,
    epochs: int = 1,
    micro_rows: int = 16,
    grad_clip: float | None = 1.0,
    seed: int = 0,
    parallel: DataParallel = SINGLE,
) -> dict[str, float]:
    """`epochs` passes over `batch`, one optimizer step per pass with gradients accumulated over
    micro-batches of `micro_rows` rows (each weighted by its share of the model tokens of all
    ranks), so the step is that of the token-mean loss over the whole batch. Returns the loss and
    clip fraction over the batch's model tokens (mean over epochs), the gradient norm, and the
    critic's explained variance and mean value before the update."""
    device = next(critic.parameters()).device
    batch, old_values, returns = batch.to(device), old_values.to(device), returns.to(device)
    ws = parallel.world_size
    total = max(1.0, float(parallel.all_sum(torch.tensor([float((batch.loss_mask > 0).sum())]))[0]))
    stats: dict[str, list[float]] = defaultdict(list)
    gen = torch.Generator().manual_seed(seed)
    critic.train()
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=gen).tolist()
        micros = [order[s : s + micro_rows] for s in range(0, len(order), micro_rows)]
        micros += [[] for _ in range(parallel.all_max(len(micros)) - len(micros))]
        optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, dtype=torch.float64)  # this rank's share of the batch's loss and clip fraction
        for rows in micros:
            pick = rows or [0]  # a rank short of rows still runs a forward/backward (FSDP), weighted 0
            sub = batch.select(pick)
            share = float((sub.loss_mask > 0).sum()) / total if rows else 0.0
            loss, st = value_loss(critic(sub), old_values[pick], returns[pick], sub.loss_mask, clip)
            (loss * share * ws).backward()  # FSDP averages gradients over the ranks
            sums += torch.tensor([st["critic/vf_loss"], st["critic/vf_clipfrac"]], dtype=torch.float64) * share
        pooled = parallel.all_sum(sums)
        stats["critic/vf_loss"].append(float(pooled[0]))
        stats["critic/vf_clipfrac"].append(float(pooled[1]))
        if grad_clip is not None:
            stats["critic/grad_norm"].append(parallel.clip_grad_norm(critic.parameters(), grad_clip))
        optimizer.step()
        torch.clear_autocast_cache()  # the next epoch's forward sees these weights (model.device.step_optimizer)
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out["critic/explained_var"] = explained_variance(old_values, returns, batch.loss_mask, parallel)
    on = old_values[batch.loss_mask > 0]
    out["critic/value_mean"] = pooled_mean_std(on, parallel.all_sum)[0]
    return out
