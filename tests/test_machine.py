"""pvpo/machine.py: the one machine record every bench and recipe report prints beside its figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from pvpo import machine


def test_the_cpu_model_and_the_vector_flags_that_matter_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse amx_tile avx2 avx512f\n")
    assert machine.cpu_model_and_flags(info) == ("Test CPU 9000", ["avx2", "avx512f", "amx_tile"])


def test_the_record_holds_package_versions_and_the_commit_with_its_changes() -> None:
    record = machine.machine_record(("numpy", "no-such-distribution"))
    assert record["numpy"] == np.__version__ and record["no-such-distribution"] is None
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=machine.REPO, capture_output=True, text=True
    ).stdout.strip()
    assert record["commit"] in (head, head + "+changes") and record["cores"] >= 1
    line = machine.machine_line(("numpy",), record)
    assert record["cpu"] in line and f"numpy {np.__version__}" in line and f"commit {record['commit']}" in line
