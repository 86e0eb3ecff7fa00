"""bench/algorithms/real_algorithms.py: arms parsed and refused by name, each arm's recipe overrides (RL only
from the given start), and the report's paired comparison of finished runs on the same questions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.algorithms import real_algorithms as ra  # noqa: E402


def test_arms_are_parsed_and_a_bad_name_or_size_is_refused_with_the_options():
    assert ra.parse_arms("pvpo+gs:2, grpo:4") == [ra.Arm("pvpo+gs", 2), ra.Arm("grpo", 4)]
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'.*pvpo\\+gs"):
        ra.parse_arms("ppo:2,grpo:4")
    with pytest.raises(ValueError, match="needs a group size"):
        ra.parse_arms("pvpo+gs,grpo:4")
    with pytest.raises(ValueError, match="at least two arms"):
        ra.parse_arms("grpo:4")


def test_an_arm_carries_its_own_overrides_into_its_name_label_and_config():
    arms = ra.parse_arms("pvpo+gs:4, pvpo+gs:4:optim.lr=5e-5:optim.kl_coef=0.05")
    assert arms[1] == ra.Arm("pvpo+gs", 4, ("optim.lr=5e-5", "optim.kl_coef=0.05"))
    assert [a.name for a in arms] == ["pvpo+gs_n4", "pvpo+gs_n4_lr5e-5_kl_coef0.05"]
    assert arms[1].label == "pvpo+gs N=4 optim.lr=5e-5 optim.kl_coef=0.05"
    over = ra.arm_overrides(
        arms[1], start=Path("/s"), data=[Path("a.json")], steps=8, seed=0, common=["optim.lr=1e-6", "run.steps=2"]
    )
    # every arm's common overrides come after the defaults, the arm's own last: the arm's win
    assert over[-4:] == ["optim.lr=1e-6", "run.steps=2", "optim.lr=5e-5", "optim.kl_coef=0.05"]
    with pytest.raises(ValueError, match="'optim.lr' is not a key=value override"):
        ra.parse_arms("grpo:4,grpo:4:optim.lr")
    with pytest.raises(ValueError, match="grpo_n4 given twice"):
        ra.parse_arms("grpo:4,grpo:4")


def test_every_arms_config_is_checked_before_any_arm_runs():
    kw = {"start": Path("/s"), "data": [Path("a.json")], "steps": 8, "seed": 0}
    ra.check_configs(ra.parse_arms("pvpo+gs:4,pvpo+gs:4:optim.lr=5e-5"), **kw)  # the recipe's keys load
    with pytest.raises(ValueError, match="arm grpo N=4 optim.lrr=5e-5: .*optim.lrr: unknown key"):
        ra.check_configs(ra.parse_arms("pvpo+gs:4,grpo:4:optim.lrr=5e-5"), **kw)
    with pytest.raises(ValueError, match="optim.lr: Input should be a valid number"):
        ra.check_configs(ra.parse_arms("pvpo+gs:4,grpo:4:optim.lr=abc"), **kw)


def test_each_arm_trains_from_the_start_policy_without_a_warm_start_with_its_estimator():
    over = ra.arm_overrides(ra.Arm("grpo", 4), start=Path("/s"), data=[Path("a.json"), Path("b.json")], steps=8, seed=3)
    assert "model.path=/s" in over and "model.warm_start_steps=0" in over and "run.eval_base=false" in over
    assert "data.source=[a.json, b.json]" in over and "run.steps=8" in over and "run.seed=3" in over
    assert "algorithm.estimator=grpo" in over and "algorithm.group_sampling.enabled=false" in over
    assert "rollout.n=4" in over
    gs = ra.arm_overrides(ra.Arm("pvpo+gs", 2), start=Path("/s"), data=[Path("a.json")], steps=8, seed=0)
    assert "algorithm.estimator=pvpo" in gs and "algorithm.group_sampling.enabled=true" in gs


def test_arms_are_evaluated_on_the_validation_split_unless_told_otherwise():
    over = ra.arm_overrides(ra.Arm("grpo", 4), start=Path("/s"), data=[Path("a.json")], steps=8, seed=0)
    assert "data.evaluate_on=validation" in over
    held = ra.arm_overrides(
        ra.Arm("grpo", 4), start=Path("/s"), data=[Path("a.json")], steps=8, seed=0, split="held_out"
    )
    assert "data.evaluate_on=held_out" in held


def test_the_report_gives_each_arms_em_by_dataset_with_its_paired_gain(tmp_path):
    qs = ["hotpotqa/1", "hotpotqa/2", "musique/1", "musique/2"]
    _run(tmp_path, "pvpo+gs_n2", [0, 0, 0, 1], [1, 0, 1, 1], qs, cum_rollouts=10)
    _run(tmp_path, "grpo_n4", [0, 0, 0, 1], [0, 0, 0, 1], qs, cum_rollouts=10)
    arms = ra.parse_arms("pvpo+gs:2,grpo:4")
    runs = {a.name: ra.load_arm(tmp_path / a.name) for a in arms}
    text = ra.report(arms, runs, command="c", machine="m")
    assert "| arm | hotpotqa: EM after (gain, paired s.e.) | musique: EM after (gain, paired s.e.) |" in text
    assert "| pvpo+gs N=2 | 0.500 (+0.500, 0.500) | 1.000 (+0.500, 0.500) |" in text
    assert "Evaluated on the validation split: 4 questions" in text


def _run(root: Path, name: str, before: list[float], after: list[float], questions: list[str], **cost: float) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "held_out_em.json").write_text(json.dumps({"questions": questions, "em": {"before": before, "after": after}}))
    (d / "summary.md").write_text("table\n")
    last = {"step": 8, **{f"cost/{k}": v for k, v in cost.items()}, "eval/f1": 0.2, "eval/format_ok": 0.9}
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps({**last, "eval/accuracy": 0.5}) + "\n")


def test_the_report_pairs_the_arms_on_the_same_questions_and_states_the_power(tmp_path):
    qs = ["q1", "q2", "q3", "q4"]
    _run(
        tmp_path, "pvpo+gs_n2", [0, 0, 1, 0], [1, 1, 1, 0], qs, cum_rollouts=121, cum_gt_rollouts=23, cum_tool_calls=246
    )
    _run(tmp_path, "grpo_n4", [0, 0, 1, 0], [0, 1, 1, 0], qs, cum_rollouts=128, cum_gt_rollouts=0, cum_tool_calls=300)
    arms = ra.parse_arms("pvpo+gs:2,grpo:4")
    runs = {a.name: ra.load_arm(tmp_path / a.name) for a in arms}
    text = ra.report(arms, runs, command="cmd", machine="m")
    assert "| pvpo+gs N=2 | 98 | 246 |" in text and "| grpo N=4 | 128 | 300 |" in text
    assert "| 0.250 | 0.750 (s.e. 0.250) | +0.500 (0.289) |" in text  # paired gain over the start
    # pvpo+gs - grpo after RL: +0.25 over 4 questions, paired s.e. 0.25: not resolved at 2 s.e.
    assert "+0.250 (paired s.e. 0.250, +1.0 s.e.: not resolved at 2 s.e." in text
    _run(tmp_path / "other", "grpo_n4", [0, 0, 1, 0], [0, 1, 1, 0], ["q1", "q2", "q3", "q9"], cum_rollouts=1)
    runs["grpo_n4"] = ra.load_arm(tmp_path / "other" / "grpo_n4")
    with pytest.raises(ValueError, match="other validation questions"):
        ra.report(arms, runs, command="cmd", machine="m")


def test_an_arms_validation_curve_is_shown_by_step_with_its_best_step():
    curve = {
        "best": {"step": 8, "accuracy": 0.18, "checkpoint": "step_000008"},
        "points": [
            {"step": 16.0, "accuracy": 0.173},
            {"step": 0.0, "accuracy": 0.153},
            {"step": 8.0, "accuracy": 0.18},
        ],
    }
    assert ra.curve_cell(curve) == "0: 0.153, 8: 0.180, 16: 0.173 (8)"
    assert ra.curve_cell({}) == "n/a"


def test_an_arms_last_validation_point_is_paired_with_the_reference_runs_at_the_same_step():
    qs = ["a/1", "a/2", "a/3", "a/4"]
    ref = {
        "questions": qs,
        "points": [{"step": 0, "accuracy": 0.25, "em": [1, 0, 0, 0]}, {"step": 8, "accuracy": 0.5, "em": [1, 1, 0, 0]}],
    }
    arm = {"questions": qs, "points": [{"step": 8, "accuracy": 0.75, "em": [1, 1, 1, 0]}]}
    lines = ra.curve_comparison(ref, {"x": {"curve": arm}}, {"x": "lr 5e-5"})
    assert lines == [
        "- lr 5e-5 at step 8: validation EM 0.750 against the reference's 0.500: +0.250 (paired s.e. 0.250, +1.0 s.e.)"
    ]
    late = {"questions": qs, "points": [{"step": 16, "accuracy": 0.75, "em": [1, 1, 1, 0]}]}
    assert "no validation point at step 16" in ra.curve_comparison(ref, {"x": {"curve": late}}, {"x": "x"})[0]


def test_each_rl_seed_of_an_arm_has_its_own_folder_seed_0_where_one_seed_always_ran(tmp_path):
    arm = ra.parse_arms("pvpo+gs:4,pvpo+gs:4:optim.lr=5e-5")[1]
    assert ra.arm_dir(tmp_path, arm) == tmp_path / "pvpo+gs_n4_lr5e-5"
    assert ra.arm_dir(tmp_path, arm, 2) == tmp_path / "seed2" / "pvpo+gs_n4_lr5e-5"
    overrides = ra.arm_overrides(arm, start=tmp_path, data=[tmp_path / "q.json"], steps=16, seed=2)
    assert "run.seed=2" in overrides


def test_an_arm_with_several_seeds_reports_its_mean_and_an_se_counting_the_seeds_spread(tmp_path):
    qs = ["q1", "q2", "q3", "q4"]
    before = [0, 0, 1, 0]
    _run(tmp_path, "pvpo+gs_n4", before, [0, 1, 1, 0], qs, cum_rollouts=10)
    _run(tmp_path, "pvpo+gs_n4_lr5e-5", before, [1, 1, 1, 0], qs, cum_rollouts=10)
    _run(tmp_path / "seed1", "pvpo+gs_n4_lr5e-5", before, [1, 0, 1, 0], qs, cum_rollouts=20)
    arms = ra.parse_arms("pvpo+gs:4,pvpo+gs:4:optim.lr=5e-5")
    runs = {a.name: ra.load_seeds(tmp_path, a, [0, 1]) for a in arms}
    assert runs["pvpo+gs_n4"]["seeds"] == [0] and runs["pvpo+gs_n4_lr5e-5"]["seeds"] == [0, 1]
    text = ra.report(arms, runs, command="c", machine="m")
    # per-seed gains 0.50 and 0.25 (sd 0.177); seed-averaged differences 1, .5, 0, 0 (s.e. 0.239):
    # sqrt(0.239^2 + 0.177^2 / 2) = 0.270
    assert "| pvpo+gs N=4 optim.lr=5e-5 (seeds 0, 1) | 15 |" in text
    assert "| 0.250 | 0.625 (s.e. 0.239) | +0.375 (0.270) |" in text
    # default - lr: per question -1, .5, 0, 0 (s.e. 0.315) and the lr arm's seed spread 0.177 / sqrt(2)
    assert (
        "pvpo+gs N=4 - pvpo+gs N=4 optim.lr=5e-5 (seeds 0, 1), validation EM after RL: -0.125 (s.e. with seeds 0.339, -0.4 s.e."
        in text
    )
    assert "counts the seeds' spread" in text


def test_a_seed_that_started_elsewhere_is_refused_and_an_arm_without_any_seed_is_named(tmp_path):
    qs = ["q1", "q2"]
    _run(tmp_path, "pvpo+gs_n4", [0, 1], [1, 1], qs)
    _run(tmp_path / "seed1", "pvpo+gs_n4", [1, 1], [1, 1], qs)
    arm = ra.parse_arms("pvpo+gs:4,grpo:4")[0]
    with pytest.raises(ValueError, match="seed 1 started from another policy"):
        ra.load_seeds(tmp_path, arm, [0, 1])
    with pytest.raises(ValueError, match="no finished run for seeds 3"):
        ra.load_seeds(tmp_path, arm, [3])


def test_an_arms_validation_curve_over_seeds_is_the_mean_at_each_step_every_seed_evaluated(tmp_path):
    qs = ["q1", "q2"]
    for root, points in ((tmp_path, [(0, 0.5), (8, 0.5), (16, 1.0)]), (tmp_path / "seed1", [(0, 0.5), (8, 0.0)])):
        _run(root, "pvpo+gs_n4", [0, 1], [1, 1], qs)
        (root / "pvpo+gs_n4" / "checkpoints").mkdir()
        best = {"points": [{"step": s, "accuracy": a} for s, a in points], "best": {"step": points[-1][0]}}
        (root / "pvpo+gs_n4" / "checkpoints" / "best.json").write_text(json.dumps(best))
    run = ra.load_seeds(tmp_path, ra.parse_arms("pvpo+gs:4,grpo:4")[0], [0, 1])
    assert ra.curve_cell(run["curve"]) == "0: 0.500, 8: 0.250 (0)"  # step 16: seed 0 only, left out
