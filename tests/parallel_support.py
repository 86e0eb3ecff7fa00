"""Shared by the torchrun tests: the smoke config made to learn something in 2 steps, `pvpo train`
in one process and under `torchrun --nproc_per_node 2` (gloo on CPU), a 2-rank run killed once its
first checkpoint is in place, the per-step comparison of two runs' metrics, and checks run on
spawned gloo ranks of one group (`on_gloo_ranks`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")

# The smoke config (Group Sampling with oracle GT on), made to learn something in 2 steps: a short
# warm start so some answers are well formed (non-zero rewards and advantages), KL (a sharded
# reference) and entropy terms in the loss. One mini-batch per step: a rank's mini-batches are cut
# from its own rows, so with several mini-batches the two runs would update on differently composed
# mini-batches. Rollout batches of 2 trajectories (one group; a GT prompt's group is 1 rollout + 1
# GT): each trajectory's seed is the one process's whatever the split (`Trainer.rollout`), and
# batches of one group also pad alike in both runs.
OVERRIDES = [
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

# What must agree per step between one process and two ranks: rewards, the anchor, the GT rows, the
# token counts, the loss over the whole mini-batch and the gradient norm (the other logged means are
# per rank, averaged over ranks).
KEYS = (
    "reward/mean",
    "format_ok",
    "anchor/mean",
    "gt/fraction",
    "model_tokens",
    "cost/policy_tokens",
    "cost/cum_rollouts",
    "cost/cum_gt_rollouts",
    "loss/mini_batch",
    "grad_norm",
)

# Measured: rewards, anchors, GT rows and token counts identical; the loss within 1e-7 and the grad
# norm within 1.3e-6 absolute (PPO's step 1, norm 0.66): float32 sums in another order over two ranks.
TOL = 1e-5


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def command(args: Sequence[str], *, nproc: int | None) -> list[str]:
    """`pvpo train ARGS` in one process, or under torchrun with `nproc` ranks."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc
        else [sys.executable]
    )
    return [*launcher, "-m", "pvpo.cli", "train", *args]


# seconds a run may take: the 2-core CI box takes about a minute; a busy machine several times that
TIMEOUT = 1800


@dataclass
class Started:
    """A `pvpo train` started by `start`: its process (group leader) and the file its stderr goes
    to (a file, not a pipe: nobody reads a pipe while another run goes on, and a full one blocks)."""

    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


def start(args: Sequence[str], *, nproc: int | None, log: Path) -> Started:
    """Start `pvpo train ARGS` (see `command`) in its own process group, stderr to `log`; `finish`
    waits for it."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            command(args, nproc=nproc), env=env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    return Started(proc, log)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (torchrun starts each rank in a session of its
    own, so a kill of the launcher's process group misses the ranks)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a started run: the launcher's process group and every rank under it, then reap it."""
    below = descendants(proc.pid)  # before the launcher dies and its ranks are re-parented
    for pid in [proc.pid, *below]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()


def finish(run: Started, timeout: float = TIMEOUT) -> None:
    try:
        run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(run.proc)
        raise
    assert run.proc.returncode == 0, run.tail()


def run(args: Sequence[str], *, nproc: int | None, log: Path) -> None:
    finish(start(args, nproc=nproc, log=log))


def run_and_kill_after_first_checkpoint(args: Sequence[str], run_dir: Path, log: Path) -> None:
    """Start a 2-rank run and SIGKILL it, ranks included, as soon as `latest` names step 1."""
    started = start(args, nproc=2, log=log)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + TIMEOUT
    try:
        while not (latest.exists() and latest.read_text().strip() == "step_000001"):
            assert started.proc.poll() is None, f"the run ended before its first checkpoint: {started.tail()}"
            assert time.monotonic() < deadline, f"no checkpoint within {TIMEOUT} s"
            time.sleep(0.1)
    finally:
        kill_tree(started.proc)
    # killed during step 2: its checkpoint never became `latest`
    assert latest.read_text().strip() == "step_000001"


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def assert_same_steps(one: list[dict], two: list[dict], keys: Sequence[str] | None = KEYS, tol: float = TOL) -> None:
    """Both runs logged steps 1 and 2 and agree on `keys` at each (relative and absolute `tol`);
    `keys=None`: on every logged figure but timings and memory, the same ones in both."""
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two, strict=True):
        figures = [k for k in a if not k.startswith(("time/", "mem/"))]
        if keys is None:
            assert sorted(figures) == sorted(k for k in b if not k.startswith(("time/", "mem/"))), a["step"]
        for k in figures if keys is None else keys:
            assert k in a and k in b, (a["step"], k)
            assert b[k] == pytest.approx(a[k], rel=tol, abs=tol), (a["step"], k, a[k], b[k])


def _gloo_rank(rank: int, world: int, init_file: str, out_dir: str, checks: Callable[[int, str], dict]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    completed = False
    try:
        results = checks(rank, out_dir)
        completed = True
    finally:
        if completed:  # no rank leaves while another still talks to it (see ddp.shutdown)
            dist.barrier()
        dist.destroy_process_group()
    Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(results))


def on_gloo_ranks(checks: Callable[[int, str], dict], world: int = 2) -> list[dict]:
    """`checks(rank, scratch_dir)` (a module-level function) on `world` spawned ranks of one gloo
    group sharing a scratch directory; what each rank returned (JSON), in rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_gloo_rank, args=(world, str(Path(tmp) / "init"), tmp, checks), nprocs=world, join=True)
        return [json.loads((Path(tmp) / f"rank_{r}.json").read_text()) for r in range(world)]


def tiny_qwen2(seed: int = 0) -> Any:
    """A 2-layer Qwen2 causal LM of vocabulary 64, seeded (a policy whose trunk a critic copies)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2}
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, num_attention_heads=2, num_key_value_heads=1, **shape))
