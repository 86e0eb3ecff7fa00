"""PPO's critic and V0.5's learned value under torchrun (2 gloo ranks on CPU, FSDP2), LoRA
adapters among them: each matches one process on the same global batch for 2 steps (Group Sampling
with GT on, as in the smoke config, for V0.5; PPO takes no GT rows), and the critic and the adapters come back from a sharded (DCP)
checkpoint after a kill."""

from __future__ import annotations

import json

import pytest
import torch
from parallel_support import (
    KEYS,
    OVERRIDES,
    SMOKE,
    assert_same_steps,
    finish,
    rows,
    run,
    run_and_kill_after_first_checkpoint,
    start,
)


def _one_and_two_killed_then_resumed(tmp_path, extra: list[str]) -> tuple[list[dict], list[dict]]:
    """Metrics of one process and of 2 ranks killed after step 1's checkpoint, then resumed."""
    single, dist = tmp_path / "single", tmp_path / "dist"
    one = start(["--config", SMOKE, "--run-dir", str(single), *OVERRIDES, *extra], nproc=None, log=tmp_path / "1.log")
    args = ["--config", SMOKE, "--run-dir", str(dist), *OVERRIDES, *extra]
    run_and_kill_after_first_checkpoint(args, dist, tmp_path / "2.log")
    finish(one)
    run(["--run-dir", str(dist), "--resume", "run.steps=2"], nproc=2, log=tmp_path / "resumed.log")
    return rows(single), rows(dist)


@pytest.mark.slow
def test_ppo_critic_under_two_ranks_matches_one_process_and_resumes_from_dcp(tmp_path):
    # PPO takes no GT rows (refused at config load): the smoke config's Group Sampling off
    one, two = _one_and_two_killed_then_resumed(
        tmp_path, ["algorithm.estimator=ppo", "algorithm.group_sampling.enabled=false"]
    )
    critic = ("critic/vf_loss", "critic/grad_norm", "critic/explained_var", "critic/value_mean")
    assert_same_steps(one, two, keys=(*critic, *(k for k in KEYS if not k.startswith(("anchor/", "gt/")))))
    assert one[0]["critic/grad_norm"] > 0 and one[1]["critic/value_mean"] != 0.0, "the critic should learn"
    dcp = tmp_path / "dist" / "checkpoints" / "step_000001" / "dcp" / ".metadata"
    assert dcp.exists()


@pytest.mark.slow
def test_v05_value_with_lora_under_two_ranks_matches_one_process_and_resumes(tmp_path):
    lora = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]
    one, two = _one_and_two_killed_then_resumed(tmp_path, ["algorithm.estimator=v05_value", *lora])
    assert_same_steps(one, two, keys=("v05/extra_rollouts", "v05/rounds", *KEYS))
    assert one[0]["v05/extra_rollouts"] > 0, "the adaptive budget should add rollouts"
    # one value model, written by rank 0, equal to one process's
    a, b = (json.loads((tmp_path / r / "value_model.json").read_text())["entries"] for r in ("single", "dist"))
    assert list(a) == list(b) and all(a[u][1] == pytest.approx(b[u][1], abs=1e-6) for u in a)
    # the adapters trained on 2 ranks, merged into the HF folder, are one process's
    from transformers import AutoModelForCausalLM

    ckpts = [tmp_path / r / "checkpoints" / "step_000002" for r in ("single", "dist")]
    assert (ckpts[1] / "adapter" / "adapter_config.json").exists()
    w1, w2 = (AutoModelForCausalLM.from_pretrained(str(c / "policy")).state_dict() for c in ckpts)
    assert sorted(w1) == sorted(w2) and all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)
