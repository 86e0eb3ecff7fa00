"""What the trainer does with an estimator's output: spread it over the model tokens, and log it.

Outcome-level advantages `[B]` become `[B, T]` on each trajectory's model tokens (loss mask 1);
token-level ones (PPO's GAE) are masked the same way. `advantage_stats` reports the batch's
advantages and the share of groups that give no learning signal.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pvpo.trainer.algorithms.groups import check_rewards, group_index


def broadcast_to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token advantages `[B, T]`: each trajectory's advantage on its model tokens (mask 1),
    0 on environment and padding tokens (mask 0). Token-level advantages (`[B, T]` already, e.g.
    PPO's GAE) are masked the same way."""
    if adv.dim() == 2 and adv.shape == mask.shape:
        return adv * mask.to(adv.dtype)
    if adv.dim() != 1 or mask.dim() != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"expected adv [B] or [B, T] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}")
    return adv.unsqueeze(1) * mask.to(adv.dtype)


def advantage_stats(
    adv: torch.Tensor,
    uids: Sequence[str],
    *,
    atol: float = 1e-8,
    mask: torch.Tensor | None = None,
    gt_rows: torch.Tensor | None = None,
) -> dict[str, float]:
    """Batch metrics for logging: mean/std/min/max of the per-trajectory advantages and the
    fraction of groups whose advantages are all (numerically) zero, i.e. groups that give no
    learning signal. Token-level advantages `[B, T]` with their loss `mask` are summarised over
    the model tokens only (padding and env tokens are not advantages). With `gt_rows` (bool `[B]`,
    the injected GT trajectories) holding any: `adv/gt_abs_max`, the largest |advantage| of a GT row."""
    check_rewards(adv, uids)
    flat = adv.detach().double().reshape(adv.shape[0], -1)
    idx, groups = group_index(uids, adv.device)
    nonzero = torch.zeros(len(groups), dtype=torch.float64, device=adv.device)
    nonzero.index_add_(0, idx, (flat.abs() > atol).any(dim=1).double())
    vals = (
        flat[mask.to(adv.device) > 0]
        if mask is not None and adv.dim() == 2 and bool((mask > 0).any())
        else flat.reshape(-1)
    )
    out = {}
    if gt_rows is not None and bool(gt_rows.any()):
        gt = flat[gt_rows.to(adv.device)]
        if mask is not None and adv.dim() == 2:
            gt = gt * (mask.to(adv.device)[gt_rows.to(adv.device)] > 0)
        out["adv/gt_abs_max"] = float(gt.abs().max())
    return out | {
        "adv/mean": float(vals.mean()),
        "adv/std": float(vals.std()) if vals.numel() > 1 else 0.0,
        "adv/min": float(vals.min()),
        "adv/max": float(vals.max()),
        "adv/zero_group_frac": float((nonzero == 0).double().mean()),
        "adv/num_groups": float(len(groups)),
    }
