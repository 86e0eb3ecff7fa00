"""bf16 is chosen (model.dtype: auto, retriever.encoder_dtype: auto) only where this CPU computes it
natively for torch as it runs now: the hardware probes, torch's kernel dispatch and oneDNN's ISA cap."""

from __future__ import annotations

import pytest
import torch

from pvpo.hardware import cpu_bf16_native
from pvpo.retriever.encoder import check_dtype, resolve_dtype


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch):
    """An AVX512-BF16 CPU, torch dispatching at AVX-512, no oneDNN cap (whatever this machine is)."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return monkeypatch


def test_native_bf16_needs_the_hardware_torchs_dispatch_and_onednn_together(bf16_cpu) -> None:
    assert cpu_bf16_native()
    bf16_cpu.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATEN_CPU_CAPABILITY=avx2
    assert not cpu_bf16_native()
    bf16_cpu.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    bf16_cpu.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu_bf16_native()
    bf16_cpu.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")  # oneDNN reads its cap case-insensitively
    assert cpu_bf16_native()


def test_the_encoders_auto_dtype_is_bf16_only_on_a_native_bf16_cpu_and_fp16_on_gpu(bf16_cpu) -> None:
    assert resolve_dtype("auto", "cpu") == "bfloat16"
    bf16_cpu.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("auto", "cuda:0") == "float16"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"  # an explicit dtype is kept
    with pytest.raises(ValueError, match="unknown encoder dtype 'bf16'; options: float32, float16, bfloat16, auto"):
        check_dtype("bf16")


def test_the_recipe_asks_for_the_encoders_auto_dtype() -> None:
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(resolve_config("real_smollm2_multihop"), ["data.source=[a/questions.json, b/questions.json]"])
    assert cfg.retriever.encoder_dtype == "auto"
