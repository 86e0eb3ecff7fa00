"""Token-budget micro-batches: every row once within the budget, the accumulated gradient equals the
whole batch's, trimmed micro-batches give the same log-probs."""

from __future__ import annotations

import pytest
import torch
from trainer_support import gradients, random_trajectories, small_model, tok  # noqa: F401 (fixture)

from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.micro_batch import accumulate, micro_batches, plan_micro_batches, row_lengths, trim_columns
from pvpo.trainer.model.update import batch_logprobs, loss_config, micro_batch_loss
from pvpo.trainer.rollout.trajectory import collate


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
    model = small_model(tok)
    batch = collate(random_trajectories(8, len(tok)), tok.pad_token_id)
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
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    micros = micro_batches(batch, list(range(len(batch))), agg=agg, max_tokens=96)
    assert len(micros) >= 3 and all(mb.batch.input_ids.numel() <= 96 or len(mb.rows) == 1 for mb in micros)
    loss, _ = accumulate(micros, loss_fn)
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    for g, e in zip(gradients(model), expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_trimmed_micro_batches_give_the_same_logprobs(tok):
    model = small_model(tok).eval()
    batch = collate(random_trajectories(6, len(tok), seed=3), tok.pad_token_id)
    full = batch_logprobs(model, batch, 0.7, micro=len(batch))
    small = batch_logprobs(model, batch, 0.7, max_tokens=64)
    m = batch.attention_mask[:, batch.prompt_len :] > 0
    torch.testing.assert_close(small[m], full[m], rtol=1e-4, atol=1e-5)
    sub, r = trim_columns(batch.select([2]))
    pl, rl = row_lengths(batch)
    assert sub.input_ids.shape[1] == pl[2] + rl[2] and r == rl[2]


def test_the_warm_starts_sft_in_token_budgeted_micro_batches_has_the_whole_batchs_loss_and_gradient(tok):
    from pvpo.trainer.model.warmstart import sft_backward, sft_loss

    model = small_model(tok)
    trajs = random_trajectories(8, len(tok), seed=3)
    whole = sft_loss(model, collate(trajs, tok.pad_token_id))
    whole.backward()
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    loss = sft_backward(model, trajs, tok.pad_token_id, max_tokens=96)  # several micro-batches of <= 96 padded tokens
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5)
    for g, e in zip(gradients(model), expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("correction", [False, True])
def test_one_epoch_of_one_mini_batch_takes_the_old_logprobs_from_the_loss_pass_with_the_same_update(tok, correction):
    """On-policy (1 epoch, 1 mini-batch): no separate no-grad pass for the trainer's pre-update
    log-probs, and the same weights, loss and mismatch statistics as with that pass."""
    import copy

    from pvpo.trainer.config.schema import ImportanceCorrectionConfig
    from pvpo.trainer.model.update import policy_update

    base = small_model(tok)
    trajs = random_trajectories(8, len(tok), seed=5)
    trajs[0].is_gt = True
    batch = collate(trajs, tok.pad_token_id)
    cfg = load_config(None, ["optim.max_tokens_per_micro_batch=96", "optim.mini_batches=1", "optim.epochs=1"])
    adv = torch.linspace(-1, 1, len(batch))
    imp = ImportanceCorrectionConfig(enabled=correction, cap=2.0)
    results, models, forwards = [], [], []
    for separate in (True, False):
        model = copy.deepcopy(base)
        calls = [0]

        def count(*_, calls=calls):
            calls[0] += 1

        model.register_forward_pre_hook(count)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = policy_update(
            model, opt, batch, adv, cfg.optim, temperature=1.0, seed=0, importance=imp, separate_old_pass=separate
        )
        results.append(out)
        models.append(model)
        forwards.append(calls[0])
    n_micro = len(micro_batches(batch, list(range(len(batch))), agg="token-mean", max_tokens=96))
    assert forwards[1] == n_micro < forwards[0]  # the fused update makes only the loss pass's forwards
    for k in ("loss/mini_batch", "mismatch/abs_mean", "mismatch/abs_max", "mismatch/tokens", "grad_norm"):
        assert results[1][k] == pytest.approx(results[0][k], rel=1e-4, abs=1e-6), k
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_rows_with_zero_advantage_are_skipped_and_the_update_is_the_same(tok):
    """Without a KL or entropy term a row whose advantage is 0 adds nothing to the gradient: the
    update skips its forward and backward and still counts its tokens in the token mean."""
    import copy

    from pvpo.trainer.model.update import inert_rows, policy_update

    base = small_model(tok)
    batch = collate(random_trajectories(8, len(tok), seed=7), tok.pad_token_id)
    cfg = load_config(None, ["optim.max_tokens_per_micro_batch=96"])
    zero = torch.tensor([0.0, 0.5, 0.0, -1.0, 0.0, 1.0, 0.0, 0.3])
    tiny = torch.where(zero == 0, torch.full_like(zero, 1e-30), zero)  # not skipped, same gradient
    assert inert_rows(zero, batch.loss_mask) == {0, 2, 4, 6} and inert_rows(tiny, batch.loss_mask) == set()
    results, models, forwards = [], [], []
    for adv in (zero, tiny):
        model = copy.deepcopy(base)
        calls = [0]
        model.register_forward_pre_hook(lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        results.append(policy_update(model, opt, batch, adv, cfg.optim, temperature=1.0, seed=0))
        models.append(model)
        forwards.append(calls[0])
    assert forwards[0] < forwards[1]
    assert results[0]["update/skipped_rows_frac"] == 0.5 and results[1]["update/skipped_rows_frac"] == 0.0
    for k in ("loss/mini_batch", "grad_norm"):
        assert results[0][k] == pytest.approx(results[1][k], rel=1e-4, abs=1e-7), k
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # token-level advantages (PPO's GAE): a row is inert when every model token's advantage is 0
    per_token = torch.zeros_like(batch.loss_mask)
    model_tok = int(batch.loss_mask[1].nonzero()[0])
    env_tok = int((batch.loss_mask[2] == 0).nonzero()[0])
    per_token[1, model_tok] = 0.2
    per_token[2, env_tok] = 0.7  # on an env token: masked out of the loss, the row stays inert
    assert inert_rows(per_token, batch.loss_mask) == set(range(8)) - {1}


def test_the_update_and_the_warm_start_skip_env_positions_softmax_with_bitwise_the_same_weights(tok, monkeypatch):
    """The loss pass and the SFT compute log-probs only at model tokens (`token_logprobs(mask=)`):
    the weights after an update (temperature 0.8, a GT row, micro-batches of <= 96 tokens) and the
    SFT gradients are bitwise those of computing every response position, as before."""
    import copy

    import pvpo.trainer.algorithms.losses as losses
    import pvpo.trainer.model.update as update
    import pvpo.trainer.model.warmstart as warmstart
    from pvpo.trainer.algorithms.losses import token_logprobs

    def every_position(logits, ids, temperature=1.0, *, chunk_size=None, mask=None):
        return token_logprobs(logits, ids, temperature, chunk_size=chunk_size)

    base = small_model(tok)
    trajs = random_trajectories(8, len(tok), seed=11)
    trajs[1].is_gt = True
    batch = collate(trajs, tok.pad_token_id)
    assert 0 < int(batch.loss_mask.sum()) < int(batch.attention_mask[:, batch.prompt_len :].sum())  # env tokens
    cfg = load_config(None, ["optim.max_tokens_per_micro_batch=96"])
    adv = torch.linspace(-1, 1, len(batch))
    weights, grads, values = [], [], []
    for fn in (every_position, token_logprobs):
        monkeypatch.setattr(update, "token_logprobs", fn)
        monkeypatch.setattr(losses, "token_logprobs", fn)  # the SFT loss imports it when called
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = update.policy_update(model, opt, batch, adv, cfg.optim, temperature=0.8, seed=0)
        weights.append([p.detach().clone() for p in model.parameters()])
        values.append(out["loss/mini_batch"])
        sft = copy.deepcopy(base)
        values.append(warmstart.sft_backward(sft, trajs, tok.pad_token_id, max_tokens=96))
        grads.append(gradients(sft))
    assert values[0] == values[2] and values[1] == values[3]
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_the_entropy_bonus_at_model_tokens_only_leaves_bitwise_the_same_weights(tok, monkeypatch):
    """With an entropy bonus (optim.entropy_coef) the loss pass computes the entropy only at model
    tokens (`entropy_from_logits(mask=)`): the weights after an update and its loss are bitwise
    those of computing the entropy at every response position, as before."""
    import copy

    import pvpo.trainer.model.update as update
    from pvpo.trainer.algorithms.losses import entropy_from_logits

    def every_position(logits, temperature=1.0, *, chunk_size=None, mask=None):
        return entropy_from_logits(logits, temperature, chunk_size=chunk_size)

    base = small_model(tok)
    trajs = random_trajectories(8, len(tok), seed=12)
    batch = collate(trajs, tok.pad_token_id)
    assert 0 < int(batch.loss_mask.sum()) < int(batch.attention_mask[:, batch.prompt_len :].sum())  # env tokens
    cfg = load_config(None, ["optim.max_tokens_per_micro_batch=96", "optim.entropy_coef=0.01"])
    adv = torch.linspace(-1, 1, len(batch))
    weights, losses = [], []
    for fn in (every_position, entropy_from_logits):
        monkeypatch.setattr(update, "entropy_from_logits", fn)
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = update.policy_update(model, opt, batch, adv, cfg.optim, temperature=0.8, seed=0)
        weights.append([p.detach().clone() for p in model.parameters()])
        losses.append(out["loss/mini_batch"])
    assert losses[0] == losses[1]
    assert not all(torch.equal(a, b) for a, b in zip(weights[0], base.parameters()))  # it trained
    assert all(torch.equal(a, b) for a, b in zip(*weights))
