"""bench/faults/run.py's table: a probe that cannot run here is "not run", never a pass, and the total
counts the probes that ran; the probe groups import each other in one direction only."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.faults.probes import Row, not_run, table, total  # noqa: E402


def test_a_probe_that_could_not_run_is_not_a_pass_and_the_total_says_how_many_ran(tmp_path: Path) -> None:
    rows = [Row("a", "fine", True), Row("b", "broken", False), not_run("c", "mounting a tmpfs needs root")]
    assert total(rows) == "1/2 as due, 1 not run"
    assert total(rows[:1]) == "1/1 as due"
    shown = table("t", rows, tmp_path)
    assert "| c | not run: mounting a tmpfs needs root | not run |" in shown and "| b | broken | **NO** |" in shown


def test_a_quoted_reply_with_brackets_is_no_markdown_link_but_code_spans_stay_as_written(tmp_path: Path) -> None:
    """`result[0][0]` in a row's result read as a reference link, which mkdocs --strict refuses."""
    shown = table("t", [Row("a", "malformed reply: result[0][0] is str; try `q[1]`", True)], tmp_path)
    assert "| a | malformed reply: result\\[0\\]\\[0\\] is str; try `q[1]` | yes |" in shown


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the tmpfs mounts and the probe runs")
def test_the_full_disk_probe_without_root_reports_not_run(tmp_path: Path) -> None:
    from bench.faults.concurrency_disk import ConcurrencyDisk

    row = ConcurrencyDisk(tmp_path).full_disk()
    assert row.ok is None and row.verdict == "not run"


def test_the_fault_groups_import_the_shared_probes_and_never_the_runner_or_each_other() -> None:
    groups = ["stops_outages", "concurrency_disk", "hostile_user", "secrets_input", "ownership", "viewer", "probes"]
    for name in groups:
        tree = ast.parse((BENCH / "faults" / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        forbidden = {f"bench.faults.{g}" for g in ["run", *groups]} - {f"bench.faults.{name}", "bench.faults.probes"}
        assert not imported & forbidden, (name, imported)
