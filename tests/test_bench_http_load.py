"""bench/retriever/http_load.py: the whole machine's busy, elapsed and stolen CPU time read from /proc/stat's
first line, as the retriever bench reports them beside its ratios."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.retriever import http_load as http_load  # noqa: E402


def test_busy_elapsed_and_stolen_time_come_from_the_first_line_of_proc_stat(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {3 * tick} 0 {tick} {5 * tick} {tick} 0 0 {2 * tick} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    busy, elapsed, stolen = http_load.machine_busy(stat)
    assert busy == 6.0  # user + system + steal: every tick but idle and iowait
    assert elapsed == 12.0 / (os.cpu_count() or 1)  # all ticks, per core
    assert stolen == 2.0


def test_an_old_kernel_line_without_a_steal_field_reads_as_none_stolen(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {tick} 0 0 {tick} 0 0 0\n")
    busy, _, stolen = http_load.machine_busy(stat)
    assert (busy, stolen) == (1.0, 0.0)


def test_the_live_proc_stat_reads_when_there_is_one():
    if not Path("/proc/stat").exists():
        import pytest

        pytest.skip("no /proc/stat (not Linux)")
    busy, elapsed, stolen = http_load.machine_busy()
    assert 0 <= stolen <= busy and elapsed > 0
