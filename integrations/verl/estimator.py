"""PVPO as a verl advantage estimator, registered as `pvpo` (`algorithm.adv_estimator=pvpo`).

verl calls a registered estimator with `token_level_rewards` `[B, T]` (the trajectory's score on
its last response token, plus any in-reward KL), `response_mask` `[B, T]`, `config` (the
`algorithm` section) and `index`, a uuid per prompt per step (verl 0.9.1
`trainer/ppo/ray_trainer.py::compute_advantage`), and expects `(advantages, returns)`, both
`[B, T]`. That uuid cannot name a prompt across steps, so PVPO's anchor is subtracted on the
reward side, where the row's uid is known (`pvpo.integrations.verl.reward.compute_score` or the
`pvpo_search` agent loop, with `anchors=`): the score reaching this estimator is `r - anchor[uid]`.
PVPO's advantage is that score as it stands, with no group mean and no std (the static anchor
replaces the group baseline, arXiv:2508.21104 Eq. 5), on every model token of the response.
Group Sampling happens before rollout: `verl_rows(..., partition=...)` leaves out the prompts it
dropped.

`pvpo_advantage` needs only torch; `register()` imports verl's registry.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "pvpo"


def pvpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(advantages, returns)`, `[B, T]`: each trajectory's anchor-centred score (the sum of its
    token rewards) on its response tokens, 0 on padding and tool/observation tokens. `index`,
    `epsilon` and `config` are verl's estimator arguments; PVPO uses no group statistics."""
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.dim() != 2:
        raise ValueError(
            f"expected token_level_rewards and response_mask of one shape [B, T], got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


def register() -> None:
    """Register `pvpo_advantage` in verl's estimator registry as `pvpo` (idempotent: verl accepts
    the same function registered twice)."""
    try:
        from verl.trainer.ppo.core_algos import register_adv_est
    except ModuleNotFoundError as err:
        from pvpo.integrations.verl.requirement import verl_missing

        raise verl_missing(err, f"{__name__}.register") from err

    register_adv_est(NAME)(pvpo_advantage)
