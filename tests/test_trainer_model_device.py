"""Placement and precision: bf16 autocast with float32 master weights, gradient checkpointing, the
auto device and the flash-attention fallback, and (on CUDA) bf16 training."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_support import gradients, random_trajectories, small_model, tok  # noqa: F401 (fixture)

from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.device import place_policy_model, placement
from pvpo.trainer.model.update import batch_logprobs, loss_config, micro_batch_loss
from pvpo.trainer.rollout.trajectory import collate


# ---- precision and activation checkpointing ----------------------------------------------------
def test_bf16_autocast_computes_in_bf16_and_keeps_float32_master_weights(tok):
    where = placement("cpu", "bfloat16")
    model = place_policy_model(small_model(tok), where)
    batch = collate(random_trajectories(4, len(tok)), tok.pad_token_id)
    with torch.no_grad():
        fp32 = batch_logprobs(model, batch, 1.0)
        with where.autocast():
            bf16 = batch_logprobs(model, batch, 1.0)
            logits = model(input_ids=batch.input_ids[:, :4]).logits
    assert logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    m = batch.loss_mask > 0
    gap = (bf16 - fp32)[m].abs().max()
    assert 0 < float(gap) < 0.1  # bf16 rounding shows, but stays small on log-probs of ~-6


def test_gradient_checkpointing_gives_the_same_gradients(tok):
    batch = collate(random_trajectories(4, len(tok), seed=5), tok.pad_token_id)
    cfg = load_config(None, [])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    grads = []
    for ckpt in (False, True):
        model = place_policy_model(small_model(tok), placement("cpu", "float32", gradient_checkpointing=ckpt)).train()
        flag = (
            "is_activation_checkpointing"
            if hasattr(type(model), "is_activation_checkpointing")
            else "is_gradient_checkpointing"
        )
        assert getattr(model, flag) == ckpt
        loss, _, _ = micro_batch_loss(model, batch, adv, loss_config(cfg.optim), temperature=1.0)
        loss.backward()
        grads.append(gradients(model))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_one_training_step_in_bf16_with_checkpointing_and_token_micro_batches(tmp_path):
    from trainer_support import TINY as TINY_RUN
    from trainer_support import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "run.steps=1",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "optim.max_tokens_per_micro_batch=256",
            "optim.kl_coef=0.05",
            "model.device=cpu",
        ],
    )
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    row = result.metrics[-1]
    assert row["step"] == 1 and torch.isfinite(torch.tensor(row["loss/mini_batch"])) and row["grad_norm"] > 0


def test_auto_device_is_cpu_without_cuda_and_flash_attention_falls_back_to_sdpa():
    where = placement("auto", "bfloat16", "flash_attention_2")
    if not torch.cuda.is_available():
        assert where.device.type == "cpu" and where.attn_implementation == "sdpa"
        with pytest.raises(ValueError, match="CUDA is not available"):
            placement("cuda")


# ---- GPU ---------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_tiny_qwen2_trains_in_bf16_on_cuda_with_the_hf_engine(tmp_path):
    from trainer_support import TINY as TINY_RUN
    from trainer_support import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "run.steps=2",
            "model.device=cuda",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "optim.max_tokens_per_micro_batch=512",
        ],
    )
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    rows = result.metrics
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["mem/train_peak_gib"] > 0 and r["mem/rollout_peak_gib"] > 0 for r in rows)


@pytest.mark.gpu
@gpu
def test_bf16_update_on_cuda_matches_float32_within_bf16_rounding(tok):
    where = placement("cuda", "bfloat16")
    model = place_policy_model(small_model(tok), where)
    ref = copy.deepcopy(model)
    batch = collate(random_trajectories(4, len(tok)), tok.pad_token_id).to(where.device)
    with torch.no_grad():
        fp32 = batch_logprobs(ref, batch, 1.0)
        with where.autocast():
            bf16 = batch_logprobs(model, batch, 1.0)
    m = batch.loss_mask > 0
    assert float((bf16 - fp32)[m].abs().max()) < 0.1
