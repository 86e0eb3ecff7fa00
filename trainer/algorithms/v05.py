"""V0.5 (Zhang et al. 2026, arXiv:2603.10848): the group baseline fused with a value prior
(`prior_fusion.py`) and an adaptive rollout budget per prompt (`adaptive_budget.py`).

Two priors: the PVPO anchor (`v05`), or a value model over prompt embeddings learned from the
run's own group means (`v05_value`, `value_model.py`). The baseline statistics are those of the
policy's own rollouts (`policy_rows`: an injected GT row is measured against them, never part of
them), the same rows the adaptive budget saw; advantage = r - fused baseline, no std
normalisation. The variance floor and the budget's cost scaling are `prior_fusion.py`'s and
`adaptive_budget.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pvpo.trainer.algorithms.adaptive_budget import extend_groups
from pvpo.trainer.algorithms.estimator_state import EstimatorContext, EstimatorState, Rollout
from pvpo.trainer.algorithms.prior_fusion import NoiseFloor, fused_baselines, fusion_stats
from pvpo.trainer.algorithms.spec import register_estimator
from pvpo.trainer.algorithms.value_model import PromptValueModel
from pvpo.trainer.rollout.trajectory import Batch, Trajectory

DEFAULT_FLOOR = NoiseFloor()  # rewards in [0, 1], pseudo-count 1: `algorithm.prior_fusion`'s defaults


class V05State(EstimatorState):
    """The step's priors (the anchor, or the value model's predictions), the adaptive budget's
    extra rollouts (`algorithm.prior_fusion`), and, for the value model, its update with each
    step's group means of the sampled rollouts."""

    learned_prior = False  # the prior is the PVPO anchor

    def __init__(self, context: EstimatorContext) -> None:
        self.cfg, self.rollout_n, self.parallel = context.algorithm.prior_fusion, context.rollout_n, context.parallel
        lo, hi = self.cfg.reward_range
        self.floor = NoiseFloor(lo, hi, self.cfg.var_pseudo_count)
        self.value_model: PromptValueModel | None = None
        if self.learned_prior:
            if context.embed is None:
                raise ValueError("a learned V0.5 prior needs a prompt-embedding factory (EstimatorContext.embed)")
            self.value_model = PromptValueModel(
                context.embed(self.cfg.encoder),
                kind=self.cfg.value_model,
                k=self.cfg.knn_k,
                alpha=self.cfg.ridge_alpha,
                path=context.value_model_path,
                read_only=not self.parallel.is_main,
            )
        self.prior: dict[str, float | None] = {}
        self.texts: dict[str, str] = {}
        self.report: dict[str, float] = {}

    def extra_rollouts(
        self,
        examples: Sequence[Any],
        trajs: Sequence[Trajectory],
        rollout: Rollout,
        anchors: Mapping[str, float] | None,
    ) -> list[Trajectory]:
        """The step's priors, then the adaptive budget's extra rollouts for `examples` (the step's
        prompts) given their first `trajs`."""
        uniq = list({ex.uid: ex for ex in examples}.values())
        self.texts = {ex.uid: ex.question for ex in uniq}
        if self.value_model is not None:
            self.prior = self.value_model.predict([ex.uid for ex in uniq], [ex.question for ex in uniq])
        else:
            self.prior = {ex.uid: (anchors or {}).get(ex.uid) for ex in uniq}
        if not self.cfg.adaptive:
            return []
        new, report = extend_groups(
            uniq,
            trajs,
            self.prior,
            rollout,
            k_max=max(self.cfg.k_max, self.rollout_n),
            cost=self.cfg.cost,
            floor=self.floor,
            any_rank=self.parallel.any_rank,
        )
        self.report.update(report)
        return new

    def kwargs(self, trajs: Sequence[Trajectory], batch: Batch) -> dict[str, Any]:
        return {"prior": self.prior, "floor": self.floor}

    def after_step(self, batch: Batch, kwargs: Mapping[str, Any], *, seed: int = 0) -> dict[str, float]:
        out, self.report = dict(self.report), {}
        _, per = fused_baselines(batch.rewards, batch.uids, self.prior, rows=~batch.is_gt, floor=self.floor)
        out.update(fusion_stats(per))
        if self.value_model is not None:
            sampled = ~batch.is_gt
            means: dict[str, list[float]] = {}
            uids = [u for u, s in zip(batch.uids, sampled.tolist(), strict=True) if s]
            for u, r in zip(uids, batch.rewards[sampled].tolist(), strict=True):
                means.setdefault(u, []).append(r)
            order = list(means)
            texts = [self.texts[u] for u in order]
            mine = list(
                zip(
                    order,
                    texts,
                    self.value_model.embeddings(order, texts),
                    [sum(means[u]) / len(means[u]) for u in order],
                )
            )
            # every rank adds every rank's entries, in rank order: one store, as one process builds it
            rows = [row for part in self.parallel.all_gather(mine) for row in part]
            self.value_model.update(
                [r[0] for r in rows], [r[1] for r in rows], [r[3] for r in rows], vectors=[r[2] for r in rows]
            )
        return out


class V05ValueState(V05State):
    """V05State whose prior is a value model over prompt embeddings, saved in the run dir."""

    learned_prior = True


def _advantages(
    rewards: torch.Tensor,
    uids: Sequence[str],
    prior: Mapping[str, float | None] | None,
    policy_rows: torch.Tensor | None,
    floor: NoiseFloor | None,
) -> torch.Tensor:
    base, _ = fused_baselines(rewards, uids, prior, rows=policy_rows, floor=floor)
    return rewards - base


@register_estimator("v05", needs_anchors=True, extra_rollouts=True, state=V05State)
def v05(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    prior: Mapping[str, float | None] | None = None,
    policy_rows: torch.Tensor | None = None,
    floor: NoiseFloor | None = DEFAULT_FLOOR,
    **kwargs: Any,
) -> torch.Tensor:
    """V0.5 with the PVPO anchor as the prior: `r - (w* m + (1 - w*) V)` per prompt (module
    docstring) over the `policy_rows`, with the variance `floor` (default: the config's; None: the
    plain sample variance); `prior=` overrides the anchors."""
    return _advantages(rewards, uids, prior if prior is not None else anchors, policy_rows, floor)


@register_estimator("v05_value", extra_rollouts=True, state=V05ValueState)
def v05_value(
    rewards: torch.Tensor,
    uids: Sequence[str],
    *,
    anchors: Mapping[str, float] | None = None,
    eps: float = 1e-6,
    prior: Mapping[str, float | None] | None = None,
    policy_rows: torch.Tensor | None = None,
    floor: NoiseFloor | None = DEFAULT_FLOOR,
    **kwargs: Any,
) -> torch.Tensor:
    """V0.5 with a value model over prompt embeddings as the prior (`value_model.py`, the same
    store on every rank under torchrun); the trainer passes its predictions as `prior=`, None for
    a prompt it cannot predict yet."""
    return _advantages(rewards, uids, prior, policy_rows, floor)
