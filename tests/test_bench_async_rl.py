"""bench/training/async_rl.py pipeline: each eta trained in a process of its own, its row kept in its run
folder so that a rerun keeps finished runs (and reruns one of other settings), and a --from-run
start that is one of the bench's own folders refused rather than deleted."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))

from trainer_support import TINY  # noqa: E402

from bench.training import async_rl as async_rl  # noqa: E402


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


# ---- pairs: eta 0 at 2 threads against eta > 0, interleaved and repeated; the ablation ----------
from bench.training import async_rl_pairs as async_rl_pairs  # noqa: E402


def test_pairs_alternate_the_order_and_share_a_seed_within_a_pair():
    base, others = async_rl_pairs.speed_arms([1, 2], base_threads=2, threads=1)
    runs = async_rl_pairs.plan(base, others, seeds=[0, 1, 2])
    assert len(runs) == 12 and len({p.folder for p in runs}) == 12
    for arm in others:
        mine = [p for p in runs if p.arm == arm]
        assert [p.seed for p in mine] == [0, 1, 2]
        # the arm's place in its pair alternates over the repeats: first, second, first or the reverse
        slots = [p.slot for p in mine]
        assert slots in ([0, 1, 0], [1, 0, 1])
        for p in mine:  # its pair: the base run on the same seed, trained just before or after it
            i = runs.index(p)
            partner = runs[i + 1] if p.slot == 0 else runs[i - 1]
            assert partner.base and partner.arm == base and partner.pair == p.pair and partner.seed == p.seed
    # the two arms start alternately within a repeat: neither is always the first run after the other's
    assert [runs[2 * k].base for k in range(6)] == [True, False, False, True, True, False]
    assert "run.threads=2" in base.overrides and "rollout.max_staleness=0" in base.overrides
    assert all("run.threads=1" in a.overrides for a in others)
    p = runs[1]
    overrides = async_rl_pairs.run_overrides(p, ["x=1"], ["algorithm.anchor.reuse_from=S"], steps=4)
    assert overrides == ["x=1", "algorithm.anchor.reuse_from=S", *p.arm.overrides, f"run.seed={p.seed}", "run.steps=4"]


def test_the_ablation_arms_differ_in_the_objective_alone():
    base, (naive,) = async_rl_pairs.ablation_arms(2, threads=1)
    assert set(base.overrides) ^ set(naive.overrides) == {"rollout.decoupled=true", "rollout.decoupled=false"}
    assert "rollout.max_staleness=2" in naive.overrides
    with pytest.raises(ValueError, match="eta >= 1"):
        async_rl_pairs.ablation_arms(0, threads=1)
    with pytest.raises(ValueError, match="eta >= 1"):
        async_rl_pairs.speed_arms([0, 1], base_threads=2, threads=1)


def fake_row(config: str, overrides: list[str], run_dir: str) -> dict:
    """What `run_one` returns, made up from the settings: eta k samples (1 + k/10)x the base's."""
    settings = dict(o.split("=", 1) for o in overrides)
    eta, seed = int(settings["rollout.max_staleness"]), int(settings["run.seed"])
    rate = 10.0 * (1 + eta / 10) + seed
    row = {
        "config": config,
        "overrides": overrides,
        "eta": eta,
        "seed": seed,
        "steps": 4,
        "rl_wall_s": 100.0,
        "samples_per_s": rate,
        "tokens_per_s": 50 * rate,
        "idle": 0.4 if eta == 0 else 0.05,
        "wait_s": 1.0,
        "lag": {f"lag_{j}": 1 / (eta + 1) for j in range(eta + 1)} | ({"lag_over_eta": 0.0} if eta else {}),
        "late": 0.1 * eta,
        "em": 0.5,
        "em_se": 0.04,
        "per_question": [1.0, 0.0, 1.0, float(seed % 2)] if eta else [1.0, 0.0, 0.0, float(seed % 2)],
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / async_rl.ROW).write_text(json.dumps(row))
    return row


def test_pairs_train_the_plan_from_one_start_write_the_record_and_keep_finished_runs(tmp_path, capsys, monkeypatch):
    calls: list[str] = []

    def train(fn, args):
        calls.append(fn.__name__)
        if fn is async_rl_pairs.build_start:  # its last act: the settings it was built with
            config, overrides, run_dir = args
            (Path(run_dir) / "initial_policy").mkdir(parents=True)
            (Path(run_dir) / async_rl_pairs.START).write_text(json.dumps({"config": config, "overrides": overrides}))
            return None
        return fake_row(*args)

    monkeypatch.setattr(sys, "argv", ["bench/training/async_rl.py", "pairs", "--repeats", "3"])
    args = Namespace(
        etas=[1, 2], repeats=3, seeds=None, steps=4, base_threads=2, threads=1, ablation=False,
        overrides=["a=1"], config="demo", out=str(tmp_path), from_run=None,
    )  # fmt: skip
    record = async_rl_pairs.pairs(args, train)
    assert calls == ["build_start"] + ["run_one"] * 12
    start = tmp_path / "start"
    assert all(f"algorithm.anchor.reuse_from={start}" in r["overrides"] for r in record["rows"])
    assert all((tmp_path / p["folder"] / "initial_policy").is_dir() for p in record["plan"])
    written = json.loads((tmp_path / async_rl_pairs.RECORD).read_text())
    assert written["command"] == ["python", "bench/training/async_rl.py", "pairs", "--repeats", "3"]
    assert written["machine_line"] and len(written["rows"]) == 12
    by_arm = {s["arm"]: s for s in written["summary"]}
    assert by_arm["eta 1, 1 thread"]["pairs"] == 3 and by_arm["eta 1, 1 thread"]["faster_in"] == 3
    assert by_arm["eta 2, 1 thread"]["samples_ratio"] == pytest.approx([12 / 10, 13 / 11, 14 / 12])
    assert by_arm["eta 2, 1 thread"]["em_diff"] == pytest.approx(0.25)
    out = capsys.readouterr().out
    assert "| eta 2, 1 thread | 3 | 1.18x (1.17-1.20) | 1.18x (1.17-1.20) | 3 of 3 | 0.05 / 0.40 |" in out
    assert "| 0.33 / 0.33 / 0.33 / 0.00 |" in out  # eta 2's lag histogram: 0 / 1 / 2 / over eta

    calls.clear()
    async_rl_pairs.pairs(args, train)  # nothing left to train: the start and every run kept
    assert calls == []
    assert capsys.readouterr().out.count("finished earlier with the same settings, kept") == 12


@pytest.mark.slow
def test_pairs_train_from_a_start_built_without_an_rl_step(tmp_path, capsys, monkeypatch):
    overrides = [
        *TINY,
        "data.max_train_examples=4",
        "data.warm_start_examples=4",
        "model.warm_start_steps=2",
        "run.eval_every=0",
    ]
    monkeypatch.setattr(sys, "argv", ["bench/training/async_rl.py", "pairs"])
    args = Namespace(
        etas=[1], repeats=1, seeds=None, steps=2, base_threads=2, threads=1, ablation=False,
        overrides=overrides, config="demo", out=str(tmp_path), from_run=None,
    )  # fmt: skip
    record = async_rl_pairs.pairs(args, async_rl.in_fresh_process)
    start = tmp_path / "start"
    assert (start / "initial_policy").is_dir() and (start / "anchor.json").is_file()
    assert not (start / "metrics.jsonl").exists() or not (start / "metrics.jsonl").read_text().strip()  # no RL step
    base, arm = sorted(record["rows"], key=lambda r: r["eta"])
    assert (base["eta"], base["threads"], arm["eta"], arm["threads"]) == (0, 2, 1, 1)
    assert base["lag"] == {"lag_0": 1.0} and set(arm["lag"]) == {"lag_0", "lag_1", "lag_over_eta"}
    assert sum(arm["lag"].values()) == pytest.approx(1.0)
    assert arm["samples_per_s"] > 0 and arm["tokens_per_s"] > arm["samples_per_s"]
    assert "a smoke check, not a figure" in capsys.readouterr().out
