"""Config sections of the estimators beyond the group baselines: GDPO's reward components, V0.5's
prior fusion and adaptive rollout budget, PPO's critic and GAE.

Kept apart from `schema.py` (which nests them under `algorithm`) so the estimators' settings
live together; like all of `config/`, it imports no runtime code.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pvpo.trainer.config.section import Section


class GDPOCondition(Section):
    """GDPO's conditioned reward (arXiv:2601.05242, Sec. 3.2): `component` counts only where the
    reward component `when` reaches `threshold` (e.g. a length reward only for correct answers).
    (Not `on`: YAML reads a bare `on` key as the boolean true.)"""

    component: str
    when: str
    threshold: float = 1.0


class GDPOConfig(Section):
    """GDPO (arXiv:2601.05242): each named reward component normalised in its group, weighted sum,
    then normalised over the batch. Components are the reward's own (`pvpo`: format, r_acc)."""

    components: list[str] | None = Field(
        None, description="reward component names, one column each; null = every component the reward returns, sorted"
    )
    weights: dict[str, float] = Field(
        default_factory=dict, description="component -> weight; a component not named weighs 1"
    )
    conditions: list[GDPOCondition] = Field(
        default_factory=list,
        description="[{component, when, threshold}]: a component counts only where `when` reaches `threshold`",
    )
    batch_norm: bool = Field(
        True,
        description="normalise the summed advantages over the whole batch's policy rows (the paper's last step); a GT row gets its components' weighted mean",
    )


class PriorFusionConfig(Section):
    """V0.5 (arXiv:2603.10848): baseline = w * group mean + (1 - w) * prior V, with the shrinkage
    weight w* = D^2 / (D^2 + s^2/k); rollouts added per prompt by one-step look-ahead on
    MSE(k) + c k, from `rollout.n` (k_init) up to `k_max`. The prior is the PVPO anchor
    (estimator `v05`) or a value model over prompt embeddings (estimator `v05_value`)."""

    k_max: int = Field(
        16, ge=1, description="most rollouts a prompt may get in one step (paper: 16; k_init = rollout.n, paper: 4)"
    )
    cost: float = Field(
        1 / 256,
        ge=0,
        description="c, the price of one more rollout in the paper's MSE units (rewards +-1; paper: 1/256), scaled by (range/2)^2 to reward_range",
    )
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0), description="[lo, hi] of the reward: the variance floor's Bernoulli bound and the cost's scale"
    )
    var_pseudo_count: float = Field(
        1.0,
        ge=0,
        description="weight (in rollouts) of the Bernoulli variance floor of a group's noise; 0 = plain sample variance (a uniform group then discards the prior)",
    )
    adaptive: bool = Field(True, description="false: fixed rollout.n per prompt, fusion only")

    value_model: Literal["knn", "ridge"] = Field("knn", description="v05_value's regressor over prompt embeddings")
    knn_k: int = Field(8, ge=1, description="neighbours of the kNN value model")
    ridge_alpha: float = Field(1.0, gt=0, description="L2 penalty of the ridge value model")
    encoder: str | None = Field(
        None, description="sentence-transformers model of the prompt embeddings; null = the packaged MiniLM"
    )

    @field_validator("reward_range")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[1] > v[0]:
            raise ValueError(f"reward_range must be [lo, hi] with lo < hi, got {list(v)}")
        return v


class CriticConfig(Section):
    """PPO's learned critic: a copy of the policy's backbone with a scalar value head."""

    lr: float = Field(1e-4, gt=0, description="the critic's AdamW learning rate")
    value_clip: float | None = Field(0.2, gt=0, description="PPO's clipped value loss range; null = unclipped")
    warmup_steps: int = Field(0, ge=0, description="first steps train only the critic (the policy is not updated)")
    epochs: int = Field(1, ge=1, description="critic passes over one rollout batch")
    micro_batch_rows: int = Field(16, ge=1, description="rows per critic forward/backward pass")
    grad_clip: float | None = Field(
        1.0, gt=0, description="clip the critic's gradient norm to this; null = no clipping"
    )


class PPOConfig(Section):
    """PPO with GAE (Schulman et al. 2016, arXiv:1506.02438) over the model tokens of multi-turn
    trajectories; the outcome reward sits on each trajectory's last model token. Not with Group
    Sampling (`algorithm.group_sampling.enabled`): refused at config load (`trainer/algorithms/gae.py`
    says why)."""

    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount per model token")
    lam: float = Field(
        1.0,
        ge=0,
        le=1,
        description="GAE lambda (verl's 1.0: a token's advantage is its return against the critic; below 1 an early token's credit shrinks while the critic is still 0)",
    )
    whiten: bool = Field(True, description="whiten the advantages over the batch's model tokens")
    critic: CriticConfig = CriticConfig()
