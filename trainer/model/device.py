"""Where and in what precision the trainer computes: device, dtype, attention kernel, activation
checkpointing, and the peak memory of each phase of a step.

Precision (`model.dtype`): the trained policy keeps float32 parameters (the master weights) and
float32 AdamW state; `bfloat16` / `float16` are compute dtypes, applied with `torch.autocast`
around the SFT warm start and the update (on one device), or by FSDP2's
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` (sharded; see `distributed.py`).
The transformers engine's forwards run in the agent loop's worker thread, which the caller's
autocast (thread-local) does not reach: its rollouts and evaluations compute in float32, the
same numbers `pvpo eval` of a saved policy gives on CPU. `auto` (`resolve_dtype`) picks bfloat16
only where the device computes it natively.
Rejected alternative: bf16 parameters with bf16 AdamW state, which halves optimizer memory but
rounds away updates smaller than ~2^-8 of a weight (lr 1e-6 on weights of ~1e-2 vanish); the
measured log-prob gap of either choice against float32 is in docs/guides/gpus.md ("Precision"). The frozen
reference holds its weights in the compute dtype (it never steps), and the vLLM engine loads
the compute dtype.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from pvpo.trainer.config.policy import check_attn_implementation, check_device_name
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.model.memory import limit_heap_retention, peak_rss_gib, release_freed_heap, reset_peak_rss

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """The device to train on. `auto` is CUDA when present, else CPU. Under torchrun a bare `cuda`
    (or `auto` with CUDA) is this process's GPU, `cuda:$LOCAL_RANK`."""
    check_device_name(name)
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"model.device={name!r} but CUDA is not available here; use model.device=cpu or auto")
    if name.startswith("cuda:"):
        return torch.device(name)
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def resolve_attn_implementation(name: str, device: torch.device) -> str:
    """`flash_attention_2` needs the flash-attn package and CUDA; without them it falls back to
    `sdpa` (PyTorch's fused attention), which is what most runs want anyway."""
    check_attn_implementation(name)
    if name == "flash_attention_2" and (device.type != "cuda" or importlib.util.find_spec("flash_attn") is None):
        return "sdpa"
    return name


def compute_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {list(DTYPES)}") from None


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products in hardware: a CUDA GPU with bf16, or an x86
    CPU with AVX512-BF16 or AMX that torch and oneDNN are allowed to use (`pvpo.hardware`; elsewhere a
    CPU emulates bf16 and float32 is the faster choice)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    from pvpo.hardware import cpu_bf16_native

    return cpu_bf16_native()


def resolve_dtype(name: str, device: torch.device) -> str:
    """`model.dtype` as a dtype name: `auto` is bfloat16 where `native_bf16(device)`, else float32.
    Measured on a 2-core AVX512-BF16 CPU (docs/guides/gpus.md, "Precision"): one SmolLM2-135M update 1.9x
    faster under bf16 autocast than in float32 (`bench/training/train_step.py --dtype`)."""
    if name != "auto":
        compute_dtype(name)
        return name
    return "bfloat16" if native_bf16(device) else "float32"


def with_resolved_dtype(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """`cfg` with `model.dtype: auto` replaced by what it resolves to on `device` (`resolve_dtype`),
    so the run's config.yaml, the policy, the reference and the engines all name one dtype."""
    dtype = resolve_dtype(cfg.model.dtype, device)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[None]:
    """`torch.autocast` to `dtype` on `device`, or nothing when the compute dtype is float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def step_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.step()`, then drop autocast's cached low-precision copies of the weights, so the
    next forward inside the same `torch.autocast` region computes with the weights just written.
    autocast casts each float32 parameter once per region and reuses the cast until the region
    exits; a loop of several optimizer steps inside one region (SFT, PPO epochs, mini-batches, the
    critic's epochs) otherwise trains on the first step's weights over and over. Measured: SmolLM2's
    warm start in bf16 on CPU ended at SFT loss 0.80 with the stale casts, 0.14 without (0.127 once
    the policy also loaded in float32), 0.12 in float32."""
    optimizer.step()
    torch.clear_autocast_cache()


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (transformers' own
    checkpointing, non-reentrant so it composes with FSDP2 and frozen inputs); generation in
    eval mode still uses the KV cache."""
    hf: Any = model  # transformers' API on top of nn.Module (torch types unknown attributes as Tensor | Module)
    # transformers 5 renamed it activation_checkpointing_enable (the old name warns, removal in v6)
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(hf.config, "use_cache", False):
        hf.config.use_cache = False  # training forwards; the engines pass use_cache explicitly


@dataclass
class Placement:
    """The resolved device / precision settings of a run."""

    device: torch.device
    dtype: torch.dtype  # compute dtype
    attn_implementation: str
    gradient_checkpointing: bool
    sharded: bool = False  # FSDP2 casts to the compute dtype itself (MixedPrecisionPolicy): no autocast

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.sharded else autocast(self.device, self.dtype)


def placement(
    device: str = "auto",
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
) -> Placement:
    """Resolve the `model.*` placement keys."""
    dev = resolve_device(device)
    return Placement(
        dev,
        compute_dtype(resolve_dtype(dtype, dev)),
        resolve_attn_implementation(attn_implementation, dev),
        gradient_checkpointing,
    )


def place_policy_model(model: torch.nn.Module, where: Placement) -> torch.nn.Module:
    """Move the trained policy to its device in float32 (master weights), set its attention kernel
    and activation checkpointing; returns the same module (moved in place)."""
    model.to(device=where.device, dtype=torch.float32)
    hf: Any = model  # transformers' API on top of nn.Module
    if hasattr(hf, "set_attn_implementation"):
        hf.set_attn_implementation(where.attn_implementation)
    elif getattr(hf, "config", None) is not None:
        hf.config._attn_implementation = where.attn_implementation
    if where.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def place_reference_model(model: torch.nn.Module, where: Placement) -> torch.nn.Module:
    """The frozen reference in the compute dtype on the policy's device (it never steps, so it
    needs no float32 master copy: half the memory in bf16)."""
    return model.to(device=where.device, dtype=where.dtype)


@dataclass
class PhaseMemory:
    """Peak memory of each phase of a step: the process's peak resident memory
    (`mem/<phase>_peak_rss_gib`, Linux VmHWM reset at the phase's start; on every device), and on
    CUDA the peak accelerator memory (`mem/<phase>_peak_gib`, `torch.cuda.max_memory_allocated`
    reset at the phase's start) and the device's memory in use when the phase ends
    (`mem/<phase>_device_used_gib`)."""

    device: torch.device
    peaks: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a CPU run's update tensors go back to the kernel when freed (gloo ranks included: the
        # aborts at exit once blamed on this were ranks leaving without a barrier, and came from
        # spawned test ranks that never set it; see parallel.distributed.shutdown)
        if self.device.type != "cuda":
            limit_heap_retention()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._host(name):
            if self.device.type != "cuda":
                yield
                return
            with self._cuda(name):
                yield

    @contextlib.contextmanager
    def _host(self, name: str) -> Iterator[None]:
        ok = reset_peak_rss()
        try:
            yield
        finally:
            peak = peak_rss_gib() if ok else None
            if peak is not None:
                self.peaks[f"mem/{name}_peak_rss_gib"] = peak
            if self.device.type != "cuda":  # what the phase freed leaves the process before the next one
                release_freed_heap()

    @contextlib.contextmanager
    def _cuda(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            torch.cuda.synchronize(self.device)
            self.peaks[f"mem/{name}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            # device-wide use at the phase's end: includes vLLM's own memory pools (KV cache, weights),
            # which torch's allocator statistics do not see
            free, total = torch.cuda.mem_get_info(self.device)
            self.peaks[f"mem/{name}_device_used_gib"] = (total - free) / 2**30

    def pop(self) -> dict[str, float]:
        out, self.peaks = self.peaks, {}
        return out
