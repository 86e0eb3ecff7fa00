"""The `rollout` config section: how training rollouts are sampled (the engine and its vLLM
options, temperature, turns and budgets, group size, concurrency), the importance correction for
the sampler's log-probs, and rollouts beside the update (`max_staleness`, `decoupled`,
`wait_timeout_s`: trainer/steps/pipelined.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from pvpo.trainer.config.section import Section


class VLLMConfig(Section):
    """Options of the vLLM engine (`rollout.engine: vllm`), passed to `VLLMEngine`; null = its default."""

    dtype: str = Field("auto", description="auto = the policy's dtype")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="share of the GPU's memory vLLM may take")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine")
    max_model_len: int | None = Field(None, ge=16, description="longest sequence vLLM serves; null = the model's")
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1 << 20, description="fixes the KV cache size (CPU default: 512 MiB)"
    )
    enable_prefix_caching: bool = Field(True, description="reuse the KV cache of shared prompt prefixes")
    enable_sleep_mode: bool | None = Field(
        None, description="release memory while the trainer runs; null = where the platform supports it"
    )
    sleep_level: Literal[1, 2] = Field(
        1, description="1: the KV cache sleeps while the trainer runs; 2: the weights too"
    )
    enforce_eager: bool | None = Field(None, description="null = eager on CPU, compiled / CUDA graphs on GPU")
    release_on_sleep: bool | None = Field(
        None,
        description="where sleep mode is off: shut the engine while the trainer runs and rebuild it "
        "with the synced weights after; null = on CPU",
    )
    llm_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to vllm.LLM unchanged")


class ImportanceCorrectionConfig(Section):
    """Truncated importance sampling for sampler/trainer log-prob mismatch (TRL, verl): when
    enabled, the PPO ratio's denominator is the trainer's log-prob of each sampled token and the
    per-token loss is weighted by `min(exp(lp_train - lp_sampler), cap)`. With
    `rollout.max_staleness > 0` it is always on: AReaL's decoupled objective, whose behaviour
    weight pi_prox / pi_behav is this ratio (`algorithms/importance.py`)."""

    enabled: bool = Field(
        False,
        description="weight each token's loss by the truncated trainer/sampler probability ratio (always on when "
        "rollout.max_staleness > 0: the decoupled objective's behaviour weight)",
    )
    cap: float = Field(2.0, ge=1, description="the weight's upper bound (the clamp)")
    mode: Literal["truncate", "mask"] = Field(
        "truncate",
        description="above the cap: truncate the weight to it (TIS), or drop the token (weight 0, AReaL's "
        "behav_imp_weight_cap)",
    )


# rollout.max_staleness's bound: the rule plans eta + 1 steps ahead (their prompts, seeds and GT rows
# in memory) and each metrics row carries eta + 4 staleness keys; AReaL's ablation stops at eta = 8
# (Fu et al. 2025), and 10^5 wrote a 4.8 MB metrics.jsonl for 2 steps.
MAX_STALENESS = 32


class RolloutConfig(Section):
    engine: str = Field("hf", description="rollout engine: hf | vllm | auto (vllm where installed, else hf)")
    vllm: VLLMConfig = VLLMConfig()
    importance_correction: ImportanceCorrectionConfig = ImportanceCorrectionConfig()
    temperature: float = Field(1.0, gt=0, description="sampling temperature of training rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="must be 1 for training rollouts (see _full_distribution)")
    max_turns: int = Field(4, ge=1, description="agent turns per episode")
    max_new_tokens: int = Field(48, ge=1, description="tokens generated per turn")
    max_response_tokens: int = Field(384, ge=1, description="model + env tokens of one trajectory")
    n: int = Field(4, ge=1, description="group size: rollouts per prompt")
    batch_size: int = Field(32, ge=1, description="trajectories generated together")
    max_concurrency: int = Field(
        256, ge=1, description="trajectories in flight at once in the asynchronous agent loop (each its own task)"
    )
    search_timeout_s: float | None = Field(
        None,
        gt=0,
        description="a search's time limit; past it (and one retry alone) the trajectory ends (search_timeout)",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=MAX_STALENESS,
        description="eta: rollouts may run ahead of the update by this many policy versions (AReaL's admission rule, "
        "the decoupled objective, weights synced between turns: trainer/steps/pipelined.py); 0 = the synchronous loop; "
        f"a whole number, at most {MAX_STALENESS}",
    )
    decoupled: bool = Field(
        True,
        description="with max_staleness > 0: AReaL's decoupled PPO (clip against pi_prox, the update's start, times "
        "the clamped behaviour weight pi_prox / pi_behav: importance_correction forced on); false = naive PPO for the "
        "ablation (the ratio pi_theta / pi_behav against the stale sampler's log-probs, importance_correction as set)",
    )
    copy_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="with max_staleness > 0 and the hf engine: the dtype of the engine's own copy of the weights (and "
        "so of its KV cache); auto = the update's compute dtype (model.dtype: bfloat16 where the device computes it "
        "natively), float32 = the master weights' (the numbers eta 0 samples and evaluates with)",
    )
    wait_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="with max_staleness > 0: the longest the trainer waits on the rollouts (a batch's episodes, the "
        "new weights loaded, a pause); past it the run ends naming the wait and the resume command",
    )

    @field_validator("max_staleness", mode="before")
    @classmethod
    def _whole_versions(cls, v: Any) -> Any:
        # YAML reads `on`, `yes`, `true` as True, which an int field would take as 1
        if isinstance(v, bool):
            raise ValueError(f"a whole number of policy versions (0 ... {MAX_STALENESS}) is wanted, not true or false")
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        from pvpo.trainer.rollout.engine import check_engine

        return check_engine(v)  # a known engine whose package (e.g. vllm) is installed

    @field_validator("top_p")
    @classmethod
    def _full_distribution(cls, v: float) -> float:
        # vLLM reports top-p log-probs renormalised over the nucleus while the trainer computes them
        # over the whole vocabulary, so every PPO ratio would be off by the nucleus mass.
        if v < 1.0:
            raise ValueError(
                f"top_p={v} is not allowed for training rollouts: the sampler's log-probs would be "
                "renormalised over the nucleus and no longer match the trainer's (PPO ratios off). "
                "Use rollout.top_p=1; top-p belongs to evaluation: run.eval_top_p"
            )
        return v

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for `build_engine(self.engine, ...)` beyond model and tokenizer."""
        section = getattr(self, self.engine, None)
        return section.model_dump() if isinstance(section, BaseModel) else {}
