"""Run directories (issue 16, item 8): a resume trains with the run's own config and refuses a
conflicting one; a fresh run refuses a directory that already holds a run unless told to
overwrite it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_support import TINY, WORLD, OverlapSearcher
from typer.testing import CliRunner

from pvpo.trainer.config.schema import dump_config, load_config
from pvpo.trainer.state.checkpoint import save_checkpoint
from pvpo.trainer.state.resume import RunDirError, check_resume_config, prepare_fresh, resume_config


def _run_with_config(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config(None, ["run.steps=3", "optim.lr=0.5", *overrides]), run / "config.yaml")
    return run


def test_resume_uses_the_runs_own_config_and_allows_safe_overrides(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    cfg = resume_config(run, ["run.steps=5", "retriever.retries=2"])
    assert (cfg.optim.lr, cfg.run.steps, cfg.retriever.retries) == (0.5, 5, 2)


def test_resume_refuses_an_override_that_changes_the_training(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    with pytest.raises(RunDirError, match=r"optim.lr: run has 0.5, asked 1.0") as info:
        resume_config(run, ["optim.lr=1.0"])
    assert "run.steps" in str(info.value)  # the message lists what may change


def test_resume_refuses_a_different_config_file_naming_each_differing_key(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text("run: {steps: 3, seed: 7}\noptim: {lr: 0.5}\nrollout: {n: 8}\n")
    with pytest.raises(RunDirError) as info:
        resume_config(run, [], other)
    assert "run.seed: run has 0, asked 7" in str(info.value) and "rollout.n: run has 4, asked 8" in str(info.value)


def test_resume_refuses_fewer_steps_than_the_checkpoint_holds(tmp_path: Path) -> None:
    class Saves:
        def save_pretrained(self, path: Path) -> None:
            Path(path).mkdir(parents=True, exist_ok=True)

    run = _run_with_config(tmp_path)
    layer = torch.nn.Linear(1, 1)
    save_checkpoint(run, 3, model=Saves(), tokenizer=Saves(), optimizer=torch.optim.SGD(layer.parameters(), lr=1))
    with pytest.raises(RunDirError, match="checkpointed at step 3 but run.steps=2"):
        check_resume_config(run, load_config(run / "config.yaml", ["run.steps=2"]))


def test_resume_without_a_saved_config_needs_one(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="nothing to resume"):
        resume_config(tmp_path, [])


def test_a_fresh_run_refuses_a_non_empty_run_dir_and_overwrite_clears_it(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="--resume .* --overwrite"):
        prepare_fresh(tmp_path)
    prepare_fresh(tmp_path, overwrite=True)
    assert list(tmp_path.iterdir()) == []
    prepare_fresh(tmp_path / "absent")  # nothing there: nothing to refuse


def test_cli_refuses_a_conflicting_resume_and_an_occupied_run_dir_with_exit_2(tmp_path: Path) -> None:
    from pvpo.cli import app

    run = _run_with_config(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text("optim: {lr: 0.1}\n")
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--resume", "--config", str(other)])
    assert res.exit_code == 2 and "optim.lr" in res.output, res.output
    assert "lr: 0.5" in (run / "config.yaml").read_text()  # the run's config is left as it was
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--config", str(other)])
    assert res.exit_code == 2 and "--overwrite" in res.output, res.output
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--resume", "--overwrite"])
    assert res.exit_code == 2 and "contradict" in res.output


def test_a_finished_run_resumes_with_its_own_config_for_more_steps(tmp_path: Path) -> None:
    from pvpo.trainer.loop import train

    searcher = OverlapSearcher(WORLD.passages)
    run = tmp_path / "run"
    train(load_config(None, TINY + ["run.steps=1", "optim.lr=0.003"]), run, searcher=searcher, show_progress=False)
    with pytest.raises(RunDirError):
        train(load_config(None, TINY + ["run.steps=2"]), run, searcher=searcher, show_progress=False)
    cfg = resume_config(run, ["run.steps=2"])
    assert cfg.optim.lr == 0.003
    result = train(cfg, run, resume=True, searcher=searcher, show_progress=False)
    assert [m["step"] for m in result.metrics] == [1, 2]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "steps: 2" in (run / "config.yaml").read_text()
