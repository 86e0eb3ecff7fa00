"""bench/recipe/recipe_record.py: the record's peak is the larger of the run's and the sampled one, each
phase's range over the steps, verdicts against the bars (AVX2's are longer), a non-empty run dir
refused, and a real (smoke) run recorded end to end and re-rendered from its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.recipe import recipe_record as rr  # noqa: E402

MACHINE = {"cpu": "Test CPU", "cores": 2, "flags": ["avx2"], "memory_gib": 8.0, "gpu": None, "python": "3.11"}
MACHINE |= {"commit": "abc", "load": 0.1}


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 1, "mem/warm_start_peak_rss_gib": 6.5, "mem/train_peak_rss_gib": 7.0, "mem/process_peak_rss_gib": 7.1},
        {
            "step": 2,
            "mem/train_peak_rss_gib": 7.6,
            "mem/eval_peak_rss_gib": 6.0,
            "mem/process_peak_rss_gib": 7.6,
            "eval/accuracy": 0.2,
            "eval/format_ok": 0.9,
        },
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = {"eval/accuracy": 0.1, "eval/format_ok": 0.8, "eval/n": 150.0}
    (run / "eval_before.json").write_text(json.dumps({"metrics": before}))
    return run


def test_the_record_takes_the_larger_peak_each_phases_range_and_the_evaluation(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    rec = rr.build_record(
        run, "pvpo demo", avx2=False, wall_s=95 * 60, sampled_peak_gib=7.9, returncode=0, machine=MACHINE
    )
    assert rec["run_peak_gib"] == 7.6 and rec["peak_gib"] == 7.9  # the sampling saw more than the run logged
    assert rec["phases"] == {"warm_start": (6.5, 6.5), "train": (7.0, 7.6), "eval": (6.0, 6.0)}
    assert rec["evaluation"] == {
        "n": 150.0,
        "em_before": 0.1,
        "em_after": 0.2,
        "format_before": 0.8,
        "format_after": 0.9,
    }
    text = rr.render(rec)
    assert "| wall time | 95.0 min | <= 90 min | missed by 5.00 |" in text
    assert "| peak resident memory | 7.90 GiB (run 7.60, sampled 7.90) | <= 8 GiB | met |" in text
    assert "| train | 7.00 - 7.60 |" in text and "| warm_start | 6.50 |" in text
    assert "EM 0.100 -> 0.200, format ok 0.800 -> 0.900" in text
    # without AVX-512 the time bar is 150 minutes
    rec2 = rr.build_record(run, "x", avx2=True, wall_s=95 * 60, sampled_peak_gib=None, returncode=0, machine=MACHINE)
    assert "| wall time | 95.0 min | <= 150 min | met |" in rr.render(rec2)
    assert rec2["peak_gib"] == 7.6


def test_a_record_without_metrics_says_not_measured(tmp_path: Path) -> None:
    rec = rr.build_record(tmp_path, "x", avx2=False, wall_s=None, sampled_peak_gib=None, returncode=1, machine=MACHINE)
    text = rr.render(rec)
    assert "| wall time | n/a min | <= 90 min | not measured |" in text
    assert "EM n/a -> n/a" in text and "exit status 1" in text


def test_the_command_runs_the_demo_directly_or_through_the_avx2_caps(tmp_path: Path) -> None:
    plain = rr.command(tmp_path, "real_smollm2_multihop", ["a=1"], avx2=False)
    assert plain[1:] == [
        "-m",
        "pvpo.cli",
        "demo",
        "--config",
        "real_smollm2_multihop",
        "--run-dir",
        str(tmp_path),
        "a=1",
    ]
    capped = rr.command(tmp_path, "real_smollm2_multihop", [], avx2=True)
    assert capped[1].endswith("avx2_emulated.py") and capped[2] == "demo"


def test_a_run_dir_with_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(SystemExit):
        rr.main(["--run-dir", str(run)])
    assert "not empty" in capsys.readouterr().err


@pytest.mark.slow
def test_a_smoke_run_is_recorded_and_rendered_again_from_its_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "recipe" / "recipe_record.py"),
            "--config",
            "smoke",
            "--run-dir",
            str(run),
            "--",
            "run.steps=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads((run / "record.json").read_text())
    assert rec["returncode"] == 0 and rec["wall_s"] > 0 and rec["sampled_peak_gib"] > 0.1
    assert rec["run_peak_gib"] > 0.1 and {"train", "rollout", "eval"} <= set(rec["phases"])
    assert rec["evaluation"]["em_before"] is not None and rec["evaluation"]["em_after"] is not None
    first = (run / "record.md").read_text()
    again = subprocess.run(
        [sys.executable, str(BENCH / "recipe" / "recipe_record.py"), "--run-dir", str(run), "--report-only"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert (run / "record.md").read_text() == first  # the same record, its start date included
