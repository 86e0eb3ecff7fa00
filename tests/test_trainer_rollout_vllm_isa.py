"""vLLM's CPU kernels follow torch's ISA cap: an AVX-512 machine capped to AVX2 (ATEN_CPU_CAPABILITY,
ONEDNN_MAX_CPU_ISA) must not time its rollouts with AVX-512 kernels."""

from __future__ import annotations

import pytest
import torch

from pvpo.trainer.rollout.vllm_isa import follow_isa_cap


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch):
    """The machine answers as an AVX512-BF16 CPU whatever it is; restored after the test."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return monkeypatch


def test_an_avx2_capped_torch_makes_vllm_see_a_cpu_without_avx512(probes) -> None:
    probes.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert follow_isa_cap()
    assert not torch.cpu._is_avx512_supported() and not torch.cpu._is_avx512_bf16_supported()


def test_a_onednn_cap_below_bf16_takes_vllms_bf16_kernels_away_only(probes) -> None:
    probes.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    probes.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert follow_isa_cap()
    assert torch.cpu._is_avx512_supported() and not torch.cpu._is_avx512_bf16_supported()


def test_an_uncapped_avx512_torch_leaves_vllms_choice_alone(probes) -> None:
    probes.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert not follow_isa_cap()
    assert torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported()
