"""bench/recipe/avx2_emulated.py: a command run through it sees the CPU as one without AVX-512 does:
torch's kernels, our bf16 probe and FAISS's SIMD level all at AVX2 (vLLM's kernel choice, which
reads torch's probes, is checked where vLLM is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.recipe import avx2_emulated as avx2_emulated  # noqa: E402


def _check(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, str(BENCH / "recipe" / "avx2_emulated.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_command_run_through_it_sees_avx2_kernels_and_no_native_bf16() -> None:
    env = {k: v for k, v in os.environ.items() if k not in avx2_emulated.CAPS and not k.startswith("_PVPO")}
    report = _check(env)
    assert "ATen capability AVX2" in report
    assert "pvpo.hardware.cpu_bf16_native: False" in report
    assert "_is_avx512_supported=False" in report
    if "SIMD level" in report:  # faiss-cpu with run-time dispatch (1.13 and later)
        assert "SIMD level AVX2" in report
    if "vllm kernels" in report and "not installed" not in report:
        assert "_C_AVX2" in report and "_C.abi3" not in report


def test_the_caps_are_added_to_the_environment_and_nothing_else_changes() -> None:
    env = avx2_emulated.cap_environment({"PATH": "/bin", "ATEN_CPU_CAPABILITY": "default"})
    assert env["PATH"] == "/bin" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["FAISS_SIMD_LEVEL"] == "AVX2"


def test_without_a_command_it_prints_its_use_and_fails() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "recipe" / "avx2_emulated.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "ATEN_CPU_CAPABILITY" in out.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_mapped_libraries_are_read_from_this_process() -> None:
    assert any(name.startswith("libc") or "python" in name for name in avx2_emulated._mapped("lib"))
