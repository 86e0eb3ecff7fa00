"""torchrun + FSDP2 on CPU (gloo) with rollouts beside the update (`rollout.max_staleness=1`): two
ranks train the smoke config, each rank's rollout thread sampling while its trainer thread updates
(weights gathered in the trainer's thread, loaded between turns), and a run killed once its first
checkpoint is in place resumes on two ranks, regenerating the episodes the checkpoint left in
flight."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path

import pytest
from parallel_support import OVERRIDES, SMOKE, TIMEOUT, rows, run, start

# steps of a few seconds (8 prompts x 4 rollouts), so the kill lands while the run is still training
ASYNC = [*OVERRIDES, "rollout.max_staleness=1", "run.steps=5", "data.prompts_per_step=8", "rollout.n=4"]


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc). torchrun starts each rank in a session of its own,
    so killing the launcher's process group leaves the ranks running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


def _kill_after_first_checkpoint(args: list[str], run_dir: Path, log: Path) -> None:
    """Start a 2-rank run and SIGKILL the launcher and both ranks as soon as a checkpoint is
    `latest`."""
    started = start(args, nproc=2, log=log)
    latest, deadline = run_dir / "checkpoints" / "latest", time.monotonic() + TIMEOUT
    try:
        while not latest.exists():
            assert started.proc.poll() is None, f"the run ended before its first checkpoint: {started.tail()}"
            assert time.monotonic() < deadline, f"no checkpoint within {TIMEOUT} s"
            time.sleep(0.05)
    finally:
        for pid in _process_tree(started.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        started.proc.wait()


@pytest.mark.slow
def test_two_gloo_ranks_train_one_version_ahead_and_resume_after_a_kill(tmp_path):
    broken = tmp_path / "broken"
    _kill_after_first_checkpoint(["--config", SMOKE, "--run-dir", str(broken), *ASYNC], broken, tmp_path / "broken.log")
    time.sleep(2)  # a rank left running would write on
    assert not (broken / "checkpoints" / "step_000005").exists(), "the run finished before it was killed"
    run(["--run-dir", str(broken), "--resume"], nproc=2, log=tmp_path / "resumed.log")
    logged = rows(broken)
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(v) for r in logged for v in r.values())
    assert logged[0]["stale/lag_0"] == 1.0 and logged[0]["grad_norm"] > 0
    # the first step after the checkpoint: its episodes, left in flight, were sampled again (both
    # ranks') by the checkpoint's policy; the steps after it train one version behind again
    resumed = [i for i, r in enumerate(logged) if "pipeline/regenerated_episodes" in r]
    assert len(resumed) == 1 and resumed[0] >= 1, resumed
    first = logged[resumed[0]]
    assert first["pipeline/regenerated_episodes"] > 0 and first["stale/lag_0"] == 1.0
    assert logged[-1]["stale/lag_1"] > 0
    assert (broken / "checkpoints" / "step_000005").is_dir()
