"""What this machine computes natively, as torch is configured to use it: one answer for the
trainer's `model.dtype: auto` and the retriever's `encoder_dtype: auto`.

bf16 pays on a CPU only where its matrix products run in hardware (AVX512-BF16 or AMX); elsewhere
torch emulates it and float32 is the faster choice (a MiniLM-sized layer ran about 8x slower in bf16
than in float32 on an AVX2-only CPU). The hardware probes alone are not enough: with
`ATEN_CPU_CAPABILITY=avx2` (torch's kernels) or `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's), an AVX-512
CPU runs as one without AVX-512 does, and bf16 is emulated there too.
"""

from __future__ import annotations

import os

# oneDNN's ISA caps that leave AVX512-BF16 / AMX usable (its documented values; unset = all)
_ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10_2_512", "DEFAULT", "ALL")


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
