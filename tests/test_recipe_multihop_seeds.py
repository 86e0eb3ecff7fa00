"""`pvpo recipe seeds` (pvpo.recipes.multihop.seeds) and pvpo.stats.seeds_difference / seeds_contrast:
the seeds' RL phase from the recipe run's warm start with only run.seed changed, and the mean over
seeds with an s.e. that counts their spread."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.recipes.multihop import evaluate, seeds, seeds_report
from pvpo.recipes.multihop import runs as recipe_runs
from pvpo.stats import paired_difference, seeds_contrast, seeds_difference


def test_seeds_difference_adds_the_seeds_spread_to_the_questions_paired_error():
    warm = [0, 0, 1, 1]
    afters = [[1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]  # per-seed gains +0.25, 0, +0.5
    got = seeds_difference(warm, afters)
    # seed-averaged differences 2/3, 1/3, 0, 0: mean 0.25; their paired s.e. over 4 questions
    d = [2 / 3, 1 / 3, 0, 0]
    m = sum(d) / 4
    se_q = math.sqrt(sum((x - m) ** 2 for x in d) / 3 / 4)
    sd_s = math.sqrt(((0.25 - 0.25) ** 2 + (0 - 0.25) ** 2 + (0.5 - 0.25) ** 2) / 2)
    assert got["mean"] == pytest.approx(0.25) and got["se_questions"] == pytest.approx(se_q)
    assert got["sd_seeds"] == pytest.approx(sd_s) and got["se"] == pytest.approx(math.sqrt(se_q**2 + sd_s**2 / 3))
    # one seed: the plain paired comparison
    one = seeds_difference(warm, afters[:1])
    assert (one["mean"], one["se"]) == pytest.approx(paired_difference(warm, afters[0]))
    with pytest.raises(ValueError, match="same questions"):
        seeds_difference(warm, [[1, 0, 1]])


def test_seeds_contrast_counts_both_settings_seed_spreads_beside_the_questions_paired_error():
    a = [[1, 1, 0, 0], [1, 0, 0, 0]]  # setting A, two seeds: means 0.5, 0.25
    b = [[0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 0, 0]]  # setting B, three seeds: means 0, 0.5, 0.25
    got = seeds_contrast(a, b)
    avg_a, avg_b = [1, 0.5, 0, 0], [1 / 3, 1 / 3, 0, 1 / 3]
    d = [x - y for x, y in zip(avg_a, avg_b, strict=True)]
    m = sum(d) / 4
    se_q = math.sqrt(sum((x - m) ** 2 for x in d) / 3 / 4)
    sd_a = math.sqrt(((0.5 - 0.375) ** 2 + (0.25 - 0.375) ** 2) / 1)
    sd_b = math.sqrt(((0 - 0.25) ** 2 + (0.5 - 0.25) ** 2 + (0.25 - 0.25) ** 2) / 2)
    assert got["mean"] == pytest.approx(0.375 - 0.25) and got["se_questions"] == pytest.approx(se_q)
    assert (got["sd_a"], got["sd_b"]) == pytest.approx((sd_a, sd_b))
    assert got["se"] == pytest.approx(math.sqrt(se_q**2 + sd_a**2 / 2 + sd_b**2 / 3))
    # one seed a side: the plain paired comparison
    one = seeds_contrast(a[:1], b[:1])
    assert (one["mean"], one["se"]) == pytest.approx(paired_difference(b[0], a[0]))
    with pytest.raises(ValueError, match="same questions"):
        seeds_contrast(a, [[1, 0, 1]])


def _run(root: Path, name: str, before, after, qs, base=None, fmt=1.0) -> Path:
    run = root / name
    (run / "initial_policy").mkdir(parents=True)
    (run / "initial_policy" / "config.json").write_text("{}")
    (run / "summary.md").write_text("done\n")
    em = {"before": before, "after": after, **({"base": base} if base else {})}
    scores = {"after": [{"em": float(a), "format_ok": fmt} for a in after]}
    (run / "held_out_em.json").write_text(json.dumps({"questions": qs, "em": em, "scores": scores}))
    cfg = {"data": {"evaluate_on": "held_out"}, "run": {"seed": 0}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def test_a_seed_reruns_the_recipes_rl_from_its_warm_start_with_only_the_seed_changed(tmp_path):
    over = seeds.seed_overrides(tmp_path / "recipe", 2)
    assert over == [
        f"model.path={tmp_path / 'recipe' / 'initial_policy'}",
        "model.warm_start_steps=0",
        "run.eval_base=false",
        "run.seed=2",
        f"retriever.index_dir={tmp_path / 'recipe' / 'index'}",
    ]


def test_the_report_gives_each_seed_the_mean_with_the_seeds_spread_and_each_dataset(tmp_path):
    qs = ["hotpotqa/1", "hotpotqa/2", "musique/1", "musique/2"]
    warm = [0, 0, 1, 1]
    runs = [
        recipe_runs.load_seed(_run(tmp_path, "s0", warm, [1, 0, 1, 1], qs, base=[0, 0, 0, 0])),
        recipe_runs.load_seed(_run(tmp_path, "s1", warm, [0, 0, 1, 1], qs, fmt=0.5)),
        recipe_runs.load_seed(_run(tmp_path, "s2", [0, 1, 1, 1], [1, 1, 1, 1], qs)),
    ]
    text = seeds_report.report([0, 1, 2], runs, command="c", machine="m")
    assert "| 0 | 0.500 | 0.750 | +0.250 (0.250) | +1.0 | 1.000 | 0.500 |" in text
    agg = seeds_difference(warm, [r["em"]["after"] for r in runs])
    assert f"RL - warm start: {agg['mean']:+.3f} (s.e. {agg['se']:.3f}" in text
    assert "Format ok after RL, mean over seeds: 0.833" in text
    # seed 2's own warm-start answers differ on one question from seed 0's run: counted, not hidden
    assert "per seed: [0, 0, 1]" in text
    assert "| hotpotqa | 2 | 0.000 |" in text and "| musique | 2 | 1.000 |" in text
    other = recipe_runs.load_seed(_run(tmp_path, "s3", warm, warm, ["x/1", "x/2", "x/3", "x/4"]))
    with pytest.raises(ValueError, match="seed 3 was evaluated on other held-out questions"):
        seeds_report.report([0, 3], [runs[0], other], command="c", machine="m")


def test_a_validation_recipe_run_is_taken_and_reported_as_validation_an_unknown_split_or_unfinished_refused(
    tmp_path,
):
    run = _run(tmp_path, "r", [0, 1], [1, 1], ["a/1", "a/2"])
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["evaluate_on"] = "validation"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert recipe_runs.split_of(recipe_runs.recipe_config(run)) == "validation"
    text = seeds_report.report([0], [recipe_runs.load_seed(run)], command="c", machine="m", split="validation")
    assert "one warm start, validation (2 questions)" in text and "held-out" not in text
    cfg["data"]["evaluate_on"] = "train"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="evaluated on 'train'; known: held_out, validation"):
        recipe_runs.recipe_config(run)
    with pytest.raises(ValueError, match="no finished demo run"):
        recipe_runs.recipe_config(tmp_path / "nothing")


def test_pvpo_eval_gets_the_recipes_agent_settings():
    cfg = {
        "rollout": {
            "max_turns": 4,
            "max_new_tokens": 128,
            "max_response_tokens": 1024,
            "batch_size": 64,
            "engine": "hf",
        },
        "env": {"protocol": "search_r1", "prompt_template": "default", "max_obs_chars": 1000},
        "retriever": {"topk": 2},
        "model": {"dtype": "bfloat16"},
    }
    cmd = evaluate.eval_command(cfg, Path("m"), Path("q.jsonl"), "http://127.0.0.1:1", Path("o"))
    joined = " ".join(cmd)
    for flag in (
        "--template default",
        "--max-turns 4",
        "--max-new-tokens 128",
        "--max-response-tokens 1024",
        "--topk 2",
        "--max-obs-chars 1000",
        "--batch-size 64",
        "--dtype bfloat16",
        "--engine hf",
    ):
        assert flag in joined, flag


def _validation_run(root: Path, qs: list[str]) -> Path:
    run = _run(root, "recipe", [0] * len(qs), [0] * len(qs), ["v/1"] * len(qs))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["evaluate_on"] = "validation"
    cfg |= {
        "model": {"path": "base-model", "dtype": "float32"},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_response_tokens": 64, "batch_size": 4, "engine": "hf"},
        "env": {"protocol": "search_r1"},
        "retriever": {"topk": 2},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "held_out.jsonl").write_text("".join(json.dumps({"id": q, "question": q}) + "\n" for q in qs))
    return run


def test_the_held_out_table_evaluates_base_warm_start_and_each_seed_once_and_later_calls_only_read_it(
    tmp_path, monkeypatch
):
    import contextlib

    import pvpo.retriever.server as server

    qs = ["hotpotqa/1", "hotpotqa/2", "musique/1", "musique/2"]
    # each policy's held-out EM per question (what its pvpo eval answers)
    ems = {"base-model": [0, 0, 0, 0], "initial_policy": [0, 0, 1, 0], "p1": [1, 0, 1, 1], "p2": [1, 1, 1, 0]}
    ran: list[str] = []

    def fake_eval(cmd, check, env):
        model = Path(cmd[cmd.index("--model") + 1]).name
        out = Path(cmd[cmd.index("--out") + 1]) / "held_out"
        out.mkdir(parents=True)
        rows = [
            {"id": q, "output": {"metric_score": {"em": float(e)}, "format_ok": 1.0 if model != "base-model" else 0.0}}
            for q, e in zip(qs, ems[model])
        ]
        (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ran.append(model)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(evaluate.subprocess, "run", fake_eval)
    monkeypatch.setattr(server, "BackgroundServer", lambda d: contextlib.nullcontext(types.SimpleNamespace(url="u")))
    monkeypatch.setattr(seeds, "final_policy", lambda d: Path(f"p{d.name[-1]}"))
    recipe = _validation_run(tmp_path, qs)
    dirs = [recipe.parent / "seed_1", recipe.parent / "seed_2"]
    records = seeds.held_out_once(recipe, [1, 2], dirs, tmp_path / "out")
    assert ran == ["base-model", "initial_policy", "p1", "p2"]
    assert records[0]["em"] == {"before": [0, 0, 1, 0], "after": [1, 0, 1, 1], "base": [0, 0, 0, 0]}
    text = seeds_report.report([1, 2], records, command="c", machine="m", split="held-out")
    assert "| 1 | 0.250 | 0.750 | +0.500 (0.289) |" in text and "Base model -> RL, mean over seeds: +0.750" in text
    # evaluated once: a second call reads what the first wrote and runs nothing
    again = seeds.held_out_once(recipe, [1, 2], dirs, tmp_path / "out")
    assert ran == ["base-model", "initial_policy", "p1", "p2"] and again == records
    cfg = yaml.safe_load((recipe / "config.yaml").read_text())
    cfg["data"]["evaluate_on"] = "held_out"
    (recipe / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="held-out-mode run; its own table is the held-out one"):
        seeds.held_out_once(recipe, [1, 2], dirs, tmp_path / "out2")


def test_seeds_start_from_a_recipe_run_past_its_warm_start_and_the_report_waits_for_its_end(tmp_path, monkeypatch):
    run = _run(tmp_path, "recipe", [0, 1], [1, 1], ["a/1", "a/2"])
    (run / "summary.md").unlink()  # its RL phase still going: warm start, config and index in place
    started: list[int] = []

    def fake_seed(recipe_run: Path, seed: int, out: Path) -> Path:
        started.append(seed)
        return _run(out, f"seed_{seed}", [0, 1], [1, 0], ["a/1", "a/2"])

    monkeypatch.setattr(seeds, "run_seed", fake_seed)
    monkeypatch.setattr(seeds, "machine_line", lambda *a: "m")
    argv = ["recipe", "seeds", "--recipe-run", str(run), "--seeds", "1", "--out", str(tmp_path / "out")]
    got = CliRunner().invoke(app, argv)
    assert got.exit_code == 0 and started == [1] and "still running: --report-only once it ends" in got.output
    assert not (tmp_path / "out" / "results.md").exists()
    # the report needs the recipe run's own result: one line, exit status 2
    got = CliRunner().invoke(app, [*argv, "--report-only"])
    assert got.exit_code == 2 and "no finished demo run there" in got.output and "Traceback" not in got.output
    (run / "summary.md").write_text("done\n")
    got = CliRunner().invoke(app, [*argv, "--report-only"])
    assert got.exit_code == 0, got.output
    text = (tmp_path / "out" / "results.md").read_text()
    assert "2 RL seeds from one warm start" in text
    assert f"command: `pvpo recipe seeds --recipe-run {run} --seeds 1 --out {tmp_path / 'out'} --report-only`" in text


def test_the_seeds_refuse_a_seed_given_twice_or_the_recipe_runs_own_and_held_out_on_a_held_out_run_before_any_run(
    tmp_path, monkeypatch
):
    run = _run(tmp_path, "recipe", [0, 1], [1, 1], ["a/1", "a/2"])
    monkeypatch.setattr(seeds, "run_seed", lambda *a: pytest.fail("a seed ran"))
    for given, said in (("1,1", "give each seed once"), ("0,1", "none equal to the recipe run's own seed 0")):
        got = CliRunner().invoke(app, ["recipe", "seeds", "--recipe-run", str(run), "--seeds", given])
        assert got.exit_code == 2 and said in got.output
    got = CliRunner().invoke(app, ["recipe", "seeds", "--recipe-run", str(run), "--seeds", "x"])
    assert got.exit_code == 2 and "give whole numbers" in got.output
    got = CliRunner().invoke(app, ["recipe", "seeds", "--recipe-run", str(run), "--held-out"])
    assert got.exit_code == 2 and "held-out-mode run; its own table is the held-out one" in got.output


def _curve(run: Path, qs: list[str], by_step: dict[int, list[float]]) -> None:
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    points = [
        {"step": float(k), "accuracy": sum(v) / len(v), "accuracy_se": 0.0, "n": 4.0, "em": v}
        for k, v in by_step.items()
    ]
    best = {"best": None, "points": points, "questions": qs}
    (run / "checkpoints" / "best.json").write_text(json.dumps(best))


def test_the_validation_curve_table_gives_each_seed_by_step_and_the_mean_gain_with_the_seeds_spread(tmp_path):
    qs = ["a/1", "a/2", "a/3", "a/4"]
    r0, r1 = tmp_path / "r0", tmp_path / "r1"
    _curve(r0, qs, {0: [0, 0, 1, 0], 8: [1, 0, 1, 0], 16: [1, 1, 1, 0]})
    _curve(r1, qs, {0: [0, 0, 1, 1], 8: [0, 0, 1, 1], 16: [1, 0, 1, 1]})  # no step 24 in either: not shown
    lines = seeds_report.curve_table([0, 1], [recipe_runs.load_curve(r0), recipe_runs.load_curve(r1)])
    assert lines[1] == "| validation EM by RL step | 0 | 8 | 16 |"
    assert "| seed 0 | 0.250 | 0.500 | 0.750 |" in lines and "| seed 1 | 0.500 | 0.500 | 0.750 |" in lines
    d16 = seeds_difference([0, 0, 1, 0], [[1, 1, 1, 0], [1, 0, 1, 1]])  # against seed 0's step-0 answers
    assert lines[-1].endswith(f"| {d16['mean']:+.3f} ({d16['se']:.3f}) |") and d16["mean"] == 0.5
    assert recipe_runs.load_curve(tmp_path / "none") is None
    _curve(r1, ["b/1", "b/2", "b/3", "b/4"], {0: [0, 0, 0, 0]})
    with pytest.raises(ValueError, match="seed 1's validation curve is over other questions"):
        seeds_report.curve_table([0, 1], [recipe_runs.load_curve(r0), recipe_runs.load_curve(r1)])


def test_the_held_out_base_is_the_model_under_a_warm_start_taken_from_another_run(tmp_path):
    # an arm that starts from another run's saved warm start names that policy as its model.path;
    # its base model is the other run's, not the warm start
    first = tmp_path / "first"
    (first / "initial_policy").mkdir(parents=True)
    (first / "initial_policy" / "config.json").write_text("{}")
    (first / "config.yaml").write_text(yaml.safe_dump({"model": {"path": "smollm2-135m-instruct"}}))
    arm = {"model": {"path": str(first / "initial_policy")}}
    assert recipe_runs.base_model(arm) == Path("smollm2-135m-instruct")
    ckpt = first / "checkpoints" / "step_000016" / "policy"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    assert recipe_runs.base_model({"model": {"path": str(ckpt)}}) == Path("smollm2-135m-instruct")
    # a model folder of its own (no run around it) is its own base
    alone = tmp_path / "weights"
    alone.mkdir()
    (alone / "config.json").write_text("{}")
    assert recipe_runs.base_model({"model": {"path": str(alone)}}) == alone
