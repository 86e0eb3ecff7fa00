"""The `algorithm` config section: the estimator and reward by name, PVPO's anchor, Group
Sampling and GT trajectories, and the other estimators' settings (`config/estimators.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pvpo.trainer.algorithms.spec import ESTIMATORS
from pvpo.trainer.config.estimators import GDPOConfig, PPOConfig, PriorFusionConfig
from pvpo.trainer.config.section import Section


class AnchorConfig(Section):
    num_rollouts: int = Field(4, ge=1, description="M: reference rollouts per training prompt")
    refresh_every: int = Field(0, ge=0, description="recompute the anchor every this many steps; 0 = never")
    refresh_from: Literal["reference", "current"] = Field(
        "reference", description="the policy a refresh samples: reference | current"
    )
    temperature: float | None = Field(
        None, gt=0, description="sampling temperature of the anchor's rollouts; null = rollout.temperature"
    )
    reuse_from: str | None = Field(
        None,
        description="a run dir whose anchor (and Group Sampling partition and GT cache) a fresh run starts from "
        "instead of sampling its own: the arms of a sweep from one warm start (same RL prompts, same reference "
        "policy); refused unless its anchor covers every RL prompt",
    )


class GroupSamplingConfig(Section):
    """PVPO's Group Sampling (arXiv:2508.21104, Sec. 3.3): from the anchor's M reference rollouts,
    prompts the reference always solves leave the training pool, prompts it never solves get a
    ground-truth trajectory injected into their groups. Recomputed at every anchor refresh."""

    enabled: bool = Field(
        False, description="drop always-solved prompts and inject GT trajectories into never-solved ones"
    )
    drop_threshold: float = Field(1.0, gt=0, le=1, description="reference accuracy >= this: prompt dropped")
    gt_threshold: float = Field(0.0, ge=0, lt=1, description="reference accuracy <= this: prompt gets a GT trajectory")
    metric: Literal["reward", "em", "cem", "f1"] = Field(
        "reward",
        description="what a reference rollout's accuracy reads: reward (the reward's correctness component: pvpo r_acc, em, f1) | em | cem | f1",
    )

    @model_validator(mode="after")
    def _ordered(self) -> GroupSamplingConfig:
        if self.gt_threshold >= self.drop_threshold:
            raise ValueError("gt_threshold must be below drop_threshold")
        return self


class GTModelConfig(Section):
    """The `model` GT source: PVPO's larger model. A local HF path runs through our engines
    (token-exact; its tokenizer must be the policy's), or an OpenAI-compatible chat endpoint."""

    path: str | None = Field(
        None, description="local HF causal LM folder, catalog name or *.gguf file (same tokenizer as the policy)"
    )
    engine: str = Field("hf", description="rollout engine for `path`: hf | vllm")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1")
    model: str | None = Field(None, description="model name at `base_url`")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the endpoint's key")
    temperature: float = Field(0.7, ge=0, description="sampling temperature of GT attempts (0 = greedy)")
    timeout_s: float = Field(120.0, gt=0, description="seconds one endpoint request may take")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        from pvpo.trainer.rollout.engine import check_engine

        return check_engine(v)  # a known engine whose package is installed, as rollout.engine

    @model_validator(mode="after")
    def _one_target(self) -> GTModelConfig:
        if self.path is not None and self.base_url is not None:
            raise ValueError("gt.model: set path (a local model) or base_url (an endpoint), not both")
        if self.base_url is not None and not self.model:
            raise ValueError("gt.model.base_url needs gt.model.model (the model name at that endpoint)")
        return self


class GTConfig(Section):
    """Ground-truth trajectories for the prompts the reference never solves (Group Sampling)."""

    source: str = Field("oracle", description="where GT trajectories come from: oracle | model | dataset")
    replace_per_group: int = Field(
        1,
        ge=1,
        description="rollouts of a GT prompt's group replaced by its GT trajectory (at most rollout.n - 1: one stays the policy's own)",
    )
    attempts: int = Field(4, ge=1, description="tries per prompt before the source gives up on it")
    min_reward: float = Field(
        1.0, ge=0, le=1, description="a GT trajectory must reach this reward (correct + well formed)"
    )
    logprobs: Literal["source", "reference"] = Field(
        "source",
        description="pi_gt of the PPO ratio: the source's own probabilities (oracle: 1 per token), or the reference policy's",
    )
    model: GTModelConfig = GTModelConfig()

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        from pvpo.trainer.reference.gt_registry import GT_SOURCES

        return GT_SOURCES.check(v)


class AlgorithmConfig(Section):
    estimator: str = Field("pvpo", description=f"advantage estimator by name: {' | '.join(ESTIMATORS.names())}")
    reward: str = Field("pvpo", description="reward by name (pvpo.reward): pvpo | em | search_r1_format | research_f1")
    reward_params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the reward")
    anchor: AnchorConfig = AnchorConfig()
    group_sampling: GroupSamplingConfig = GroupSamplingConfig()
    gt: GTConfig = GTConfig()
    # settings of the gdpo / v05, v05_value / ppo estimators (config/estimators.py)
    gdpo: GDPOConfig = GDPOConfig()
    prior_fusion: PriorFusionConfig = PriorFusionConfig()
    ppo: PPOConfig = PPOConfig()

    @model_validator(mode="after")
    def _reward_takes_its_params(self) -> AlgorithmConfig:
        from pvpo.reward.rewards import check_reward_params

        check_reward_params(self.reward, self.reward_params)  # a typo would zero every reward silently
        return self

    @model_validator(mode="after")
    def _gt_fits_group(self) -> AlgorithmConfig:
        if (
            self.group_sampling.enabled
            and self.gt.source == "model"
            and not (self.gt.model.path or self.gt.model.base_url)
        ):
            raise ValueError("algorithm.gt.source=model needs gt.model.path or gt.model.base_url")
        return self

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        return ESTIMATORS.check(v)

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, v: str) -> str:
        from pvpo.reward import get_reward

        get_reward(v)
        return v
