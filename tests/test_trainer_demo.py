"""`pvpo demo`: warm-start questions disjoint from the RL prompts, held-out metrics (EM, F1, s.e.,
per hop), and a miniature demo config end to end through the CLI (outputs exist, are finite, and
the summary has the before/after rows)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pvpo.envs.synthetic import synthetic_world
from pvpo.trainer.config.schema import config_from_dict
from pvpo.trainer.config.written import dump_config
from pvpo.trainer.data import disjoint_splits, load_data
from pvpo.trainer.heldout.scoring import eval_metrics
from pvpo.trainer.rollout.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]

MINI = {
    "model": {
        "path": None,
        "warm_start_steps": 6,
        "warm_start_batch_size": 4,
        "tiny": {
            "hidden_size": 48,
            "num_layers": 1,
            "num_heads": 4,
            "num_kv_heads": 2,
            "intermediate_size": 96,
            "vocab_size": 512,
        },
    },
    "data": {
        "source": "synthetic",
        "synthetic": {"seed": 0, "n_entities": 16, "n_relations": 2, "max_hops": 2, "questions_per_hop": 12},
        "max_train_examples": 4,
        "max_eval_examples": 4,
        "prompts_per_step": 2,
        "shuffle_seed": 0,
        "warm_start_examples": 4,
        "warm_start_max_hops": 1,
    },
    "retriever": {"topk": 2},
    "env": {"protocol": "search_r1", "max_obs_chars": 200},
    "rollout": {
        "engine": "hf",
        "max_turns": 2,
        "max_new_tokens": 16,
        "max_response_tokens": 160,
        "n": 2,
        "batch_size": 16,
    },
    "algorithm": {"estimator": "pvpo", "reward": "pvpo", "anchor": {"num_rollouts": 2}},
    "optim": {"lr": 1.0e-4, "mini_batches": 2},
    "run": {"steps": 2, "seed": 0, "checkpoint_every": 0, "tensorboard": False},
}


def test_pvpo_train_data_holds_the_same_disjoint_warm_start_split_as_the_demo(tmp_path: Path) -> None:
    # `pvpo train` and `pvpo demo` both read their questions through load_data: the data.* split
    # knobs must mean the same in both.
    data = load_data(config_from_dict(MINI), tmp_path)
    assert len(data.train) == 4 and len(data.eval) == 4 and len(data.warm_start) == 4
    assert not {q.uid for q in data.train} & {q.uid for q in data.warm_start}
    assert all(q.metadata["hops"] == 1 for q in data.warm_start)
    no_split = load_data(config_from_dict({**MINI, "data": {**MINI["data"], "warm_start_examples": None}}), tmp_path)
    assert (
        no_split.train == data.train and no_split.warm_start == no_split.train
    )  # the warm start reuses the RL prompts


def test_warm_start_questions_share_nothing_with_the_rl_prompts_and_respect_the_hop_limit():
    train = synthetic_world(0, 30, n_relations=3, max_hops=3, questions_per_hop=20).questions("train")
    rl, sft = disjoint_splits(train, n_rl=10, n_sft=8, max_sft_hops=1, shuffle_seed=3)
    assert len(rl) == 10 and len(sft) == 8
    assert not {e.uid for e in rl} & {e.uid for e in sft}
    assert all(e.metadata["hops"] == 1 for e in sft)
    assert len({e.metadata["hops"] for e in rl}) > 1, "a shuffled split mixes hop counts"
    assert disjoint_splits(train, n_rl=10, n_sft=8, max_sft_hops=1, shuffle_seed=3) == (rl, sft)
    assert disjoint_splits(train, n_rl=10, n_sft=8, shuffle_seed=4)[0] != rl
    same_rl, same_sft = disjoint_splits(train, n_rl=10, n_sft=None)
    assert same_rl == same_sft == train[:10]
    with pytest.raises(ValueError, match="only"):
        disjoint_splits(train, n_rl=10, n_sft=len(train))


def test_eval_metrics_report_f1_standard_error_and_accuracy_per_hop():
    world = synthetic_world(0, 16, n_relations=2, max_hops=2, questions_per_hop=4)
    exs = [e for e in world.questions("train") if e.metadata["hops"] == 1][:2] + [
        e for e in world.questions("train") if e.metadata["hops"] == 2
    ][:2]
    preds = [exs[0].golden_answers[0], "nobody", f"{exs[2].golden_answers[0]} and more", None]
    trajs = []
    for ex, p in zip(exs, preds):
        t = Trajectory(ex.uid, [1])
        t.prediction, t.accuracy = p, float(p == ex.golden_answers[0])
        trajs.append(t)
    m = eval_metrics(trajs, exs)
    assert m["eval/accuracy"] == 0.25 and m["eval/n"] == 4
    assert m["eval/f1"] == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    assert m["eval/accuracy_se"] == pytest.approx(math.sqrt(0.25 * 0.75 / 3))
    assert m["eval/accuracy_1hop"] == 0.5 and m["eval/accuracy_2hop"] == 0.0


@pytest.mark.slow
def test_miniature_demo_writes_finite_metrics_a_plot_and_a_before_after_summary(tmp_path):
    cfg = tmp_path / "mini.yaml"
    cfg.write_text(yaml.safe_dump(MINI))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "pvpo.cli", "demo", "--config", str(cfg), "--run-dir", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        bad = {k: v for k, v in r.items() if not (isinstance(v, (int, float)) and math.isfinite(v))}
        assert not bad, f"non-finite metrics at step {r['step']}: {bad}"
    assert "eval/accuracy" in rows[-1] and "eval/f1" in rows[-1]
    png = (run_dir / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    summary = (run_dir / "summary.md").read_text()
    assert summary in proc.stdout
    for row in (
        "| EM |",
        "| F1 |",
        "| reward |",
        "| format ok |",
        "| searches per answer |",
        "| EM, 1-hop |",
        "wall time",
    ):
        assert row in summary, f"summary lacks {row!r}"
    em_row = next(line for line in summary.splitlines() if line.startswith("| EM |"))
    before, after = (float(x) for x in em_row.split("|")[2:4])
    assert 0 <= before <= 1 and 0 <= after <= 1
    per_q = json.loads((run_dir / "held_out_em.json").read_text())  # paired comparisons between runs
    n_eval = len(per_q["questions"])
    assert n_eval > 0 and sorted(per_q["em"]) == ["after", "before"]
    assert all(len(v) == n_eval and set(v) <= {0.0, 1.0} for v in per_q["em"].values())
    assert sum(per_q["em"]["before"]) / n_eval == pytest.approx(before, abs=5e-4)
    ws = json.loads((run_dir / "warm_start.json").read_text())
    assert len(ws["losses"]) == 6 and all(math.isfinite(x) for x in ws["losses"])
    rl_uids = set(json.loads((run_dir / "anchor.json").read_text())["stats"])
    assert len(rl_uids) == 4 and not rl_uids & set(ws["questions"]), "the warm start saw an RL prompt"


@pytest.mark.slow
def test_shortened_demo_learns_held_out_em_rises_and_train_reward_beats_the_anchor(tmp_path):
    """`make demo`'s own config cut to 40 RL steps, end to end through the CLI. On the machine of
    docs/benchmarks/demo.md the full demo's held-out EM went 0.179 -> 0.327 at step 40 and train reward - anchor
    +0.087 over steps 31-40 (the full 100-step demo goes on rising); the bars below leave room for
    another CPU's float kernels."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "pvpo.cli", "demo", "--run-dir", str(run_dir), "run.steps=40", "run.checkpoint_every=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    em_row = next(line for line in (run_dir / "summary.md").read_text().splitlines() if line.startswith("| EM |"))
    before, after = (float(x) for x in em_row.split("|")[2:4])
    assert after - before >= 0.08, f"held-out EM {before:.3f} -> {after:.3f}: no learning"
    late = [r["reward/mean"] - r["anchor/mean"] for r in rows[-10:]]
    assert sum(late) / len(late) >= 0.03, f"train reward - anchor over the last 10 steps: {late}"
    first = rows[0]
    assert first["gs/gt_frac"] > 0.5 and first["gt/generated"] > 0 and 0 < first["gt/fraction"] < 1
    assert rows[-1]["cost/cum_rollouts"] > rows[0]["cost/cum_anchor_rollouts"] > 0


def test_demo_refuses_a_run_dir_holding_a_users_file_and_keeps_it(tmp_path):
    """`pvpo demo --run-dir D` never deletes D with the user's files in it."""
    from typer.testing import CliRunner

    from pvpo.cli import app

    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("my notes")
    res = CliRunner().invoke(app, ["demo", "--run-dir", str(run_dir)])
    assert res.exit_code == 2 and "notes.txt" in res.output and "--overwrite" in res.output, res.output
    assert "Traceback" not in res.output and res.output.count("\n") <= 3
    # --overwrite with an input that cannot be read: refused before the folder is touched
    res = CliRunner().invoke(
        app,
        [
            "demo",
            "--run-dir",
            str(run_dir),
            "--overwrite",
            f"data.source={tmp_path / 'missing.jsonl'}",
            "algorithm.group_sampling.enabled=false",  # the demo's oracle GT needs its synthetic world
        ],
    )
    assert res.exit_code == 2 and "missing.jsonl" in res.output, res.output
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"] and (run_dir / "notes.txt").read_text() == "my notes"
    assert not (tmp_path / ".demo.pvpo-replaced").exists()


def test_only_what_a_runs_manifest_names_counts_as_an_earlier_run_a_fresh_demo_may_replace(tmp_path):
    from pvpo.owned import claim
    from pvpo.trainer.state.run_dir import RUN_KIND, foreign_entries

    for name in ("config.yaml", "metrics.jsonl", "summary.md", ".metrics.jsonl.abc123.tmp"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_000001")
    # a run's names, its checkpoint pointer included, in a folder without a run's manifest: the user's
    assert foreign_entries(tmp_path) == sorted(p.name for p in tmp_path.iterdir())
    for p in list(tmp_path.iterdir()):  # the same files written after a run's manifest: the run's
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    claim(tmp_path, RUN_KIND)
    for name in ("config.yaml", "metrics.jsonl", "summary.md", ".metrics.jsonl.abc123.tmp"):
        (tmp_path / name).write_text("x")
    assert foreign_entries(tmp_path) == []
    (tmp_path / "index.html").write_text("mine")
    assert foreign_entries(tmp_path) == ["index.html"]


def test_a_run_with_a_base_evaluation_reports_three_points_and_both_paired_gains(tmp_path):
    from pvpo.recipes.demo import paired_gain, summary_table
    from pvpo.trainer.loop import TrainResult

    def ev(em: list[float]) -> dict[str, float]:
        return {"eval/accuracy": sum(em) / len(em), "eval/accuracy_se": 0.1, "eval/format_ok": 1.0, "eval/n": len(em)}

    base, sft, rl = [0.0] * 10, [0, 0, 0, 1, 0, 0, 1, 0, 0, 0], [1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    result = TrainResult(tmp_path, 2, eval_before=ev(sft), eval_after=ev(rl), eval_base=ev(base))
    result.eval_em = {"base": base, "before": [float(x) for x in sft], "after": [float(x) for x in rl]}
    cfg = config_from_dict({"model": {"warm_start_steps": 1}})
    text = summary_table(cfg, result, {}, n_sft=3, n_rl=4)
    assert "| held-out | base model | after warm start | after RL | RL - warm start |" in text
    assert "| EM | 0.000 | 0.200 | 0.700 | +0.500 |" in text
    # base -> RL: 7 of 10 questions gain 1, paired s.e. 0.153, 4.6 s.e.; warm start -> RL: +0.5, s.e. 0.167, 3.0
    ok, line = paired_gain(base, [float(x) for x in rl], what="base model -> after RL", min_se=3)
    assert ok and line in text and "+0.700" in line
    ok2, line2 = paired_gain([float(x) for x in sft], [float(x) for x in rl], what="RL over the warm start", min_se=2)
    assert line2 in text and "+0.500" in line2 and ok2
    # a gain below its bar says so
    assert not paired_gain([0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0], what="x", min_se=2)[0]


def test_a_run_evaluating_its_validation_split_labels_its_summary_validation_not_held_out(tmp_path):
    from pvpo.recipes.demo import summary_table
    from pvpo.trainer.loop import TrainResult

    ev = {"eval/accuracy": 0.5, "eval/accuracy_se": 0.1, "eval/format_ok": 1.0, "eval/n": 4}
    result = TrainResult(tmp_path, 2, eval_before=ev, eval_after=ev, eval_base=ev)
    result.eval_em = {"base": [0.0, 1.0] * 2, "before": [0.0, 1.0] * 2, "after": [0.0, 1.0] * 2}
    for split, label in (("validation", "Validation"), ("held_out", "Held-out")):
        cfg = config_from_dict(
            {"model": {"warm_start_steps": 1}, "data": {"evaluate_on": split, "validation_examples": 4}}
        )
        text = summary_table(cfg, result, {}, n_sft=3, n_rl=4)
        assert text.startswith(f"{label}: 4 questions") and f"| {label.lower()} | base model |" in text
        # the verdict lines name the split too (a validation run's summary once said "held-out EM")
        other = "held-out" if split == "validation" else "validation"
        assert f"RL over the warm start: {label.lower()} EM" in text and f"{other} EM" not in text
        plain = TrainResult(tmp_path, 2, eval_before=ev, eval_after=ev)
        plain.eval_em = {"before": [0.0, 1.0] * 2, "after": [0.0, 1.0] * 2}
        text = summary_table(cfg, plain, {}, n_sft=3, n_rl=4)
        assert f"\n{label.lower()} EM 0.500 -> 0.500" in text and f"{other} EM" not in text


def test_a_run_without_a_warm_start_says_rl_starts_from_the_given_model(tmp_path):
    from pvpo.recipes.demo import summary_table
    from pvpo.trainer.loop import TrainResult

    ev = {"eval/accuracy": 0.1, "eval/accuracy_se": 0.05, "eval/n": 10}
    result = TrainResult(tmp_path, 2, eval_before=ev, eval_after=ev)
    cfg = config_from_dict({"model": {"warm_start_steps": 0, "path": "/runs/real/initial_policy"}})
    text = summary_table(cfg, result, {}, n_sft=0, n_rl=4)
    assert "| warm start | none: RL starts from /runs/real/initial_policy as given |" in text
    assert "SFT steps" not in text


def test_a_fresh_demo_over_a_checkpointed_run_says_it_starts_over_and_how_to_continue(tmp_path, caplog):
    """A demo stopped at step 12 and run again without --resume started over unannounced (the H100
    session's recipe lost its 12 steps so)."""
    import logging

    from pvpo.owned import claim
    from pvpo.recipes.demo import _replace_demo
    from pvpo.trainer.state.run_dir import RUN_KIND

    run_dir = tmp_path / "demo"
    claim(run_dir, RUN_KIND, info={"command": "pvpo demo"})  # an earlier demo's manifest
    (run_dir / "checkpoints").mkdir(parents=True)
    cfg = config_from_dict({})
    dump_config(cfg, run_dir / "config.yaml")
    with caplog.at_level(logging.WARNING, logger="pvpo.recipes.demo"):
        with _replace_demo(run_dir, fresh=True, overwrite=False, cfg=cfg):
            pass
    assert not caplog.records  # no checkpoint: nothing to lose, nothing said
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints" / "latest").write_text("step_000012\n")
    with caplog.at_level(logging.WARNING, logger="pvpo.recipes.demo"):
        with _replace_demo(run_dir, fresh=True, overwrite=False, cfg=cfg):
            pass
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "step_000012" in msg and "--resume" in msg and str(run_dir) in msg


def test_a_resumed_demo_keeps_the_evaluation_before_rl_and_says_its_wall_time_is_its_own(tmp_path):
    """The H100 recipe, cut in step 16 and continued with --resume, printed "Held-out: 0 questions"
    and n/a after the warm start: the evaluation before RL lived only in the first process."""
    cfg = tmp_path / "mini.yaml"
    cfg.write_text(yaml.safe_dump({**MINI, "run": {**MINI["run"], "steps": 1, "checkpoint_every": 1}}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run_dir = tmp_path / "demo"
    base = [sys.executable, "-m", "pvpo.cli", "demo", "--config", str(cfg), "--run-dir", str(run_dir)]
    first = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.loads((run_dir / "eval_before.json").read_text())
    em_before = json.loads((run_dir / "held_out_em.json").read_text())["em"]["before"]
    assert saved["em"] == em_before and saved["metrics"]["eval/n"] == len(em_before) > 0
    em_row = next(x for x in (run_dir / "summary.md").read_text().splitlines() if x.startswith("| EM |"))
    second = subprocess.run([*base, "--resume", "run.steps=2"], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = (run_dir / "summary.md").read_text()
    assert f"Held-out: {len(em_before)} test questions" in summary
    assert next(x for x in summary.splitlines() if x.startswith("| EM |")).split("|")[2] == em_row.split("|")[2]
    assert "this process only (resumed at step 1)" in summary
    assert json.loads((run_dir / "held_out_em.json").read_text())["em"]["before"] == em_before


def test_the_cost_axis_ticks_stay_inside_the_costs_the_run_reached():
    """The recipe's curves.png drew "75" and "100" on top of each other at step 1: costs below the
    first step's map onto it."""
    from pvpo.recipes.demo import cost_ticks

    cost = [95.0, 111, 127, 143, 160, 176, 192, 208, 224, 240, 256, 266, 270, 274, 278, 282]
    ticks = cost_ticks(cost)
    assert len(ticks) >= 3 and ticks == sorted(set(ticks))
    assert all(95 <= t <= 282 for t in ticks)  # matplotlib's own ticks ran from 75 to 300
    assert cost_ticks([5.0, 5.0]) == [5.0]
