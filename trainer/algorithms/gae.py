"""PPO's token-level advantages: GAE over the model tokens of multi-turn trajectories.

Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, Eqs. 11-16):

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t),    A_t = delta_t + gamma * lambda * A_{t+1},

with returns R_t = A_t + V(s_t) as the critic's targets. The response interleaves model tokens
(actions) and environment tokens (observations the policy did not choose). Environment tokens are
not steps: the recursion runs over the model tokens only, so the last model token before an
observation bootstraps from the value of the first model token after it, and the running
`next value` and `A_{t+1}` are carried unchanged across the environment span (verl's
`compute_gae_advantage_return` over a response mask does the same). The outcome reward sits on each
trajectory's last model token; after it V = 0.

lambda defaults to 1 (verl's `lam: 1.0`): A_t = R - V(s_t), so while the critic is still wrong
(it starts at V = 0) each token's advantage is the return against it. At lambda 0.95 and V = 0 a
token's advantage is 0.95^(tokens to the end) R: on one correct and one wrong row of 180 model
tokens, token whitening gave 123 of the correct row's tokens a negative advantage (its first
-0.347, the wrong row's -0.348).

Group Sampling's GT rows are refused with `ppo` (`spec.NO_GT_ROWS`, at config load): the critic
learns the policy's value, which a GT trajectory is not a sample of, and the whitening over the
batch's tokens would either let GT tokens move every policy row (four policy rows at 0.1 and a
GT row at 1, three tokens each, the critic at 0: each policy token 0 without it, -0.483 with it)
or divide them by a spread they did not enter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pvpo.trainer.algorithms.critic import Critic, critic_update
from pvpo.trainer.algorithms.data_parallel import SINGLE, pooled_mean_std
from pvpo.trainer.algorithms.estimator_state import EstimatorContext, EstimatorState
from pvpo.trainer.algorithms.groups import check_rewards
from pvpo.trainer.algorithms.spec import register_estimator
from pvpo.trainer.rollout.trajectory import Batch, Trajectory


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B, T]` token rewards: each trajectory's reward on its last model token, 0 elsewhere (a
    row without model tokens gets none)."""
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"expected rewards [B] and mask [B, T], got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    m = mask > 0
    t = mask.shape[1]
    last = (
        torch.where(m, torch.arange(t, device=mask.device).expand_as(m), torch.full_like(m, -1, dtype=torch.long))
        .max(dim=1)
        .values
    )
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = (last >= 0).nonzero().squeeze(1)
    out[rows, last[rows]] = rewards[rows]
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each `[B, T]`, 0 off the model tokens (`mask` 0). See the module
    docstring: the recursion skips mask-0 tokens, carrying the next value and advantage over them."""
    if not (token_rewards.shape == values.shape == mask.shape):
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape [B, T]"
        )
    m = (mask > 0).to(values.dtype)
    values = values.detach() * m
    b, t = values.shape
    next_value = torch.zeros(b, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(values)
    for i in reversed(range(t)):
        delta = token_rewards[:, i] + gamma * next_value - values[:, i]
        a = delta + gamma * lam * next_adv
        adv[:, i] = a * m[:, i]
        next_value = torch.where(m[:, i] > 0, values[:, i], next_value)  # env token: carried
        next_adv = torch.where(m[:, i] > 0, a, next_adv)
    return adv, (adv + values) * m


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-8,
    all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """`(x - mean) / (std + eps)` over the mask-1 entries (unbiased std), 0 elsewhere; with
    `all_sum` (summing a tensor over the ranks of a torchrun run) mean and std are those of every
    rank's entries together. The statistics are float64 (`data_parallel.pooled_mean_std`), so
    entries that share one value are whitened to exactly 0: twelve float32 tokens at 0.1 got
    -0.0147 each from a float32 mean's residue over a std of the same size + eps."""
    m = mask > 0
    mean, std, n = pooled_mean_std(x[m], all_sum or SINGLE.all_sum)
    if n < 2:
        return torch.zeros_like(x)
    return torch.where(m, (x.double() - mean) / (std + eps), torch.zeros_like(x, dtype=torch.float64)).to(x.dtype)


class PPOState(EstimatorState):
    """PPO's learned critic (`critic.py`) and its optimizer: `values=` for GAE each step, its
    clipped value-loss steps towards the GAE returns after the policy's update, and during
    `critic.warmup_steps` only the critic trains. Under torchrun the critic is sharded like the
    policy (`critic.py` says why), checkpointed through DCP (`sharded_modules`), and the advantages
    are whitened over every rank's model tokens."""

    def __init__(self, context: EstimatorContext) -> None:
        if context.model is None:
            raise ValueError("ppo's critic copies the policy's trunk: EstimatorContext.model is required")
        self.cfg, self.parallel = context.algorithm.ppo, context.parallel
        # a sharded policy's trunk is gathered whole first (a collective), so every rank starts
        # from the same critic, then sharded as the policy is
        self.critic = Critic(self.parallel.whole(context.model)).to(context.device)
        self.parallel.shard(self.critic)  # in place (FSDP2's fully_shard)
        self.optimizer = torch.optim.AdamW(self.critic.parameters(), lr=self.cfg.critic.lr)

    def trains_policy(self, step: int) -> bool:
        return step > self.cfg.critic.warmup_steps

    def kwargs(self, trajs: Sequence[Trajectory], batch: Batch) -> dict[str, Any]:
        values = self.critic.values(batch, self.cfg.critic.micro_batch_rows, self.parallel) * batch.loss_mask
        return {
            "values": values,
            "mask": batch.loss_mask,
            "gamma": self.cfg.gamma,
            "lam": self.cfg.lam,
            "whiten": self.cfg.whiten,
            "all_sum": self.parallel.all_sum if self.parallel.distributed else None,
        }

    def after_step(self, batch: Batch, kwargs: Mapping[str, Any], *, seed: int = 0) -> dict[str, float]:
        c = self.cfg.critic
        _, returns = gae(
            outcome_token_rewards(batch.rewards, batch.loss_mask),
            kwargs["values"],
            batch.loss_mask,
            gamma=self.cfg.gamma,
            lam=self.cfg.lam,
        )
        return critic_update(
            self.critic,
            self.optimizer,
            batch,
            kwargs["values"],
            returns,
            clip=c.value_clip,
            epochs=c.epochs,
            micro_rows=c.micro_batch_rows,
            grad_clip=c.grad_clip,
            seed=seed,
            parallel=self.parallel,
        )

    def state_dict(self) -> dict[str, Any]:
        if self.parallel.distributed:  # its shards go through DCP (`sharded_modules`)
            return {}
        return {"critic": self.critic.state_dict(), "critic_optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "critic" in state and not self.parallel.distributed:
            self.critic.load_state_dict(state["critic"])
            self.optimizer.load_state_dict(state["critic_optimizer"])

    def sharded_modules(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        return {"critic": (self.critic, self.optimizer)} if self.parallel.distributed else {}


@register_estimator("ppo", level="token", needs_critic=True, state=PPOState)
def ppo(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    values: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    policy_rows: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """PPO's per-token advantages `[B, T]`: GAE(gamma, lambda) of the outcome reward against the
    critic's `values` `[B, T]` over the model tokens of `mask` `[B, T]`, whitened over the batch's
    model tokens when `whiten` (groups play no part: the critic is the baseline); `all_sum`: the
    batch is every rank's (`masked_whiten`). Whitening bounds a token by the batch, not a group: at
    V = 0 and lambda 1, a row that alone succeeds among B rows of equal length gets sqrt(B - 1)
    (17.9 at 320 rows), as verl's whitening gives it. `policy_rows` false anywhere (an injected GT
    row) is a ValueError: module docstring."""
    check_rewards(rewards, uids)
    if policy_rows is not None and not bool(policy_rows.all()):
        raise ValueError(
            "ppo takes no GT rows (Group Sampling): its critic and whitening are the policy's; "
            "set algorithm.group_sampling.enabled=false or use another estimator"
        )
    if values is None or mask is None:
        raise ValueError(
            "ppo needs values= (the critic's [B, T]) and mask= (the loss mask [B, T]); the trainer passes them"
        )
    mask = mask.to(rewards.device)
    adv, _ = gae(outcome_token_rewards(rewards, mask), values.to(rewards), mask, gamma=gamma, lam=lam)
    return masked_whiten(adv, mask, eps, all_sum) if whiten else adv
