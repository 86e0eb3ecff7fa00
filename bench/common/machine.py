"""The machine record every bench prints or stores beside its figures: `pvpo.machine` (the recipes'
reports print the same line), re-exported under the name the benches import.

    from bench.common.machine import machine_line, machine_record   # the repo root on sys.path (bench/README.md)
    print(f"machine: {machine_line(('torch', 'faiss-cpu'))}")
"""

from pvpo.machine import (
    CODE,
    DEFAULT_PACKAGES,
    REPO,
    VECTOR_FLAGS,
    commit,
    cpu_model_and_flags,
    gpu_name,
    machine_line,
    machine_record,
    package_versions,
)

__all__ = [
    "CODE",
    "DEFAULT_PACKAGES",
    "REPO",
    "VECTOR_FLAGS",
    "commit",
    "cpu_model_and_flags",
    "gpu_name",
    "machine_line",
    "machine_record",
    "package_versions",
]
