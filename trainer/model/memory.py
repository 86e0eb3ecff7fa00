"""How much memory a training micro-batch takes, the default token budget derived from it, and
the check that refuses one that cannot fit (one line naming the fix) before it is allocated.

Activation bytes per padded token of a decoder in rows of T tokens (float32, no activation
checkpointing) are taken as `layers * (6 * hidden + 2 * intermediate) * 4` plus two `[V]` float32
rows (the logits and their gradient) plus `layers * heads * T * 8` (the attention probabilities a
row keeps for the backward where SDPA falls back to its math kernel, as it does on CPU with padding:
two float32 copies); with checkpointing, one layer's worth of each plus `layers * 2 * hidden * 4`.
Measured on SmolLM2-135M (30 layers, 9 heads, hidden 576, intermediate 1536, vocab 49,152; CPU,
one micro-batch's forward + backward + AdamW step, peak RSS above the warm model + AdamW state):
1.45 GiB for 2 rows x 512 tokens and 2.29 GiB for 1 row x 1,024, against 2.3 and 3.4 GiB
estimated; 0.55 GiB for 2 x 512 with checkpointing. The estimate errs on the safe side (~1.5-2x),
which the default budget relies on and the fit check allows for (it refuses only what even half
the estimate cannot fit). Rejected: a budget in padded tokens alone, which let 3 rows of 1,024 tokens
into one micro-batch and peaked at 11.7 GiB RSS (the attention term grows with the row length).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

# share of the available memory the activations of one micro-batch may take by default, and a cap:
# beyond ~4k tokens a micro-batch is no faster per token on CPU (the matmuls are already large)
DEFAULT_SHARE = 0.3
DEFAULT_CAP_BYTES = 4 * 2**30
MIN_TOKENS, MAX_TOKENS, ROUND = 256, 65536, 256


class MemoryBudgetError(ValueError):
    """A micro-batch that cannot fit in the memory available (raised before it is allocated)."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape | None:
        """The shape of a transformers causal LM (None for a module without such a config)."""
        cfg: Any = getattr(model, "config", None)
        cfg = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
        try:
            hidden = int(cfg.hidden_size)
            return cls(
                int(cfg.num_hidden_layers),
                hidden,
                int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
                int(cfg.vocab_size),
                int(getattr(cfg, "num_attention_heads", None) or 1),
            )
        except (AttributeError, TypeError):
            return None

    def bytes_per_token(self, *, checkpointing: bool, seq_len: int) -> int:
        """Estimated activation bytes of one padded token, in rows of `seq_len` tokens, in a
        training forward + backward."""
        layer = (6 * self.hidden + 2 * self.intermediate) * 4 + self.heads * seq_len * 8
        logits = 2 * self.vocab * 4
        if checkpointing:
            return self.layers * 2 * self.hidden * 4 + layer + logits
        return self.layers * layer + logits


def _meminfo_bytes(key: str) -> int | None:
    try:
        m = re.search(rf"^{key}:\s+(\d+) kB", open("/proc/meminfo").read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def available_bytes(device: torch.device) -> int | None:
    """Free memory of `device`: the GPU's free memory, or the host's MemAvailable (+ what this
    process already holds is not counted: it is in use); None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return _meminfo_bytes("MemAvailable")


def checkpointing_enabled(model: torch.nn.Module) -> bool:
    """Whether `model` recomputes its decoder layers' activations in the backward."""
    # transformers 5 names it is_activation_checkpointing (is_gradient_checkpointing warns)
    flag = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    return bool(getattr(model, flag, False))


def step_fixed_bytes(model: torch.nn.Module, device: torch.device) -> int:
    """Bytes a training step allocates beside its activations whatever its micro-batch: each
    trainable parameter's gradient (freed between steps, `zero_grad(set_to_none=True)`) and, under
    16-bit autocast on `device` (the caller's context), the 16-bit copies of the float32 weights
    that autocast keeps for the step. Without them a short micro-batch on a large tied vocabulary
    was estimated at a third of what it took (`bench/training/step_memory.py`, 262,144-token vocabulary,
    one row of 237 tokens: 1.63 GiB measured, 0.62 estimated; 2.06 with these bytes). AdamW's
    parameter-sized temporary is not added: it lives after the backward has freed the activations."""

    def local(p: torch.Tensor) -> torch.Tensor:
        return getattr(p, "_local_tensor", p)  # an FSDP2 shard holds its own part only

    grads = sum(local(p).numel() * local(p).element_size() for p in model.parameters() if p.requires_grad)
    copies = 0
    if torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) in (
        torch.bfloat16,
        torch.float16,
    ):
        copies = sum(local(p).numel() * 2 for p in model.parameters() if p.dtype == torch.float32)
    return int(grads + copies)


def default_max_tokens(
    model: torch.nn.Module, device: torch.device, *, checkpointing: bool, seq_len: int
) -> int | None:
    """`optim.max_tokens_per_micro_batch` when unset, for rows of up to `seq_len` tokens: the padded
    tokens whose estimated activations take min(30% of the memory left once the step's fixed
    bytes (`step_fixed_bytes`) are set aside, 4 GiB), rounded down to 256, within [256, 65536];
    None when the model's shape or the memory is unknown (then micro-batches go by row count)."""
    shape, free = ModelShape.of(model), available_bytes(device)
    if shape is None or free is None:
        return None
    per = shape.bytes_per_token(checkpointing=checkpointing, seq_len=seq_len)
    left = max(0, free - step_fixed_bytes(model, device))
    tokens = int(min(left * DEFAULT_SHARE, DEFAULT_CAP_BYTES) // per) // ROUND * ROUND
    return max(MIN_TOKENS, min(MAX_TOKENS, tokens))


def check_fits(
    model: torch.nn.Module, device: torch.device, padded_tokens: int, *, checkpointing: bool, seq_len: int
) -> None:
    """MemoryBudgetError (one line: the need, what is free, the fix) when a micro-batch of
    `padded_tokens` in rows of `seq_len` cannot fit even at half its estimated activations on top
    of the step's fixed bytes (`step_fixed_bytes`); nothing when it may."""
    shape, free = ModelShape.of(model), available_bytes(device)
    if shape is None or free is None:
        return
    need = padded_tokens * shape.bytes_per_token(checkpointing=checkpointing, seq_len=seq_len)
    fixed = step_fixed_bytes(model, device)
    if need / 2 + fixed > free:
        raise MemoryBudgetError(
            f"a training micro-batch of {padded_tokens} padded tokens needs ~{need / 2**30:.1f} GiB of activations "
            f"and {fixed / 2**30:.1f} GiB of gradients and weight copies, "
            f"{free / 2**30:.1f} GiB free on {device}; fix: lower optim.max_tokens_per_micro_batch "
            "(a single longer row: lower data.max_response_tokens / env.max_turns) or set model.gradient_checkpointing=true"
        )


def _status_kib(key: str) -> int | None:
    try:
        m = re.search(rf"^{key}:\s+(\d+) kB", open("/proc/self/status").read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


# The kernel keeps one peak-RSS counter a process (VmHWM), which `reset_peak_rss` restarts for each
# phase; the exit status that `/usr/bin/time` and `getrusage` report is that counter's value at exit,
# so after a reset they give the peak since the last phase began, not the run's (measured: a process
# that touched 1 GB, reset, then touched 100 MB reports 125 MB). The largest value seen before any
# reset is kept here, so `process_peak_rss_gib` still gives the whole run's peak.
_peak_before_resets_kib = 0


def reset_peak_rss() -> bool:
    """Restart this process's peak-RSS counter (Linux `/proc/self/clear_refs` 5), keeping the peak so
    far for `process_peak_rss_gib`; False where it cannot."""
    global _peak_before_resets_kib
    before = _status_kib("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    _peak_before_resets_kib = max(_peak_before_resets_kib, before or 0)
    return True


def peak_rss_gib() -> float | None:
    """This process's peak resident memory since the last `reset_peak_rss` (VmHWM), in GiB."""
    kib = _status_kib("VmHWM")
    return kib / 2**20 if kib is not None else None


def process_peak_rss_gib() -> float | None:
    """This process's peak resident memory since it started, across `reset_peak_rss` calls, in GiB
    (what `/usr/bin/time` would report had nothing reset the counter)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        return None
    return max(kib, _peak_before_resets_kib) / 2**20


def _libc_function(name: str) -> Any:
    """The C library's function `name`, or None where there is no such library or function."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.util.find_library("c")
        return getattr(ctypes.CDLL(lib), name, None) if lib else None
    except OSError:
        return None


# glibc's mallopt parameter numbers (malloc.h) and the threshold the CPU trainer sets: blocks of
# 4 MiB or more are mmapped and go back to the kernel when freed. glibc's own threshold is dynamic:
# it rises to the largest block freed so far (up to 32 MiB), after which an update's activations
# stay in the heap. Measured on the multi-hop recipe (SmolLM2, vLLM rollouts, CPU): with
# MALLOC_MMAP_THRESHOLD_=4194304 the resumed run peaked at 8.5 GiB over steps 9-16 against 9.6 GiB
# for the same steps' first process without it (docs/benchmarks/real-recipe.md).
M_MMAP_THRESHOLD = -3
CPU_MMAP_THRESHOLD_BYTES = 4 * 2**20


def limit_heap_retention(threshold_bytes: int = CPU_MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold_bytes` (`mallopt(M_MMAP_THRESHOLD)`), so that large
    freed blocks leave the process at once rather than staying in its heap; the environment's
    `MALLOC_MMAP_THRESHOLD_`, when set, wins. False where the C library has no mallopt or refuses."""
    import os

    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))


def release_freed_heap() -> bool:
    """Give the heap memory this process has freed back to the kernel (glibc's `malloc_trim(0)`);
    False where the C library has no such call. A CPU update's activations are freed into glibc's
    heap, which keeps them resident: `bench/training/heap_retention.py` measured 9.41 of 11.31 GiB resident as
    free heap after a SmolLM2 update (8 rows x 1,024 tokens), 1.91 GiB after the trim (0.8 s), so
    without it every later phase stacked on the update's high-water mark."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
