"""bench/async_rl.py pipeline: each eta trained in a process of its own, its row kept in its run
folder so that a rerun keeps finished runs (and reruns one of other settings), and a --from-run
start that is one of the bench's own folders refused rather than deleted."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))

import async_rl  # noqa: E402
from trainer_support import TINY  # noqa: E402


def test_a_kept_row_is_used_only_for_the_same_config_and_overrides(tmp_path):
    run = tmp_path / "eta1"
    run.mkdir()
    assert async_rl.kept_row(run, "demo", ["a=1"]) is None  # nothing finished there
    (run / async_rl.ROW).write_text("{torn")
    assert async_rl.kept_row(run, "demo", ["a=1"]) is None  # a torn row is a run to redo
    row = {"config": "demo", "overrides": ["a=1"], "eta": 1}
    (run / async_rl.ROW).write_text(json.dumps(row))
    assert async_rl.kept_row(run, "demo", ["a=1"]) == row
    assert async_rl.kept_row(run, "demo", ["a=2"]) is None
    assert async_rl.kept_row(run, "real_smollm2_multihop", ["a=1"]) is None  # another config


def test_a_from_run_start_inside_the_bench_folders_is_refused_not_deleted(tmp_path):
    start = tmp_path / "eta0"
    (start / "initial_policy").mkdir(parents=True)
    (start / "initial_policy" / "config.json").write_text("{}")
    args = Namespace(etas=[0], seeds=None, steps=1, overrides=[], config="demo", out=str(tmp_path), from_run=str(start))
    with pytest.raises(SystemExit, match="own run folder"):
        async_rl.pipeline(args)
    assert (start / "initial_policy" / "config.json").is_file()


@pytest.mark.slow
def test_each_eta_runs_in_its_own_process_and_a_rerun_keeps_the_finished_runs(tmp_path, capsys):
    overrides = [
        *TINY,
        "data.max_train_examples=4",
        "data.warm_start_examples=4",
        "model.warm_start_steps=2",
        "run.eval_every=0",
    ]
    args = Namespace(
        etas=[0, 1], seeds=None, steps=2, overrides=overrides, config="demo", out=str(tmp_path), from_run=None
    )
    async_rl.pipeline(args)
    first = capsys.readouterr().out
    rows = [json.loads((tmp_path / f"eta{k}" / async_rl.ROW).read_text()) for k in (0, 1)]
    assert [(r["eta"], r["steps"]) for r in rows] == [(0, 2), (1, 2)]
    assert rows[0]["stale"] == 0.0
    # the eta-1 run started from the eta-0 run's warm start and reference state
    assert f"algorithm.anchor.reuse_from={tmp_path / 'eta0'}" in rows[1]["overrides"]
    assert (tmp_path / "eta1" / "initial_policy").is_dir()

    async_rl.pipeline(args)  # nothing left to train: both rows kept, the same table printed
    second = capsys.readouterr().out
    assert second.count("finished earlier with the same settings, kept") == 2
    table = [line for line in first.splitlines() if line.startswith("| ")]
    assert table and table == [line for line in second.splitlines() if line.startswith("| ")]

    args.steps = 3  # other settings: that run is trained again
    args.etas = [0]
    async_rl.pipeline(args)
    assert json.loads((tmp_path / "eta0" / async_rl.ROW).read_text())["steps"] == 3
