"""Token-budget micro-batches: every row once within the budget, the accumulated gradient equals the
whole batch's, trimmed micro-batches give the same log-probs."""

from __future__ import annotations

import random

import pytest
import torch

from pvpo.trainer.config.schema import TinyModelConfig, load_config
from pvpo.trainer.model.micro_batch import accumulate, micro_batches, plan_micro_batches, row_lengths, trim_columns
from pvpo.trainer.model.policy import build_tiny_model, train_tokenizer
from pvpo.trainer.model.update import batch_logprobs, loss_config, micro_batch_loss
from pvpo.trainer.rollout.trajectory import Trajectory, collate

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=300)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], vocab_size=300)


def _model(tok):
    return build_tiny_model(tok, TINY, seed=1)


def _trajs(n: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories of very different lengths, env tokens between model turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = Trajectory(uid=f"q{i // 2}", prompt_ids=[rng.randrange(1, vocab) for _ in range(rng.randint(3, 12))])
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(2, 30)
            t.append_model([rng.randrange(1, vocab) for _ in range(k)], [-rng.random() * 3 for _ in range(k)])
            t.append_env([rng.randrange(1, vocab) for _ in range(rng.randint(0, 9))])
        t.reward = rng.random()
        out.append(t)
    return out


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


# ---- micro-batching ----------------------------------------------------------------------------
def test_plan_keeps_every_row_once_within_the_token_budget():
    pl, rl = [5, 40, 3, 12, 7, 90], [30, 10, 2, 50, 8, 5]
    plan = plan_micro_batches(range(6), pl, rl, max_tokens=100)
    assert sorted(i for m in plan for i in m) == list(range(6))
    for m in plan:
        assert len(m) == 1 or len(m) * (max(pl[i] for i in m) + max(rl[i] for i in m)) <= 100
    # a forced minimum count splits the largest micro-batches, then pads with empty ones
    assert len(plan_micro_batches(range(2), pl, rl, max_tokens=10_000, min_count=4)) == 4
    assert plan_micro_batches([0, 1], pl, rl, parts=2, min_count=3)[-1] == []


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_micro_batches_accumulate_the_gradient_of_the_whole_batch(tok, agg):
    model = _model(tok)
    batch = collate(_trajs(8, len(tok)), tok.pad_token_id)
    cfg = load_config(None, [f"optim.loss_agg={agg}", "optim.kl_coef=0.05", "optim.entropy_coef=0.01"])
    loss_cfg = loss_config(cfg.optim, norm_len=batch.loss_mask.shape[-1])
    adv = torch.linspace(-1, 1, len(batch))
    ref_lp = batch.old_logprobs - 0.1

    def loss_fn(mb):
        ix, r = mb.rows, mb.r
        loss, stats, _ = micro_batch_loss(
            model, mb.batch, adv[ix], loss_cfg, temperature=1.0, ref_logprobs=ref_lp[ix, :r]
        )
        return loss, stats

    whole, _, _ = micro_batch_loss(model, batch, adv, loss_cfg, temperature=1.0, ref_logprobs=ref_lp)
    whole.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    micros = micro_batches(batch, list(range(len(batch))), agg=agg, max_tokens=96)
    assert len(micros) >= 3 and all(mb.batch.input_ids.numel() <= 96 or len(mb.rows) == 1 for mb in micros)
    loss, _ = accumulate(micros, loss_fn)
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    for g, e in zip(_grads(model), expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_trimmed_micro_batches_give_the_same_logprobs(tok):
    model = _model(tok).eval()
    batch = collate(_trajs(6, len(tok), seed=3), tok.pad_token_id)
    full = batch_logprobs(model, batch, 0.7, micro=len(batch))
    small = batch_logprobs(model, batch, 0.7, max_tokens=64)
    m = batch.attention_mask[:, batch.prompt_len :] > 0
    torch.testing.assert_close(small[m], full[m], rtol=1e-4, atol=1e-5)
    sub, r = trim_columns(batch.select([2]))
    pl, rl = row_lengths(batch)
    assert sub.input_ids.shape[1] == pl[2] + rl[2] and r == rl[2]
