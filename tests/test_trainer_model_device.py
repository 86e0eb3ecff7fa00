"""Placement and precision: bf16 autocast with float32 master weights, gradient checkpointing, the
auto device and the flash-attention fallback, and (on CUDA) bf16 training."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from trainer_support import gradients, random_trajectories, small_model, tok  # noqa: F401 (fixture)

from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.device import place_policy_model, placement, step_optimizer
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


def test_each_optimizer_step_inside_one_autocast_region_is_seen_by_the_next_forward(tok):
    where = placement("cpu", "bfloat16")
    model = place_policy_model(small_model(tok), where)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    with where.autocast():
        before = model(input_ids=ids).logits.detach().clone()
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        step_optimizer(opt)
        after = model(input_ids=ids).logits.detach()
    with where.autocast():  # a new region casts the weights afresh: what the new weights give
        expected = model(input_ids=ids).logits.detach()
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, expected)


def test_the_warm_start_trains_in_bf16_as_it_does_with_autocast_around_each_forward(tok, monkeypatch):
    import pvpo.trainer.model.warmstart as warmstart

    trajs = random_trajectories(4, len(tok), seed=2)
    where = placement("cpu", "bfloat16")
    losses = []
    for per_forward in (False, True):
        model = place_policy_model(small_model(tok), where)
        if per_forward:  # the region closes after each SFT forward/backward: no cast outlives a step
            real = warmstart.sft_backward

            def own_region(*args, real=real, **kwargs):
                with where.autocast():
                    return real(*args, **kwargs)

            monkeypatch.setattr(warmstart, "sft_backward", own_region)
        # as setup.warm_start runs it, one region around all the steps; else a region per forward
        with contextlib.nullcontext() if per_forward else where.autocast():
            losses.append(
                warmstart.warm_start(
                    model, trajs, tok.pad_token_id, steps=4, lr=1e-2, batch_size=4, seed=0, show_progress=False
                )
            )
    assert losses[0][-1] < losses[0][0]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


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


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_device_follows_cuda_and_flash_attention_needs_cuda_and_its_package(cuda: bool, monkeypatch):
    """Both branches on any machine: whether CUDA is there is what `torch.cuda.is_available` says
    (patched), and whether flash-attn is installed what `importlib.util.find_spec` says."""
    import importlib.util

    from pvpo.trainer.model.device import resolve_attn_implementation, resolve_device

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args, flash: bool = True):
        if name == "flash_attn":
            return object() if flash else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun: this process's GPU
    if not cuda:
        where = placement("auto", "bfloat16", "flash_attention_2")
        assert where.device.type == "cpu" and where.attn_implementation == "sdpa"  # installed, but no CUDA
        with pytest.raises(ValueError, match="CUDA is not available"):
            placement("cuda")
        return
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0) and resolve_device("cpu") == torch.device("cpu")
    gpu = torch.device("cuda", 1)
    assert resolve_attn_implementation("flash_attention_2", gpu) == "flash_attention_2"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: find_spec(name, *a, flash=False))
    assert resolve_attn_implementation("flash_attention_2", gpu) == "sdpa"  # CUDA, but no flash-attn
    assert resolve_attn_implementation("eager", gpu) == "eager"


def test_auto_dtype_is_bf16_only_where_the_cpu_computes_it_natively(monkeypatch):
    import pvpo.trainer.model.device as device

    cpu = torch.device("cpu")
    for avx512_bf16, amx, expected in ((True, False, "bfloat16"), (False, True, "bfloat16"), (False, False, "float32")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        assert device.resolve_dtype("auto", cpu) == expected
        assert placement("cpu", "auto").dtype == device.DTYPES[expected]
    assert device.resolve_dtype("float16", cpu) == "float16"  # a named dtype is kept as named
    with pytest.raises(ValueError, match="unknown dtype 'half'; choose one of"):
        device.resolve_dtype("half", cpu)


def test_a_run_with_auto_dtype_records_the_dtype_it_resolved_to(tmp_path, monkeypatch):
    from trainer_support import TINY as TINY_RUN
    from trainer_support import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    cfg = load_config(None, [*TINY_RUN, "run.steps=1", "model.dtype=auto", "model.device=cpu"])
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert load_config(tmp_path / "run" / "config.yaml", []).model.dtype == "float32"


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
