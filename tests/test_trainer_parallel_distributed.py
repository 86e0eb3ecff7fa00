"""torchrun + FSDP2 on CPU (gloo): two ranks train the smoke config and match one process on the
same seed; `pvpo train --nproc N` runs the same command under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pvpo.trainer.parallel.distributed import torchrun_command

REPO = Path(__file__).resolve().parents[1]


SMOKE = str(REPO / "configs" / "smoke.yaml")


# The smoke config, made to learn something in 2 steps: a short warm start so some answers are well
# formed (non-zero rewards and advantages), KL (a sharded reference) and entropy terms in the loss.
# One mini-batch per step: a rank's mini-batches are cut from its own rows, so with several
# mini-batches the two runs would update on differently composed mini-batches. Rollout batches of
# one group, so each group's sampling seed is the same in both runs (Trainer.rollout's offset).
OVERRIDES = [
    "algorithm.group_sampling.enabled=false",  # as measured, before smoke.yaml turned GT injection on
    "run.tensorboard=false",
    "rollout.batch_size=2",
    "optim.mini_batches=1",
    "model.warm_start_steps=150",
    "model.warm_start_lr=5e-3",
    "optim.entropy_coef=0.01",
    "optim.kl_coef=0.05",
    "rollout.temperature=0.7",
    "rollout.max_new_tokens=40",
    "rollout.max_response_tokens=240",
    "optim.max_tokens_per_micro_batch=512",
]


KEYS = ("reward/mean", "format_ok", "anchor/mean", "model_tokens", "loss/mini_batch", "grad_norm")


# Measured: rewards, anchors and token counts identical; loss and grad norm agree to ~1e-7
# (float32 reduction order across two ranks).
TOL = 1e-5


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _run(args: list[str], *, nproc: int | None) -> None:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc
        else [sys.executable]
    )
    proc = subprocess.run(
        [*launcher, "-m", "pvpo.cli", "train", *args], env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _run_and_kill_after_first_checkpoint(args: list[str], run: Path) -> None:
    """Start a 2-rank run and SIGKILL its whole process group as soon as `latest` names step 1."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "pvpo.cli",
        "train",
        *args,
    ]
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    latest = run / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    try:
        while not (latest.exists() and latest.read_text().strip() == "step_000001"):
            assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read()[-4000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # killed during step 2: its checkpoint never became `latest`
    assert latest.read_text().strip() == "step_000001"


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_and_resume_from_a_sharded_checkpoint(tmp_path):
    single, dist = tmp_path / "single", tmp_path / "dist"
    _run(["--config", SMOKE, "--run-dir", str(single), *OVERRIDES], nproc=None)
    # killed (SIGKILL, launcher and both ranks) once step 1's checkpoint is in place, then resumed on 2 ranks
    _run_and_kill_after_first_checkpoint(["--config", SMOKE, "--run-dir", str(dist), *OVERRIDES], dist)
    ckpt = dist / "checkpoints" / "step_000001"
    assert {p.name for p in ckpt.iterdir()} >= {"dcp", "policy", "rank_0", "rank_1", "trainer_state.pt"}
    _run(
        ["--run-dir", str(dist), "--resume", "run.steps=2", "--nproc", "2"], nproc=None
    )  # the `pvpo train --nproc` shortcut

    one, two = _rows(single), _rows(dist)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert any(r["reward/mean"] > 0 for r in one), "the warm start should give some non-zero rewards"
    for a, b in zip(one, two):
        for k in KEYS:
            assert b[k] == pytest.approx(a[k], rel=TOL, abs=TOL), (a["step"], k, a[k], b[k])

    # the sharded checkpoint's HF folder is the whole model: transformers loads it as is
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(dist / "checkpoints" / "step_000002" / "policy"))
    assert sum(p.numel() for p in model.parameters()) > 0


def test_nproc_shortcut_runs_the_same_command_under_torchrun():
    cmd = torchrun_command(2, ["train", "--config", "c.yaml", "--nproc", "2", "run.steps=3", "--nproc=2"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[5:] == ["-m", "pvpo.cli", "train", "--config", "c.yaml", "run.steps=3"]
