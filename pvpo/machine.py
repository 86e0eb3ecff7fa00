"""The machine record every benchmark and recipe report prints or stores beside its figures: the
CPU model, its cores and the vector flags that decide kernel speed, memory, the GPU, the versions of
the packages named, Python, the commit (with `+changes` when tracked code differs from it; None
outside a checkout) and the load average. One module for the benches and the recipes'
reports (a figure without these cannot be compared with another);
versions are read from the installed distributions, so recording them imports nothing.

    from pvpo.machine import machine_line
    print(f"machine: {machine_line(('torch', 'faiss-cpu'))}")
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]  # the checkout (site-packages when installed: no commit)
# the CPU features that change which kernels torch, oneDNN, ONNX Runtime and FAISS run
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# what a bench executes or reads (a change elsewhere, e.g. to the README, changes no figure)
CODE = ("bench", "configs", "envs", "evaluation", "pvpo", "recipes", "retriever", "reward", "trainer", "pyproject.toml")
DEFAULT_PACKAGES = ("torch", "transformers", "matplotlib")


def cpu_model_and_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The CPU model name and which of VECTOR_FLAGS it has (from /proc/cpuinfo; the platform's
    processor string and no flags elsewhere)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = cpuinfo.read_text()
    except OSError:
        return model, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    return model, [f for f in VECTOR_FLAGS if f in flags]


def package_versions(packages: Sequence[str]) -> dict[str, str | None]:
    """Installed version of each distribution (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_name() -> str | None:
    """The first GPU's name, memory and driver as nvidia-smi reports them; None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def commit() -> str | None:
    """The checkout's commit, `+changes` added when tracked files under CODE differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


def machine_record(packages: Sequence[str] = DEFAULT_PACKAGES) -> dict[str, Any]:
    """The record: cpu, cores (this process may use), flags, memory_gib, gpu, python, one entry
    per package (its version), commit, load (1-minute average now)."""
    model, flags = cpu_model_and_flags()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    return {
        "cpu": model,
        "cores": cores,
        "flags": flags,
        "memory_gib": None if memory is None else round(memory, 1),
        "gpu": gpu_name(),
        "python": platform.python_version(),
        **package_versions(packages),
        "commit": commit(),
        "load": round(os.getloadavg()[0], 2),
    }


def machine_line(packages: Sequence[str] = DEFAULT_PACKAGES, record: dict[str, Any] | None = None) -> str:
    """The record on one line, as benches print it above their tables."""
    r = record or machine_record(packages)
    versions = ", ".join(f"{p} {r[p]}" for p in packages if r.get(p))
    return (
        f"{r['cpu']} | {r['cores']} cores ({', '.join(r['flags']) or 'no AVX2'}) | {r['memory_gib']} GiB RAM | "
        f"{r['gpu'] or 'no GPU'} | Python {r['python']}, {versions} | commit {r['commit']} | load {r['load']}"
    )
