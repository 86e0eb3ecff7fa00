"""What an estimator needs beyond rewards, uids and anchors, built by the trainer each step, and
what it learns after the step (issue 15):

- `gdpo`: `components=` `[B, K]` from `Trajectory.reward_components`, its names, weights,
  conditions and batch-norm flag (`algorithm.gdpo`).
- `v05` / `v05_value`: `prior=` uid -> V (the PVPO anchor, or a `PromptValueModel` over prompt
  embeddings updated with each step's group means), and the adaptive rollout budget
  (`algorithm.prior_fusion`), whose extra rollouts go through the trainer's own `rollout` (counted).
- `ppo`: `values=` from a separate `Critic`, `mask=`, gamma / lambda / whitening (`algorithm.ppo`);
  after the policy update the critic takes its clipped value-loss steps towards the GAE returns;
  during `critic.warmup_steps` only the critic trains.

The trainer calls the same four methods whatever the estimator; for the others they do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pvpo.trainer.algorithms.adaptive_budget import extend_groups
from pvpo.trainer.algorithms.critic import Critic, critic_update
from pvpo.trainer.algorithms.gae import gae, outcome_token_rewards
from pvpo.trainer.algorithms.gdpo import component_matrix
from pvpo.trainer.algorithms.prior_fusion import fused_baselines, fusion_stats
from pvpo.trainer.algorithms.value_model import Embed, PromptValueModel, minilm_embed
from pvpo.trainer.rollout.trajectory import Batch, Trajectory

VALUE_MODEL_FILE = "value_model.json"


class AdvantageInputs:
    """Per-run state of the estimators that need more than group statistics (module docstring)."""

    def __init__(
        self,
        cfg: Any,
        model: torch.nn.Module,
        *,
        device: torch.device | str = "cpu",
        run_dir: str | Path | None = None,
        embed: Embed | None = None,
    ) -> None:
        alg = cfg.algorithm
        self.name, self.alg, self.rollout_n = alg.estimator, alg, cfg.rollout.n
        from pvpo.trainer.parallel.distributed import is_distributed

        if is_distributed() and self.name in ("ppo", "v05_value"):
            # the critic and the value model are one process's: each rank would learn its own
            raise ValueError(f"algorithm.estimator={self.name} does not run under torchrun yet; "
                             "under torchrun: grpo, dr_grpo, rloo, pvpo, v05, gdpo (its batch step normalises each rank's share)")  # fmt: skip
        self.critic: Critic | None = None
        self.critic_opt: torch.optim.Optimizer | None = None
        if self.name == "ppo":
            self.critic = Critic(model).to(device)
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=alg.ppo.critic.lr)
        self.value_model: PromptValueModel | None = None
        if self.name == "v05_value":
            pf = alg.prior_fusion
            path = Path(run_dir) / VALUE_MODEL_FILE if run_dir is not None else None
            self.value_model = PromptValueModel(embed or minilm_embed(pf.encoder), kind=pf.value_model, k=pf.knn_k,
                                                alpha=pf.ridge_alpha, path=path)  # fmt: skip
        self._prior: dict[str, float | None] = {}
        self._texts: dict[str, str] = {}
        self._report: dict[str, float] = {}

    @property
    def fuses_prior(self) -> bool:
        return self.name in ("v05", "v05_value")

    def trains_policy(self, step: int) -> bool:
        """False during the critic's warm-up steps (1-based `step`)."""
        return self.critic is None or step > self.alg.ppo.critic.warmup_steps

    def extra_rollouts(
        self,
        examples: Sequence[Any],
        trajs: Sequence[Trajectory],
        rollout: Callable[[list[Any], int], list[Trajectory]],
        anchors: Mapping[str, float] | None,
    ) -> list[Trajectory]:
        """V0.5: the step's priors, then the adaptive budget's extra rollouts for `examples` (the
        step's prompts, each once) given their first `trajs`; `rollout(examples, round)` samples
        one trajectory each through the trainer. Nothing for other estimators."""
        if not self.fuses_prior:
            return []
        uniq = list({ex.uid: ex for ex in examples}.values())
        self._texts = {ex.uid: ex.question for ex in uniq}
        if self.value_model is not None:
            self._prior = self.value_model.predict([ex.uid for ex in uniq], [ex.question for ex in uniq])
        else:
            self._prior = {ex.uid: (anchors or {}).get(ex.uid) for ex in uniq}
        pf = self.alg.prior_fusion
        if not pf.adaptive:
            return []
        new, report = extend_groups(
            uniq, trajs, self._prior, rollout, k_max=max(pf.k_max, self.rollout_n), cost=pf.cost
        )
        self._report.update(report)
        return new

    def kwargs(self, trajs: Sequence[Trajectory], batch: Batch) -> dict[str, Any]:
        """Keyword arguments of the estimator call for this step's `trajs` (collated as `batch`)."""
        if self.name == "gdpo":
            g = self.alg.gdpo
            comps, names = component_matrix([t.reward_components for t in trajs], g.components)
            return {"components": comps, "component_names": names, "weights": g.weights, "conditions": g.conditions,
                    "batch_norm": g.batch_norm}  # fmt: skip
        if self.fuses_prior:
            return {"prior": self._prior}
        if self.critic is not None:
            p = self.alg.ppo
            values = self.critic.values(batch, self.alg.ppo.critic.micro_batch_rows) * batch.loss_mask
            return {"values": values, "mask": batch.loss_mask, "gamma": p.gamma, "lam": p.lam, "whiten": p.whiten}
        return {}

    def after_step(self, batch: Batch, kwargs: Mapping[str, Any], *, seed: int = 0) -> dict[str, float]:
        """What the estimator learns from the step (critic steps, value-model entries) and its
        logged figures (`critic/*`, `v05/*`)."""
        out, self._report = dict(self._report), {}
        if self.critic is not None and self.critic_opt is not None:
            c, p = self.alg.ppo.critic, self.alg.ppo
            _, returns = gae(outcome_token_rewards(batch.rewards, batch.loss_mask), kwargs["values"], batch.loss_mask,
                             gamma=p.gamma, lam=p.lam)  # fmt: skip
            out.update(critic_update(self.critic, self.critic_opt, batch, kwargs["values"], returns, clip=c.value_clip,
                                     epochs=c.epochs, micro_rows=c.micro_batch_rows, grad_clip=c.grad_clip, seed=seed))  # fmt: skip
        if self.fuses_prior:
            sampled = ~batch.is_gt
            _, per = fused_baselines(batch.rewards, batch.uids, self._prior)
            out.update(fusion_stats(per))
            if self.value_model is not None:
                uids = [u for u, s in zip(batch.uids, sampled.tolist(), strict=True) if s]
                means: dict[str, list[float]] = {}
                for u, r in zip(uids, batch.rewards[sampled].tolist(), strict=True):
                    means.setdefault(u, []).append(r)
                order = list(means)
                self.value_model.update(
                    order, [self._texts[u] for u in order], [sum(means[u]) / len(means[u]) for u in order]
                )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The critic and its optimizer, for the trainer's checkpoint (empty for other estimators;
        the value model keeps its own file, `VALUE_MODEL_FILE`)."""
        if self.critic is None or self.critic_opt is None:
            return {}
        return {"critic": self.critic.state_dict(), "critic_optimizer": self.critic_opt.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.critic is not None and self.critic_opt is not None and "critic" in state:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_optimizer"])
