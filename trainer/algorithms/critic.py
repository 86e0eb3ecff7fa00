"""PPO's learned critic: a separate copy of the policy's decoder with a scalar value head, and its
clipped value loss (Schulman et al. 2017, arXiv:1707.06347, as in the PPO2 / verl implementations):

    L_V = 1/2 * mean_t max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)

over the model tokens only: the value at an environment token is never a target (GAE carries the
next model token's value across it, `gae.py`). Rejected: a value head on the policy's own trunk;
it couples the critic's gradient to the policy's and makes critic warm-up steps move the policy.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch

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
        torch.nn.init.zeros_(self.head.weight)  # V = bias = 0 at start: GAE begins as plain returns
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
        return self.head(h.float()).squeeze(-1)

    @torch.no_grad()
    def values(self, batch: Batch, micro_rows: int = 16) -> torch.Tensor:
        """Values `[B, R]` on the batch's device, `micro_rows` rows at a time, without gradient."""
        device = next(self.parameters()).device
        self.eval()
        parts = [
            self(batch.select(list(range(s, min(s + micro_rows, len(batch))))).to(device))
            for s in range(0, len(batch), micro_rows)
        ]
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


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the model tokens (1 = perfect critic, <= 0 = no better than a constant)."""
    m = mask > 0
    r, v = returns[m], values[m]
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
) -> dict[str, float]:
    """`epochs` passes over `batch`, one optimizer step per pass with gradients accumulated over
    micro-batches of `micro_rows` rows (each weighted by its share of the model tokens), so the
    step is that of the token-mean loss over the whole batch. Returns mean stats and the critic's
    explained variance before the update."""
    device = next(critic.parameters()).device
    batch, old_values, returns = batch.to(device), old_values.to(device), returns.to(device)
    total = float((batch.loss_mask > 0).sum().clamp(min=1))
    stats: dict[str, list[float]] = defaultdict(list)
    gen = torch.Generator().manual_seed(seed)
    critic.train()
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=gen).tolist()
        optimizer.zero_grad(set_to_none=True)
        for s in range(0, len(order), micro_rows):
            rows = order[s : s + micro_rows]
            sub = batch.select(rows)
            share = float((sub.loss_mask > 0).sum()) / total
            loss, st = value_loss(critic(sub), old_values[rows], returns[rows], sub.loss_mask, clip)
            (loss * share).backward()
            for k, v in st.items():
                stats[k].append(v)
        if grad_clip is not None:
            stats["critic/grad_norm"].append(float(torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip)))
        optimizer.step()
        torch.clear_autocast_cache()  # the next epoch's forward sees these weights (model.device.step_optimizer)
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out["critic/explained_var"] = explained_variance(old_values, returns, batch.loss_mask)
    out["critic/value_mean"] = (
        float(old_values[batch.loss_mask > 0].mean()) if bool((batch.loss_mask > 0).any()) else 0.0
    )
    return out
