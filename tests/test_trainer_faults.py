"""`pvpo train` under faults: a second process on the same run dir, a full disk at a checkpoint, a
hand-edited config.yaml, SIGTERM and Ctrl-C. Each ends in one line (rc 2, or 128 + the signal)
naming the cause and how to go on, leaves no half-written checkpoint, and the run resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fault_support import TINY_RUN, copy_run, error_lines, train_tiny, use_overlap_searcher
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.state.resume import RunDirError, check_resume_config
from tests.conftest import REPO
from tests.test_locks import hold_in_another_process

runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TINY trained for one step, checkpointed: each test resumes a copy of it."""
    return train_tiny(tmp_path_factory.mktemp("trained") / "run", "run.steps=1")


def resume(run: Path, *overrides: str):
    return runner.invoke(app, ["train", "--run-dir", str(run), "--resume", *overrides])


def steps_logged(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoint_entries(run: Path) -> list[str]:
    """The checkpoints folder's entries, less its manifest (`pvpo.owned`)."""
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != ".pvpo-folder.json")


# ---- a second writer ---------------------------------------------------------------------------
def test_a_resume_is_refused_naming_the_pid_while_another_process_holds_the_run_and_accepted_once_it_is_killed(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    holder = hold_in_another_process(run)
    try:
        res = resume(run)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert f"in use by another pvpo process (PID {holder.pid}" in res.output and f"kill {holder.pid}" in res.output
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    res = resume(run, "run.steps=2")
    assert res.exit_code == 0, res.output
    assert steps_logged(run) == [1, 2]


@pytest.mark.slow
def test_a_concurrent_resume_of_a_training_run_is_refused_and_accepted_after_sigkill(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's check end to end: a real `pvpo train --resume` in a child process, a second one
    here while it trains, then SIGKILL of the first and a resume that continues its last checkpoint."""
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    args = [sys.executable, "tests/fault_support.py", "train", "--run-dir", str(run), "--resume", "run.steps=100000"]
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.perf_counter()
        while (run / "checkpoints" / "latest").read_text() == "step_000001" and time.perf_counter() - t0 < 240:
            assert first.poll() is None, "the first training process ended"
            time.sleep(0.05)
        res = resume(run)
        assert res.exit_code == 2 and f"PID {first.pid}, pvpo train" in res.output, res.output
    finally:
        first.kill()  # SIGKILL
        first.wait()
    step = int((run / "checkpoints" / "latest").read_text().removeprefix("step_"))
    res = resume(run, f"run.steps={step + 1}")
    assert res.exit_code == 0, res.output
    assert steps_logged(run) == list(range(1, step + 2))


# ---- a hand-edited config ------------------------------------------------------------------------
def test_a_hand_edited_config_yaml_is_refused_on_resume_naming_each_changed_key(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    text = (run / "config.yaml").read_text()
    assert "  lr: 0.0001\n" in text and "    hidden_size: 32\n" in text
    (run / "config.yaml").write_text(
        text.replace("  lr: 0.0001\n", "  lr: 0.002\n").replace("size: 32\n", "size: 64\n")
    )
    before = (run / "metrics.jsonl").read_bytes()
    res = resume(run, "run.steps=2")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "optim.lr: checkpoint has 0.0001, resumed with 0.002" in res.output
    assert "model.tiny.hidden_size: checkpoint has 32, resumed with 64" in res.output
    assert "config.yaml no longer describes the run" in res.output and "new --run-dir" in res.output
    assert (run / "metrics.jsonl").read_bytes() == before and checkpoint_entries(run) == ["latest", "step_000001"]


def test_a_key_a_resume_may_change_can_be_edited_in_config_yaml_and_no_other(trained: Path, tmp_path: Path) -> None:
    run = copy_run(trained, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("eval_every: 0", "eval_every: 3"))
    check_resume_config(run, load_config(config, ["run.steps=4"]))
    config.write_text(config.read_text().replace("\n  n: 2\n", "\n  n: 3\n"))
    with pytest.raises(RunDirError, match="rollout.n: checkpoint has 2, resumed with 3"):
        check_resume_config(run, load_config(config, ["run.steps=4"]))


# ---- a full disk ----------------------------------------------------------------------------------
def _assert_full_disk_line(output: str, run: Path) -> None:
    lines = error_lines(output)
    assert 1 <= len(lines) <= 3 and "space" in lines[0] and "Traceback" not in output, output
    assert str(run / "checkpoints" / "step_000002") in lines[0]
    assert f"pvpo train --run-dir {run} --resume" in output and "checkpointed at step_000001" in output


def test_a_full_disk_at_a_checkpoint_is_one_line_rc_2_and_the_last_good_checkpoint_resumes(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault-injected: torch's zip writer fails as it does on a full disk (`unexpected pos`, no
    errno) while the file system has no free byte left."""
    import pvpo.atomic

    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    real_save = torch.save

    def save_on_a_full_disk(obj: object, f: object, *args: object, **kwargs: object) -> None:
        if isinstance(f, str | Path) and "step_000002" in str(f):
            Path(f).write_bytes(b"PK\x03\x04 half a zip")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 576 vs 470")
        real_save(obj, f, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(torch, "save", save_on_a_full_disk)
        m.setattr(pvpo.atomic, "_free_bytes", lambda path: 0)
        res = resume(run, "run.steps=3")
    assert res.exit_code == 2, res.output
    _assert_full_disk_line(res.output, run)
    assert checkpoint_entries(run) == ["latest", "step_000001"]  # no step_000002.tmp left
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    res = resume(run, "run.steps=2")
    assert res.exit_code == 0, res.output
    assert steps_logged(run) == [1, 2] and (run / "checkpoints" / "latest").read_text() == "step_000002"


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only: the test is skipped where it cannot mount)."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the fault-injected full-disk test runs everywhere)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_full_tmpfs_at_a_checkpoint_is_one_line_rc_2_and_the_last_good_checkpoint_resumes(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        run = copy_run(trained, disk / "run")
        checkpoint = sum(p.stat().st_size for p in (run / "checkpoints" / "step_000001").rglob("*") if p.is_file())
        st = os.statvfs(disk)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - checkpoint // 2))  # room for half a checkpoint
        res = resume(run, "run.steps=3")
        assert res.exit_code == 2, res.output
        _assert_full_disk_line(res.output, run)
        assert checkpoint_entries(run) == ["latest", "step_000001"]
        filler.unlink()
        res = resume(run, "run.steps=2")
        assert res.exit_code == 0, res.output
        assert steps_logged(run) == [1, 2]


# ---- SIGTERM and Ctrl-C ------------------------------------------------------------------------------
class _KilledTheTest(Exception):
    """What SIGTERM raises here when nothing else handles it (instead of killing pytest)."""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_end_training_with_one_line_saying_where_it_stopped_and_how_to_resume(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    import pvpo.trainer.loop as loop

    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    real_save = loop.save_run_checkpoint

    def save_then_signal(run_dir: Path, step: int, **kwargs: object):
        out = real_save(run_dir, step, **kwargs)  # type: ignore[arg-type]
        os.kill(os.getpid(), signum)
        return out

    def unhandled(*_: object) -> None:
        raise _KilledTheTest

    monkeypatch.setattr(loop, "save_run_checkpoint", save_then_signal)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        res = resume(run, "run.steps=5")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert res.exit_code == 128 + signum, (res.output, res.exception)
    assert "Traceback" not in res.output
    assert res.output.splitlines()[-1] == (
        f"stopped by {signum.name}: {run} logged 2 step(s), checkpointed at step_000002: "
        f"continue it with `pvpo train --run-dir {run} --resume`"
    )
    assert checkpoint_entries(run) == ["latest", "step_000001", "step_000002"]


# ---- nothing a user owns is deleted (pvpo.owned) --------------------------------------------------
def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but pvpo's folder record."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".pvpo-folder.json"
    }


@pytest.mark.slow
def test_a_ctrl_c_storm_during_overwrite_puts_the_old_run_back_and_a_resume_continues_it_without_deleting_it(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 SIGINTs 5 ms apart before the new run's first checkpoint once left the old run in a hidden
    folder that the next --resume deleted at its first checkpoint."""
    run = copy_run(trained, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    before = _tree(run)
    # A new run far longer than the storm, checkpointed only at its end: the 2-step run took 1 s, and
    # on CI's loaded machine the storm once began after it had finished (rc 0, reproduced with one
    # SIGINT 0.9 s after the new config.yaml appeared).
    long_run = [*TINY_RUN, "run.steps=500", "run.checkpoint_every=0"]
    args = [sys.executable, "tests/fault_support.py", "train", "--run-dir", str(run), "--overwrite", *long_run]
    # SIGINT as a terminal's Ctrl-C delivers it, also when the suite runs as a background job (whose
    # children start with SIGINT ignored, which pvpo respects)
    sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=sigint
    )
    t0 = time.perf_counter()
    # the old run's config.yaml moved aside (inside the run dir, or beside it) and the new run's written
    aside = (run / ".pvpo-replaced" / "config.yaml", tmp_path / ".run.pvpo-replaced" / "config.yaml")
    while proc.poll() is None and not (any(a.exists() for a in aside) and (run / "config.yaml").exists()):
        assert time.perf_counter() - t0 < 240, "the new run never started"
        time.sleep(0.005)
    assert not (run / "checkpoints" / "latest").exists()  # before the new run's first checkpoint
    for _ in range(40):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.005)
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 130 and "Exception ignored" not in out and "Traceback" not in out, out
    assert _tree(run) == before
    use_overlap_searcher(monkeypatch)
    res = resume(run, "run.steps=2")
    assert res.exit_code == 0, res.output
    assert steps_logged(run) == [1, 2] and (run / "notes.txt").read_text() == "mine"
    assert all(_tree(run).get(k) == v for k, v in before.items() if k.startswith("checkpoints/step_000001/"))


def test_a_resume_after_an_overwrite_cut_by_sigkill_puts_the_old_run_back_and_never_deletes_it(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.owned import move_aside, replaceable
    from pvpo.trainer.state.run_dir import RUN_KIND, RunDir

    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    before = _tree(run)
    # what a SIGKILL leaves in the middle of `pvpo train --overwrite`: the old run aside, the new one begun
    move_aside(run, replaceable([p.name for p in run.iterdir() if RUN_KIND.writes(p.name)]))
    (run / "config.yaml").write_text("run: {steps: 99}\n")
    (run / "metrics.jsonl").write_text("")
    res = resume(run, "run.steps=2")
    assert res.exit_code == 0, res.output
    assert steps_logged(run) == [1, 2]
    kept = _tree(run)
    assert all(kept.get(k) == v for k, v in before.items() if k.startswith("checkpoints/step_000001/"))
    assert not (run / ".pvpo-replaced").exists() and RunDir(run).config.read_text() != "run: {steps: 99}\n"


def test_overwrite_of_a_folder_that_is_no_run_trains_beside_the_users_file_which_alone_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("chapter 1")
    res = runner.invoke(app, ["train", "--run-dir", str(mine), *TINY_RUN, "run.steps=1"])
    assert res.exit_code == 2 and "thesis.txt" in res.output and "--overwrite" in res.output, res.output
    res = runner.invoke(app, ["train", "--run-dir", str(mine), "--overwrite", *TINY_RUN, "run.steps=1"])
    assert res.exit_code == 0, res.output
    assert (mine / "thesis.txt").read_text() == "chapter 1" and steps_logged(mine) == [1]


def test_a_damaged_state_file_in_a_checkpoint_is_named_and_the_runs_own_copy_is_left_as_it_was(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    saved = run / "checkpoints" / "step_000001" / "run_state" / "anchor.json"
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    top = (run / "anchor.json").read_bytes()
    res = resume(run, "run.steps=2")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "run_state/anchor.json is damaged" in error_lines(res.output)[0], res.output
    assert (run / "anchor.json").read_bytes() == top
    # a layout error (a list where a number goes) is named the same way
    saved.write_text(json.dumps({**json.loads(top), "computed_at_step": [1]}))
    res = resume(run, "run.steps=2")
    assert res.exit_code == 2 and "anchor.json is damaged (computed_at_step" in res.output, res.output


@pytest.mark.parametrize("damage", ["5", '{"step": "1"}'])
def test_a_metrics_row_that_is_no_steps_metrics_is_named_at_resume(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    (run / "metrics.jsonl").write_text(damage + "\n" + (run / "metrics.jsonl").read_text())
    res = resume(run, "run.steps=2")
    assert res.exit_code == 2 and "metrics.jsonl: row 1" in res.output and "Traceback" not in res.output, res.output


def test_temporary_files_of_killed_writes_are_removed_at_resume(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_overlap_searcher(monkeypatch)
    run = copy_run(trained, tmp_path / "run")
    planted = [run / "checkpoints" / ".latest.k2j4x9.tmp", run / ".anchor.json.a8d3q1.tmp", run / "notes.txt"]
    for p in planted:
        p.write_text("x")
    res = resume(run, "run.steps=1")
    assert res.exit_code == 0, res.output
    assert [p.exists() for p in planted] == [False, False, True]  # the user's notes.txt is no temporary file


def test_a_resume_without_a_checkpoint_counts_the_reference_state_it_reuses_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after its anchor and GT cache were saved but before its first checkpoint logged
    their rollouts as 0 once resumed: the state was reused and its cost never counted."""
    from trainer_support import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train
    from pvpo.trainer.reference.machinery import Reference
    from pvpo.trainer.state.resume import resume_config

    gs = [*TINY_RUN, "algorithm.group_sampling.enabled=true", "rollout.max_turns=3", "rollout.max_response_tokens=200",
          "rollout.n=3", "algorithm.gt.replace_per_group=2", "run.steps=1"]  # fmt: skip
    searcher = OverlapSearcher(WORLD.passages)
    whole = train(load_config(None, gs), tmp_path / "whole", searcher=searcher, show_progress=False).metrics[0]
    real = Reference.ensure_group_sampling

    def then_killed(self: Reference, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        raise RuntimeError("killed")

    monkeypatch.setattr(Reference, "ensure_group_sampling", then_killed)
    with pytest.raises(RuntimeError, match="killed"):
        train(load_config(None, gs), tmp_path / "cut", searcher=searcher, show_progress=False)
    assert (tmp_path / "cut" / "gt_cache.json").exists() and not (tmp_path / "cut" / "checkpoints").exists()
    monkeypatch.setattr(Reference, "ensure_group_sampling", real)
    cfg = resume_config(tmp_path / "cut", [])
    resumed = train(cfg, tmp_path / "cut", resume=True, searcher=searcher, show_progress=False).metrics[0]
    keys = [k for k in whole if k.startswith("cost/")]
    assert whole["cost/cum_anchor_rollouts"] > 0 and whole["cost/cum_gt_rollouts"] > 0
    assert {k: resumed[k] for k in keys} == {k: whole[k] for k in keys}


def test_a_resume_under_torchrun_of_a_one_process_run_is_refused_in_one_line_before_launching(trained: Path) -> None:
    res = runner.invoke(app, ["train", "--run-dir", str(trained), "--resume", "--nproc", "2"])
    assert res.exit_code == 2 and "saved by 1 process(es), this resume asks for 2" in res.output, res.output
    assert len(error_lines(res.output)) <= 3 and "Traceback" not in res.output
