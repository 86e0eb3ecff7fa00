"""Checkpoints and metrics that a crash or a tampered run directory cannot turn against the
trainer: weights-only loading, a confined `latest` pointer, atomic
directories, and a torn last line of `metrics.jsonl` dropped on resume."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pvpo.atomic import atomic_write_dir, read_jsonl
from pvpo.trainer.state.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from pvpo.trainer.state.metrics_log import MetricsLogger


class _Saves:
    """Stands in for a model / tokenizer: `save_pretrained` writes one file."""

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "config.json").write_text("{}")


class _RunsCode:
    """A pickle payload: unpickling it creates the file `flag`."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self):
        return (os.mkdir, (str(self.flag),))


def _optimizer() -> torch.optim.Optimizer:
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    return opt


def _save(run: Path, step: int) -> Path:
    return save_checkpoint(run, step, model=_Saves(), tokenizer=_Saves(), optimizer=_optimizer())


def test_rng_and_optimizer_state_round_trip_through_a_weights_only_load(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ckpt = _save(tmp_path, 1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    state = load_trainer_state(ckpt)
    set_rng_state(state["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert state["step"] == 1 and state["optimizer"]["state"][0]["exp_avg"].shape == (2, 3)


def test_a_checkpoint_with_the_legacy_numpy_rng_tuple_still_loads(tmp_path: Path) -> None:
    np.random.seed(5)
    legacy = {
        "optimizer": {},
        "step": 4,
        "extra": {},
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state()},
    }
    (tmp_path / "c").mkdir()
    torch.save(legacy, tmp_path / "c" / "trainer_state.pt")
    draw = np.random.rand()
    set_rng_state(load_trainer_state(tmp_path / "c")["rng"])
    assert np.random.rand() == draw


def test_a_trainer_state_whose_pickle_would_run_code_is_refused_unrun(tmp_path: Path) -> None:
    flag = tmp_path / "payload_ran"
    (tmp_path / "c").mkdir()
    torch.save({"step": 1, "rng": _RunsCode(flag)}, tmp_path / "c" / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        load_trainer_state(tmp_path / "c")
    assert not flag.exists()


@pytest.mark.parametrize("pointer", ["../../x", "/etc", "step_000001/../../../x", "..", "policy"])
def test_a_latest_pointer_outside_checkpoints_is_refused(tmp_path: Path, pointer: str) -> None:
    outside = tmp_path / "x"
    outside.mkdir()
    torch.save({"step": 7}, outside / "trainer_state.pt")
    run = tmp_path / "run" / "r"
    _save(run, 1)
    (run / "checkpoints" / "latest").write_text(pointer)
    with pytest.raises(CheckpointError, match="refusing"):
        latest_checkpoint(run)


def test_a_step_directory_that_is_a_symlink_out_of_checkpoints_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    torch.save({"step": 7}, outside / "trainer_state.pt")
    run = tmp_path / "run"
    _save(run, 1)
    (run / "checkpoints" / "step_000009").symlink_to(outside)
    (run / "checkpoints" / "latest").write_text("step_000009")
    with pytest.raises(CheckpointError):
        latest_checkpoint(run)


def test_latest_names_the_newest_checkpoint_and_older_ones_are_pruned(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _save(tmp_path, step)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]


def test_atomic_write_dir_leaves_the_previous_directory_when_the_writer_crashes(tmp_path: Path) -> None:
    target = tmp_path / "initial_policy"
    atomic_write_dir(target, lambda d: (d / "config.json").write_text("old"))

    def crash(d: Path) -> None:
        (d / "config.json").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write_dir(target, crash)
    assert (target / "config.json").read_text() == "old" and not (tmp_path / "initial_policy.tmp").exists()
    atomic_write_dir(target, lambda d: (d / "config.json").write_text("new"))
    assert (target / "config.json").read_text() == "new" and not (tmp_path / "initial_policy.tmp").exists()


def test_read_jsonl_drops_a_torn_last_line_but_rejects_a_bad_line_before_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "loss": 0.')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_jsonl(path)


def test_metrics_logger_resumes_over_a_torn_tail_and_appends_after_it(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    logger = MetricsLogger(tmp_path, resume_step=2, tensorboard=False)
    logger.log(3, {"x": 3.0})
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["x"] == 3.0


# ---- damaged checkpoints on `pvpo train --resume`: one line, rc 2, the file and what to do ----
def _resume_cli(run: Path) -> tuple[int, str]:
    from typer.testing import CliRunner

    from pvpo.cli import app
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.config.written import dump_config

    dump_config(load_config(None, ["run.steps=5"]), run / "config.yaml")
    res = CliRunner().invoke(app, ["train", "--run-dir", str(run), "--resume"])
    assert "Traceback" not in res.output and res.output.count("\n") <= 3, res.output
    return res.exit_code, res.output


def test_resume_with_latest_naming_a_step_that_is_gone_says_which_to_resume_from(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step_000002")
    rc, out = _resume_cli(tmp_path)
    assert rc == 2 and "latest names step_000002, which is gone" in out, out
    assert "write `step_000001` into" in out


def test_resume_with_a_truncated_trainer_state_is_one_line_naming_the_file(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    state = tmp_path / "checkpoints" / "step_000002" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    rc, out = _resume_cli(tmp_path)
    assert rc == 2 and f"{state} is damaged" in out and "step_000001" in out, out
    with pytest.raises(CheckpointError, match="damaged"):
        load_trainer_state(state.parent)


def test_resume_with_latest_outside_the_run_is_one_line_rc_2(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run, 1)
    (run / "checkpoints" / "latest").write_text("../../elsewhere")
    rc, out = _resume_cli(run)
    assert rc == 2 and "latest names '../../elsewhere'" in out and "step_000001" in out, out
