"""torchrun + FSDP2 on CPU (gloo): two ranks train the smoke config (PVPO with Group Sampling and
oracle GT) and match one process on the same seed, share the partition and GT set one process
builds, and a run killed after its first checkpoint resumes onto the unbroken run's step 2;
`pvpo train --nproc N` runs the same command under torchrun."""

from __future__ import annotations

import json

import pytest
from parallel_support import (
    OVERRIDES,
    SMOKE,
    assert_same_steps,
    finish,
    rows,
    run,
    run_and_kill_after_first_checkpoint,
    start,
)

from pvpo.trainer.parallel.distributed import torchrun_command


def _decisions(run_dir) -> dict:
    """group_sampling.json without its timings (rank 0's, not one process's)."""
    doc = json.loads((run_dir / "group_sampling.json").read_text())
    doc["report"] = {k: v for k, v in doc["report"].items() if not k.endswith("_s") and "_s_" not in k}
    return doc


@pytest.mark.slow
def test_two_gloo_ranks_with_group_sampling_match_one_process_and_resume_onto_the_unbroken_run(tmp_path):
    single, dist, broken = tmp_path / "single", tmp_path / "dist", tmp_path / "broken"
    one = start(["--config", SMOKE, "--run-dir", str(single), *OVERRIDES], nproc=None, log=tmp_path / "single.log")
    run(["--config", SMOKE, "--run-dir", str(dist), *OVERRIDES], nproc=2, log=tmp_path / "dist.log")
    finish(one)
    # killed (SIGKILL, launcher and both ranks) once step 1's checkpoint is in place, then resumed on 2 ranks
    args = ["--config", SMOKE, "--run-dir", str(broken), *OVERRIDES]
    run_and_kill_after_first_checkpoint(args, broken, tmp_path / "broken.log")
    ckpt = broken / "checkpoints" / "step_000001"
    assert {p.name for p in ckpt.iterdir()} >= {"dcp", "policy", "rank_0", "rank_1", "trainer_state.pt", "run_state"}
    assert {p.name for p in (ckpt / "run_state").iterdir()} >= {"anchor.json", "group_sampling.json", "gt_cache.json"}
    resume = ["--run-dir", str(broken), "--resume", "run.steps=2", "--nproc", "2"]  # `pvpo train --nproc`
    run(resume, nproc=None, log=tmp_path / "resumed.log")

    singles, dists = rows(single), rows(dist)
    assert any(r["reward/mean"] > 0 for r in singles), "the warm start should give some non-zero rewards"
    assert all(r["gt/fraction"] > 0 for r in singles), "GT trajectories should be injected at every step"
    assert_same_steps(singles, dists)
    # the resumed run ends where the unbroken one did, every logged figure but timings and memory
    assert_same_steps(dists, rows(broken), keys=None)

    # one partition and one GT set, written once (by rank 0), equal to one process's
    assert _decisions(dist) == _decisions(single) == _decisions(broken)
    assert (dist / "gt_cache.json").read_bytes() == (single / "gt_cache.json").read_bytes()
    assert json.loads((dist / "gt_cache.json").read_text())["records"], "the oracle should give some GT trajectories"
    assert (dist / "anchor.json").read_bytes() == (single / "anchor.json").read_bytes()
    assert not list(dist.glob(".*.tmp")), "no atomic write left behind"

    # the sharded checkpoint's HF folder is the whole model: transformers loads it as is
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(broken / "checkpoints" / "step_000002" / "policy"))
    assert sum(p.numel() for p in model.parameters()) > 0


def test_nproc_shortcut_runs_the_same_command_under_torchrun():
    cmd = torchrun_command(2, ["train", "--config", "c.yaml", "--nproc", "2", "run.steps=3", "--nproc=2"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[5:] == ["-m", "pvpo.cli", "train", "--config", "c.yaml", "run.steps=3"]


def test_a_rank_leaves_the_group_after_a_barrier_only_when_it_completed(monkeypatch):
    from pvpo.trainer.parallel import distributed as ddp

    calls: list[str] = []
    monkeypatch.setattr(ddp, "is_distributed", lambda: True)
    monkeypatch.setattr(ddp.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(ddp.dist, "destroy_process_group", lambda: calls.append("destroy"))
    ddp.shutdown(completed=True)
    assert calls == ["barrier", "destroy"]
    calls.clear()
    ddp.shutdown(completed=False)  # after a failure the others must not wait for this rank
    assert calls == ["destroy"]


def test_train_leaves_the_group_as_completed_only_when_the_run_returned(monkeypatch, tmp_path):
    from pvpo.trainer import loop
    from pvpo.trainer.config.schema import load_config

    left: list[bool] = []
    monkeypatch.setattr(loop.ddp, "shutdown", lambda *, completed=False: left.append(completed))

    def broken(*_a, **_k):
        raise RuntimeError("the data would not load")

    monkeypatch.setattr(loop, "load_data", broken)
    with pytest.raises(RuntimeError, match="would not load"):
        loop.train(load_config(SMOKE, ["run.tensorboard=false"]), tmp_path / "run")
    assert left == [False]
