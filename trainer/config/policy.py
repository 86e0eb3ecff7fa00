"""The policy's config sections: the model to train (`model`: a path or a tiny model built here,
its device, precision, attention, warm start) and its LoRA adapters, with the device and attention
names they accept."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pvpo.trainer.config.section import Section

DEVICE_CHOICES = ("auto", "cpu", "cuda")
ATTN_CHOICES = ("sdpa", "eager", "flash_attention_2")


def check_device_name(name: str) -> str:
    """`auto`, `cpu`, `cuda` or `cuda:N`; anything else raises ValueError listing the choices."""
    if name in DEVICE_CHOICES or (name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise ValueError(f"unknown device {name!r}; choose one of {list(DEVICE_CHOICES)} or cuda:N")


def check_attn_implementation(name: str) -> str:
    """One of `ATTN_CHOICES`; ValueError listing them otherwise."""
    if name not in ATTN_CHOICES:
        raise ValueError(f"unknown attn_implementation {name!r}; choose one of {list(ATTN_CHOICES)}")
    return name


class TinyModelConfig(Section):
    """A small Qwen2 policy built from scratch (used when `model.path` is null)."""

    hidden_size: int = Field(96, ge=8, description="width of the tiny Qwen2 policy")
    num_layers: int = Field(2, ge=1, description="decoder layers")
    num_heads: int = Field(4, ge=1, description="attention heads (hidden_size must divide by it)")
    num_kv_heads: int = Field(
        2, ge=1, description="key/value heads, grouped-query attention (num_heads must divide by it)"
    )
    intermediate_size: int = Field(256, ge=8, description="MLP width")
    vocab_size: int = Field(1024, ge=300, description="size of the BPE vocabulary trained on the corpus and questions")
    max_position_embeddings: int = Field(2048, ge=64, description="longest sequence, in tokens")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads and num_heads by num_kv_heads")
        return self


class LoRAConfig(Section):
    """Low-rank adapters via peft (Hu et al. 2021, arXiv:2106.09685) instead of full fine-tuning:
    only the adapters train; checkpoints hold the merged weights (`policy/`, loadable by vLLM and
    transformers) and the adapter (`adapter/`)."""

    enabled: bool = Field(
        False, description="train low-rank adapters instead of all weights (peft; sharded with FSDP2 under torchrun)"
    )
    r: int = Field(16, ge=1, description="adapter rank")
    alpha: int = Field(32, ge=1, description="adapter scale numerator: the update is scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the modules that get adapters",
    )


class ModelConfig(Section):
    path: str | None = Field(
        None,
        description="a Hugging Face causal LM (local dir or hub id), a catalog name (`pvpo models list`, e.g. smollm2-135m-instruct) or a *.gguf file; null = build the tiny policy",
    )
    chat_template: bool = Field(False, description="wrap each prompt as a user turn with the tokenizer's chat template")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32",
        description="compute dtype: the trained policy keeps float32 master weights and AdamW state and computes in it (autocast on one device, FSDP2 MixedPrecisionPolicy when sharded); auto = bfloat16 where the device computes it natively (CUDA with bf16, x86 CPUs with AVX512-BF16 or AMX), float32 elsewhere, resolved when the run starts",
    )
    device: str = Field(
        "auto", description="auto (CUDA when present) | cpu | cuda | cuda:N; under torchrun cuda = cuda:$LOCAL_RANK"
    )
    attn_implementation: str = Field(
        "sdpa", description="sdpa | eager | flash_attention_2 (falls back to sdpa without flash-attn or CUDA)"
    )
    gradient_checkpointing: bool = Field(False, description="recompute decoder-layer activations in the backward pass")
    lora: LoRAConfig = LoRAConfig()
    warm_start_steps: int = Field(
        0, ge=0, description="supervised steps on oracle trajectories before RL (data.source: synthetic only)"
    )
    warm_start_lr: float = Field(3e-3, gt=0, description="learning rate of the warm start")
    warm_start_batch_size: int = Field(16, ge=1, description="oracle trajectories per warm-start step")

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        return check_device_name(v)

    @field_validator("attn_implementation")
    @classmethod
    def _known_attn(cls, v: str) -> str:
        return check_attn_implementation(v)
