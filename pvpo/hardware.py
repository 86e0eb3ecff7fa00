"""What this machine computes natively, as torch is configured to use it: one answer for the
trainer's `model.dtype: auto` and the retriever's `encoder_dtype: auto`; and how many CPU threads
torch should take beside the work already running (`pvpo eval --threads`).

bf16 pays on a CPU only where its matrix products run in hardware (AVX512-BF16 or AMX); elsewhere
torch emulates it and float32 is the faster choice (a MiniLM-sized layer ran about 8x slower in bf16
than in float32 on an AVX2-only CPU). The hardware probes alone are not enough: with
`ATEN_CPU_CAPABILITY=avx2` (torch's kernels) or `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's), an AVX-512
CPU runs as one without AVX-512 does, and bf16 is emulated there too.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# oneDNN's ISA caps that leave AVX512-BF16 / AMX usable (its documented values; unset = all)
_ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX10_2_512",
    "DEFAULT",
    "ALL",
)


def onednn_allows_bf16() -> bool:
    """Whether oneDNN's ISA cap (`ONEDNN_MAX_CPU_ISA`, or the older `DNNL_MAX_CPU_ISA`) lets it use
    the CPU's bf16 instructions; True when no cap is set."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return cap is None or cap.strip().upper().startswith(_ONEDNN_BF16_ISAS)


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 matrix products in hardware for torch as it runs now: AVX512-BF16
    or AMX present, torch's kernels dispatched at AVX-512 (not capped by `ATEN_CPU_CAPABILITY`), and
    oneDNN not capped below them."""
    import torch

    probes = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    hardware = any(bool(p()) for p in probes if callable(p))  # private probes; a torch without them reads "no"
    dispatch = torch.backends.cpu.get_cpu_capability().upper().startswith(("AVX512", "AMX"))
    return hardware and dispatch and onednn_allows_bf16()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def threads_for(cpus: int, load: float, most: int) -> int:
    """The torch threads for a process starting on `cpus` CPUs that other work keeps `load` busy
    (the 1-minute load average): the CPUs left idle, rounded, at least 1 and at most `most`
    (torch's own choice, its physical cores). A pool wider than the idle CPUs waits on the other
    work at every step: SmolLM2-135M decoded 0.3 tokens/s greedy with torch's 2 threads on 2 cores
    at load average 9.7, and 3.5-3.8 with 1 (`bench/eval/eval_threads.py`)."""
    return max(1, min(most, cpus - round(load)))


def choose_torch_threads(requested: int | None = None) -> tuple[int, str]:
    """Set torch's CPU threads: `requested`, else `OMP_NUM_THREADS` where set (torch reads it),
    else `threads_for` this machine now. Returns the number and a line saying why."""
    import torch

    if requested is not None:
        torch.set_num_threads(max(1, requested))
        n = torch.get_num_threads()
        return n, f"torch: {_threads(n)} (--threads)"
    if os.environ.get("OMP_NUM_THREADS"):
        n = torch.get_num_threads()
        return n, f"torch: {_threads(n)} (OMP_NUM_THREADS)"
    cpus, load = usable_cpus(), os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    n = threads_for(cpus, load, torch.get_num_threads())
    torch.set_num_threads(n)
    return n, f"torch: {_threads(n)} ({cpus} CPUs, load average {load:.1f} from other work; --threads N to change)"


def carry_torch_threads() -> Callable[[], None]:
    """A function that gives the thread it runs in the calling thread's torch CPU thread count.

    OpenMP keeps that count per thread: a thread started later begins at the process default (every
    core), not at what `choose_torch_threads` or `run.threads` set, until torch's own ops reset it;
    kernels that read OpenMP directly never do. Run it first in each thread that computes on the
    caller's behalf (rollout threads, their executors). vLLM's CPU attention requires it: its batch
    plan, made at the stepping thread's OpenMP count, must equal the count the engine was built with
    (an engine built at 1 thread, stepped from a new thread at 2, fails every step: `cpu_attn_impl.hpp`
    "Check failed: thread_num (2 vs. 1)")."""
    import torch

    n = torch.get_num_threads()
    # torch's own setter: vLLM's CPU worker replaces `torch.set_num_threads` with a no-op once it
    # has bound its threads, which would leave the new thread at the process default
    set_threads = torch._C.set_num_threads

    def apply() -> None:
        set_threads(n)

    return apply


def _threads(n: int) -> str:
    return f"{n} CPU thread" + ("" if n == 1 else "s")
