"""`pvpo recipe sft-arm` (pvpo.recipes.multihop.sft_*) and the warm start's data order: the compute-matched SFT arm continues the
recipe's warm start for as many steps as the RL phase's measured wall time buys, first on the GT
trajectories the warm start never drew, in its own data-order seed, and is compared with the RL
seeds with the seeds' spread in the s.e."""

from __future__ import annotations

import contextlib
import json
import random
import sys
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.recipes.multihop import evaluate, sft_plan, sft_report, sft_train
from pvpo.trainer.model.warmstart import continued_batches, sft_batches


def _inline_order(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The warm start's draw as its loop wrote it inline: a fresh shuffle whenever fewer than a batch is left."""
    rng, order, out = random.Random(seed), list[int](), list[list[int]]()
    for _ in range(steps):
        if len(order) < batch_size:
            fresh = list(range(n))
            rng.shuffle(fresh)
            order += fresh
        out.append(order[:batch_size])
        order = order[batch_size:]
    return out


@pytest.mark.parametrize(("n", "batch", "steps"), [(517, 8, 32), (7, 3, 6), (5, 8, 2)])
def test_the_warm_starts_batches_are_drawn_as_its_loop_always_drew_them(n, batch, steps):
    assert sft_batches(n, batch, steps, seed=0) == _inline_order(n, batch, steps, 0)
    assert sft_batches(n, batch, steps, seed=3) == _inline_order(n, batch, steps, 3)


def test_a_continued_warm_start_draws_the_trajectories_never_drawn_first_then_epochs_in_its_own_seed():
    # the recipe's sizes: 517 trajectories, 32 steps of 8 drew 256; 80 more steps
    seen = {i for b in sft_batches(517, 8, 32, seed=0) for i in b}
    got = continued_batches(517, 8, 80, seed=1, first_steps=32, first_seed=0)
    assert len(got) == 80 and all(len(b) == 8 for b in got)
    new = [i for b in got[:32] for i in b]
    assert not set(new) & seen and len(set(new)) == 256  # 32 steps of trajectories the warm start never drew
    assert set(got[32][:5]) == set(range(517)) - seen - set(new)  # the last 5 new ones, then a second epoch
    assert len({i for b in got for i in b} - seen) == 261  # every unseen trajectory drawn
    # the data-order seed orders them; the same seed, the same batches
    other = continued_batches(517, 8, 80, seed=2, first_steps=32, first_seed=0)
    assert other != got and {i for b in other[:32] for i in b} | set(other[32][:5]) == set(range(517)) - seen
    assert continued_batches(517, 8, 80, seed=1, first_steps=32, first_seed=0) == got
    # a warm start that had drawn every trajectory: whole epochs at once
    epochs = continued_batches(4, 2, 4, seed=0, first_steps=2, first_seed=0)
    assert sorted(i for b in epochs[:2] for i in b) == [0, 1, 2, 3] == sorted(i for b in epochs[2:] for i in b)


def _finished_run(
    root: Path, name: str, *, start: str, step_s: list[float], anchor_s: float = 0.0, ems=None, qs=None
) -> Path:
    run = root / name
    (run / "initial_policy").mkdir(parents=True)
    (run / "initial_policy" / "config.json").write_text("{}")
    (run / "summary.md").write_text("done\n")
    qs = qs or ["a/1", "a/2", "b/1", "b/2"]
    before, after = ems or ([0, 0, 0, 0], [0, 0, 0, 0])
    scores = {"after": [{"em": float(x), "format_ok": 1.0} for x in after]}
    (run / "held_out_em.json").write_text(
        json.dumps({"questions": qs, "em": {"before": before, "after": after}, "scores": scores})
    )
    rows = [
        {
            "step": k + 1,
            "time/rollout_s": s / 4,
            "time/train_s": 3 * s / 4,
            **({"time/anchor_s": anchor_s} if k == 0 else {}),
        }
        for k, s in enumerate(step_s)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "data": {"evaluate_on": "validation"},
        "run": {"seed": 0, "steps": len(step_s)},
        "model": {"path": start, "warm_start_steps": 4, "warm_start_batch_size": 8, "warm_start_lr": 1e-4},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def _recipe(root: Path, *, sft_seconds: float | None = 40.0, **kw) -> Path:
    run = _finished_run(root, "recipe", start="smollm2-135m-instruct", **kw)
    ws = {"losses": [1.0, 0.8, 0.6, 0.5], "questions": ["w/1"], **({"sft_seconds": sft_seconds} if sft_seconds else {})}
    (run / "warm_start.json").write_text(json.dumps(ws))
    return run


def _agent_settings(run: Path) -> None:
    """What `pvpo eval` of the run's policies reads from its config.yaml (`rl_seeds.eval_command`)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["dtype"] = "float32"
    cfg["rollout"] = {"max_turns": 2, "max_new_tokens": 8, "max_response_tokens": 64, "batch_size": 4, "engine": "hf"}
    cfg["env"], cfg["retriever"] = {"protocol": "search_r1"}, {"topk": 2}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_the_steps_are_the_rl_phases_measured_wall_time_over_one_warm_start_steps(tmp_path):
    # RL phase of each run: its steps' rollouts + updates + the anchor before them; evaluations left out
    recipe = _recipe(tmp_path, step_s=[100, 120], anchor_s=30)  # 250 s
    seed1 = _finished_run(tmp_path, "seed_1", start=str(recipe / "initial_policy"), step_s=[110, 110], anchor_s=40)
    assert sft_plan.rl_phase_seconds(recipe) == pytest.approx(250) and sft_plan.rl_phase_seconds(seed1) == 260
    p = sft_plan.plan(recipe, [recipe, seed1])
    # one SFT step: 40 s of SFT over the warm start's 4 steps = 10 s; mean RL phase 255 s -> 26 steps (rounded)
    assert p["sft_step_s"] == 10.0 and p["rl_phase_mean_s"] == 255 and p["steps"] == 26
    assert p["warm_start"] == {"steps": 4, "seed": 0, "batch_size": 8, "lr": 1e-4}
    # other runs, another count: refused for an OUT planned with the first
    assert sft_plan.fixed_plan(tmp_path / "out", p)["steps"] == 26
    slow = _finished_run(tmp_path, "slow", start=str(recipe / "initial_policy"), step_s=[400, 400])
    with pytest.raises(ValueError, match="planned 26 SFT steps"):
        sft_plan.fixed_plan(tmp_path / "out", sft_plan.plan(recipe, [slow]))
    # a run from another start is no RL arm of this warm start
    other = _finished_run(tmp_path, "other", start="smollm2-135m-instruct", step_s=[100])
    with pytest.raises(ValueError, match="not from .*initial_policy"):
        sft_plan.plan(recipe, [other])


def test_a_run_without_the_sft_seconds_record_takes_the_summarys_warm_start_wall_time(tmp_path):
    recipe = _recipe(tmp_path, sft_seconds=None, step_s=[100])
    (recipe / "summary.md").write_text(
        "| run | value |\n|---|---|\n| wall time (s): total / index+serve / warm start / RL+eval | 500 / 20 / 80 / 400 |\n"
    )
    step_s, source = sft_plan.sft_step_seconds(recipe)
    assert step_s == 20.0 and "GT trajectories written included" in source
    (recipe / "summary.md").write_text("done\n")
    with pytest.raises(ValueError, match="neither warm_start.json's sft_seconds nor"):
        sft_plan.sft_step_seconds(recipe)


def test_each_seed_trains_in_a_child_process_with_the_planned_steps_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    ran: list[list[str]] = []

    def child(cmd, check, env):
        ran.append(cmd)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(evaluate.subprocess, "run", child)
    out = tmp_path / "out"
    done = sft_train.seed_dir(out, 0)
    (done / "policy").mkdir(parents=True)
    (done / "policy" / "config.json").write_text("{}")
    (done / "sft.json").write_text("{}")
    sft_train.run_seeds(tmp_path / "recipe", [0, 2], 26, out)
    assert len(ran) == 1 and ran[0] == [
        sys.executable,
        *("-m", "pvpo.cli", "recipe", "sft-seed"),
        *("--recipe-run", str(tmp_path / "recipe"), "--out", str(out), "--seed", "2", "--steps", "26"),
    ]
    # a seed folder holding a user's file is refused before anything runs
    (sft_train.seed_dir(out, 3)).mkdir()
    (sft_train.seed_dir(out, 3) / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files this arm does not write"):
        sft_train.run_seeds(tmp_path / "recipe", [3], 26, out)
    assert len(ran) == 1
    # a seed whose child process fails is one line, naming the seed
    monkeypatch.setattr(evaluate.subprocess, "run", lambda cmd, check, env: types.SimpleNamespace(returncode=2))
    with pytest.raises(ValueError, match="SFT seed 4 failed"):
        sft_train.run_seeds(tmp_path / "recipe", [4], 26, out)


def test_the_child_process_of_a_seed_refuses_a_folder_that_is_no_recipe_run_in_one_line(tmp_path):
    argv = ["recipe", "sft-seed", "--recipe-run", str(tmp_path), "--out", str(tmp_path / "o"), "--seed", "0"]
    got = CliRunner().invoke(app, [*argv, "--steps", "1"])
    assert got.exit_code == 2 and "no demo run there (config.yaml)" in got.output and "Traceback" not in got.output


def test_the_arm_refuses_bad_input_in_one_line_before_it_plans_or_trains(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, step_s=[100])
    monkeypatch.setattr(sft_train, "run_child", lambda *a: pytest.fail("a seed trained"))
    base = ["recipe", "sft-arm", "--recipe-run", str(recipe), "--out", str(tmp_path / "out")]
    cases = (
        ([], "--match-wall-of: name the RL arm's finished seed runs"),
        (["--match-wall-of", str(recipe), "--held-out"], "--held-out needs --rl-seeds-out"),
        (["--match-wall-of", str(recipe), "--seeds", "1,1"], "give each data-order seed once"),
        (["--match-wall-of", str(tmp_path / "none")], "no finished demo run there"),
    )
    for extra, said in cases:
        got = CliRunner().invoke(app, [*base, *extra])
        assert got.exit_code == 2 and said in got.output, got.output
    assert not (tmp_path / "out" / "plan.json").exists()


def _sft_seed(out: Path, seed: int, steps: int = 26) -> None:
    folder = sft_train.seed_dir(out, seed)
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "config.json").write_text("{}")
    rec = {"steps": steps, "sft_seconds": 250.0 + seed, "new_trajectories": 200, "trajectories": 517, "epochs": 0.4}
    (folder / "sft.json").write_text(json.dumps(rec))


def _fake_eval(answers: dict[str, list[int]], qs: list[str], ran: list[str]):
    def run(cmd, check, env):
        model = Path(cmd[cmd.index("--model") + 1]).parent.name  # seed_<k>/policy -> seed_<k>
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "validation").mkdir(parents=True)
        rows = [
            {"id": q, "output": {"metric_score": {"em": float(e)}, "format_ok": 1.0}}
            for q, e in zip(qs, answers[model])
        ]
        (out / "validation" / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ran.append(f"{model}:{out.name}")
        return types.SimpleNamespace(returncode=0)

    return run


def test_the_report_gives_each_arm_over_the_warm_start_and_rl_minus_sft_with_the_seeds_spread(tmp_path, monkeypatch):
    import pvpo.retriever.server as server
    from pvpo.stats import seeds_contrast

    qs = ["a/1", "a/2", "b/1", "b/2"]
    warm = [0, 1, 0, 0]
    recipe = _recipe(tmp_path, step_s=[100, 120], anchor_s=30, ems=(warm, [1, 1, 0, 0]), qs=qs)
    seed1 = _finished_run(
        tmp_path, "seed_1", start=str(recipe / "initial_policy"), step_s=[130, 130], ems=(warm, [1, 1, 1, 0]), qs=qs
    )
    (recipe / "validation.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in qs))
    _agent_settings(recipe)
    out = tmp_path / "out"
    for s in (0, 1):
        _sft_seed(out, s)
    sft = {"seed_0": [0, 1, 0, 1], "seed_1": [0, 0, 0, 0]}
    ran: list[str] = []
    monkeypatch.setattr(evaluate.subprocess, "run", _fake_eval(sft, qs, ran))
    monkeypatch.setattr(server, "BackgroundServer", lambda d: contextlib.nullcontext(types.SimpleNamespace(url="u")))
    p = sft_plan.plan(recipe, [recipe, seed1])
    text = "\n".join(sft_report.split_report(recipe, [recipe, seed1], [0, 1], out, p))
    assert ran == ["seed_0:eval", "seed_1:eval"]
    # RL seeds 0.5 and 0.75 over a warm start of 0.25; SFT seeds 0.5 and 0.0
    assert "| warm start | | 0.250 |" in text
    assert "| 2 | 0.625 (0.500, 0.750) | +0.375 (" in text and "| 2 | 0.250 (0.500, 0.000) | +0.000 (" in text
    c = seeds_contrast([[1, 1, 0, 0], [1, 1, 1, 0]], [[0, 1, 0, 1], [0, 0, 0, 0]])
    assert f"RL - SFT at equal compute: {c['mean']:+.3f} EM (s.e. with seeds {c['se']:.3f}" in text
    assert "| a | 2 | 0.500 |" in text and "| b | 2 | 0.000 |" in text  # per dataset
    # the step count's derivation and what each arm spent
    assert "mean 255 s" in text and "= **26 steps**" in text and "250, 251 s (mean 250, 0.98x the RL phase)" in text
    # evaluated once: a second report reads the kept answers
    sft_report.split_report(recipe, [recipe, seed1], [0, 1], out, p)
    assert ran == ["seed_0:eval", "seed_1:eval"]


def test_the_held_out_comparison_needs_the_rl_seeds_kept_held_out_evaluations(tmp_path, monkeypatch):
    import pvpo.retriever.server as server

    qs = ["a/1", "a/2"]
    recipe = _recipe(tmp_path, step_s=[100], qs=qs, ems=([0, 0], [0, 0]))
    (recipe / "held_out.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in qs))
    _agent_settings(recipe)
    out, rl_out = tmp_path / "out", tmp_path / "rl_seeds"
    _sft_seed(out, 0)
    p = sft_plan.plan(recipe, [recipe])
    with pytest.raises(ValueError, match="run pvpo recipe seeds --held-out first"):
        sft_report.held_out_report(recipe, rl_out, [0], out, p)
    for label, ems in (("warm", [0, 0]), ("seed_0", [1, 0]), ("seed_1", [1, 1])):
        d = rl_out / "held_out" / label / "held_out"
        d.mkdir(parents=True)
        rows = [{"id": q, "output": {"metric_score": {"em": float(e)}, "format_ok": 1.0}} for q, e in zip(qs, ems)]
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d.parent / "done").write_text("x\n")
    ran: list[str] = []
    monkeypatch.setattr(evaluate.subprocess, "run", _fake_eval({"seed_0": [0, 1]}, qs, ran))
    monkeypatch.setattr(server, "BackgroundServer", lambda d: contextlib.nullcontext(types.SimpleNamespace(url="u")))
    text = "\n".join(sft_report.held_out_report(recipe, rl_out, [0], out, p))
    assert ran == ["seed_0:seed_0"]  # OUT/held_out/seed_0, once
    assert "held-out (2 questions), evaluated once" in text
    assert "| 2 | 0.750 (0.500, 1.000) | +0.750 (" in text and "| 1 | 0.500 (0.500) | +0.500 (" in text
    assert "`pvpo eval --model " in text and str(out / "seed_0" / "policy") in text


@pytest.mark.slow
def test_the_arm_continues_a_runs_warm_start_on_its_rebuilt_trajectories_and_saves_the_policy(tmp_path):
    """A real tiny run: a warm start of 2 steps on MuSiQue-format dataset GT, then the arm's 3 steps."""
    import torch
    from trainer_support import TINY, OverlapSearcher

    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train
    from pvpo.trainer.model.policy import load_policy
    from tests.test_trainer_reference_dataset_source import P_APA, P_JOURNAL, P_OTHER, _musique_rows, _passages

    source = tmp_path / "musique.json"
    source.write_text(json.dumps(_musique_rows(9)))
    over = [
        *TINY,
        f"data.source={source}",
        "data.held_out_examples=2",
        "data.max_train_examples=2",
        "data.warm_start_examples=5",
        "model.warm_start_steps=2",
        "model.warm_start_batch_size=2",
        "rollout.max_turns=3",
        "run.steps=1",
        "run.eval_base=false",
    ]
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    run = tmp_path / "run"
    train(load_config(None, over), run, searcher=searcher, show_progress=False)
    ws = json.loads((run / "warm_start.json").read_text())
    assert len(ws["losses"]) == 2 and ws["sft_seconds"] > 0  # the arm's step time is read from here
    rec = sft_train.train_seed(run, 1, 3, tmp_path / "arm" / "seed_1", searcher=searcher, show_progress=False)
    # 5 trajectories; the warm start drew 4, so the first continued step holds the fifth
    assert rec["steps"] == 3 and len(rec["losses"]) == 3 and rec["trajectories"] == 5
    assert rec["new_trajectories"] == 1 and rec["sft_seconds"] > 0 and rec["peak_rss_gib"] > 0
    start = load_policy(run / "initial_policy").model.state_dict()
    after = load_policy(tmp_path / "arm" / "seed_1" / "policy").model.state_dict()
    assert any(not torch.equal(start[k], after[k]) for k in start)
    # trajectories rebuilt otherwise than the warm start wrote them are refused
    ws["questions"] = ws["questions"][:-1]
    (run / "warm_start.json").write_text(json.dumps(ws))
    with pytest.raises(ValueError, match="were not rebuilt as its warm_start.json lists them"):
        sft_train.train_seed(run, 2, 1, tmp_path / "arm" / "seed_2", searcher=searcher, show_progress=False)
