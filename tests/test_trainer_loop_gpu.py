"""On CUDA (skipped without it): the trainer with a colocated vLLM engine in bf16, on a tiny Qwen2 and
on a model of Qwen2.5-3B's shape built from its config with random weights (no download). The 3B
run prints its peak GPU memory per phase and training tokens/s (run with `-s` to see them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (make test-vllm)"),
]

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
GPU_OVERRIDES = [
    "model.device=cuda",
    "model.dtype=bfloat16",
    "model.gradient_checkpointing=true",
    "rollout.engine=vllm",
    "rollout.vllm.gpu_memory_utilization=0.3",
    "rollout.vllm.sleep_level=2",
    "run.tensorboard=false",
    "optim.max_tokens_per_micro_batch=4096",
    "optim.kl_coef=0.001",
]


def _train(tmp_path: Path, overrides: list[str], steps: int):
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train

    cfg = load_config(SMOKE, [*GPU_OVERRIDES, *overrides, f"run.steps={steps}"])
    return train(cfg, tmp_path / "run", show_progress=False)


def test_tiny_qwen2_trains_in_bf16_with_colocated_vllm(tmp_path):
    # vLLM's attention needs head_dim >= 32
    result = _train(tmp_path, ["model.tiny.hidden_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"], 2)
    rows = result.metrics
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["mem/rollout_device_used_gib"] > 0 and r["mem/train_peak_gib"] > 0
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "policy" / "config.json").exists()


def test_qwen2_5_3b_shaped_model_runs_one_pvpo_step_with_vllm_colocated(tmp_path):
    sys.path.insert(0, str(REPO))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.training.train_step import SHAPES
    from pvpo.envs.synthetic import SyntheticWorld
    from pvpo.trainer.model.policy import train_tokenizer

    world = SyntheticWorld.generate(0, 16, n_relations=2, max_hops=2, questions_per_hop=8)
    tok = train_tokenizer(
        [p.contents for p in world.passages],
        vocab_size=512,
        extra_tokens=[f"<{t}>" for t in ("think", "search", "information", "answer")]
        + [f"</{t}>" for t in ("think", "search", "information", "answer")],
    )
    folder = tmp_path / "qwen2.5-3b-shaped"
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(
            Qwen2Config(**SHAPES["qwen2.5-3b"], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        )
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    result = _train(
        tmp_path, [f"model.path={folder}", "rollout.n=5", "data.prompts_per_step=8", "rollout.max_new_tokens=64"], 1
    )
    row = result.metrics[-1]
    mem = {k: round(v, 2) for k, v in row.items() if k.startswith("mem/")}
    tokens_per_s = row["model_tokens"] * 8 * 5 / row["time/train_s"]
    print(
        f"\n3B-shaped PVPO step: {mem}, trained model tokens/s {tokens_per_s:.0f}, rollout {row['time/rollout_s']:.1f} s"
    )
    assert mem["mem/train_peak_gib"] > 5  # float32 master weights of 3.1B parameters alone are 11.5 GiB
