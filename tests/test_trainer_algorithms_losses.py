"""Losses: aggregation modes, clipped surrogate (asymmetric, dual clip, IS weights), KL estimators,
log-probs and entropy of the sampling distribution (softmax of logits over the temperature)."""

from __future__ import annotations

import math

import pytest
import torch

from pvpo.trainer.algorithms.losses import (
    AGGREGATION_MODES,
    LossConfig,
    aggregate,
    check_aggregation,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_logprobs,
    total_loss,
)

LN = math.log


def rows(*r: list[float]) -> torch.Tensor:
    return torch.tensor(r, dtype=torch.float64)


VALUES = rows([1, 2, 3, 4], [10, 20, 30, 40], [7, 7, 7, 7])


MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_aggregation_modes_are_exposed():
    assert set(AGGREGATION_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}


@pytest.mark.parametrize(
    ("mode", "norm_len", "expected"),
    [
        # masked tokens 1,2,3 | 10 | (none): (1+2+3+10)/4 = 4
        ("token-mean", None, 4.0),
        # sequence means 2 and 10; the empty third sequence is skipped: (2+10)/2 = 6
        ("seq-mean-token-mean", None, 6.0),
        # sums 6, 10, 0 over norm 4 (default T): (1.5 + 2.5 + 0)/3 = 4/3
        ("seq-mean-token-sum-norm", None, 4 / 3),
        # same over norm_len 2: (3 + 5 + 0)/3 = 8/3
        ("seq-mean-token-sum-norm", 2, 8 / 3),
    ],
)
def test_aggregate_ragged_hand_case(mode: str, norm_len: int | None, expected: float):
    assert float(aggregate(VALUES, MASK, mode, norm_len=norm_len)) == pytest.approx(expected)


def test_aggregate_ignores_nan_at_masked_positions():
    v = VALUES.clone()
    v[0, 3] = float("nan")
    v[2, 0] = float("inf")
    for mode in AGGREGATION_MODES:
        assert torch.isfinite(aggregate(v, MASK, mode))


def test_unknown_aggregation_is_a_value_error():
    with pytest.raises(ValueError, match="token-mean"):
        check_aggregation("seq-sum")
    with pytest.raises(ValueError):
        aggregate(VALUES, MASK, "seq-sum")
    with pytest.raises(ValueError, match="aggregation"):
        LossConfig(agg="mean")


def _lp(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """logprobs (requires grad) and old logprobs (zeros) whose exp-difference is `ratios`."""
    lp = torch.tensor([[LN(x) for x in r] for r in ratios], dtype=torch.float64, requires_grad=True)
    return lp, torch.zeros_like(lp)


def test_policy_loss_hand_case_positive_advantage():
    # A = +1, eps 0.2: ratio 1.5 -> max(-1.5, -1.2) = -1.2 (clipped); ratio 0.5 -> max(-0.5, -0.8) = -0.5;
    # ratio 1.1 -> -1.1. token-mean: (-1.2 - 0.5 - 1.1)/3 = -0.933333; clip active on 1 token of 3
    lp, old = _lp([[1.5, 0.5, 1.1]])
    loss, st = policy_loss(lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 3))
    assert loss.item() == pytest.approx(-2.8 / 3)
    assert st["clip_frac"] == pytest.approx(1 / 3)
    assert st["ratio_mean"] == pytest.approx(3.1 / 3)
    assert st["ratio_max"] == pytest.approx(1.5)
    # approx_kl = mean(old - lp) = -(ln1.5 + ln0.5 + ln1.1)/3
    assert st["approx_kl"] == pytest.approx(-(LN(1.5) + LN(0.5) + LN(1.1)) / 3)


def test_policy_loss_hand_case_negative_advantage():
    # A = -2: ratio 1.5 -> max(3.0, 2.4) = 3.0; ratio 0.5 -> max(1.0, 1.6) = 1.6 (clipped); mean 2.3
    lp, old = _lp([[1.5, 0.5]])
    loss, st = policy_loss(lp, old, torch.tensor([-2.0], dtype=torch.float64), torch.ones(1, 2))
    assert loss.item() == pytest.approx(2.3)
    assert st["clip_frac"] == pytest.approx(0.5)


def test_positive_advantage_above_clip_high_gets_zero_gradient():
    # token 0: ratio 1.5 > 1.2, A > 0 -> clipped, gradient 0;
    # token 1: ratio 1.1 inside -> d(-A*ratio)/dlp / 2 tokens = -1.1/2
    lp, old = _lp([[1.5, 1.1]])
    loss, _ = policy_loss(lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2))
    loss.backward()
    assert lp.grad[0, 0] == 0.0
    assert float(lp.grad[0, 1]) == pytest.approx(-0.55)


def test_asymmetric_clip_uses_clip_high_for_the_upper_bound():
    # ratio 1.25, A = +1: clipped under clip_high 0.2 (grad 0), free under clip_high 0.28 (grad -1.25)
    for clip_high, grad in [(0.2, 0.0), (0.28, -1.25)]:
        lp, old = _lp([[1.25]])
        loss, _ = policy_loss(lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), clip_high=clip_high)
        loss.backward()
        assert float(lp.grad[0, 0]) == pytest.approx(grad)
    # clip_low 0.1: ratio 0.85 with A = -1 is clipped at 0.9 -> loss 0.9, grad 0
    lp, old = _lp([[0.85]])
    loss, _ = policy_loss(lp, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), clip_low=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(0.9)
    assert lp.grad[0, 0] == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, ratio 5: plain PPO loss max(5, 1.2) = 5; dual clip 3 caps it at 3 * |A| = 3 with zero gradient.
    # ratio 2 stays 2 (below the cap); mean over the 2 tokens: (3 + 2)/2 = 2.5 vs (5 + 2)/2 = 3.5
    adv = torch.tensor([-1.0], dtype=torch.float64)
    lp, old = _lp([[5.0, 2.0]])
    plain, _ = policy_loss(lp, old, adv, torch.ones(1, 2))
    assert plain.item() == pytest.approx(3.5)
    capped, st = policy_loss(lp, old, adv, torch.ones(1, 2), dual_clip=3.0)
    assert capped.item() == pytest.approx(2.5)
    assert st["dual_clip_frac"] == pytest.approx(0.5)
    capped.backward()
    assert lp.grad[0, 0] == 0.0
    assert float(lp.grad[0, 1]) == pytest.approx(
        1.0
    )  # token loss = -A * ratio = ratio; d/dlp = ratio = 2, over 2 tokens -> 1


def test_dual_clip_leaves_positive_advantages_alone_and_must_exceed_one():
    lp, old = _lp([[5.0, 0.5]])
    adv = torch.tensor([2.0], dtype=torch.float64)
    a, _ = policy_loss(lp, old, adv, torch.ones(1, 2))
    b, _ = policy_loss(lp, old, adv, torch.ones(1, 2), dual_clip=3.0)
    assert a.item() == b.item()
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(lp, old, adv, torch.ones(1, 2), dual_clip=1.0)


def test_importance_weights_multiply_the_token_loss():
    # A = 1, ratios 1.0 and 1.1 -> token losses -1.0, -1.1; weights 2 and 0.5 -> (-2.0 - 0.55)/2 = -1.275
    lp, old = _lp([[1.0, 1.1]])
    w = rows([2.0, 0.5])
    loss, _ = policy_loss(lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2), is_weights=w)
    assert loss.item() == pytest.approx(-1.275)


def test_per_token_advantages_are_accepted():
    lp, old = _lp([[1.0, 1.0]])
    loss, _ = policy_loss(lp, old, rows([1.0, -3.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((-1.0 + 3.0) / 2)


@pytest.mark.parametrize("agg", AGGREGATION_MODES)
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_env_tokens_get_exactly_zero_gradient(agg: str, kind: str):
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 6, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = lp.detach() + 0.05 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    ref = lp.detach() + 0.3 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0], [1, 0, 1, 0, 1, 1]])
    # env positions carry garbage old/ref log-probs (the engine reports none there)
    old = torch.where(mask > 0, old, torch.full_like(old, 50.0))
    ref = torch.where(mask > 0, ref, torch.full_like(ref, -1e4))
    adv = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)
    pg, _ = policy_loss(lp, old, adv, mask, agg=agg)
    loss = pg + 0.1 * aggregate(kl_penalty(lp, ref, kind), mask, agg)
    loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.all(lp.grad[mask == 1] != 0)
    assert torch.isfinite(lp.grad).all()


def test_kl_estimators_hand_case():
    # lp = ln 0.5, ref = ln 0.25, lp - ref = ln 2 = 0.693147
    # k1 = 0.693147; k2 = 0.5 * 0.693147^2 = 0.240227; k3 = exp(-ln2) + ln2 - 1 = 0.5 + 0.693147 - 1 = 0.193147
    lp, ref = rows([LN(0.5)]), rows([LN(0.25)])
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(0.693147, abs=1e-6)
    assert float(kl_penalty(lp, ref, "k2")) == pytest.approx(0.240227, abs=1e-6)
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.193147, abs=1e-6)


def test_k3_is_clamped_and_non_negative():
    # ref - lp = 30 would give exp(30) ~ 1e13; clamped to 10
    out = kl_penalty(rows([-30.0, 0.0, -1.0]), rows([0.0, 0.0, -1.5]), "k3")
    assert float(out[0, 0]) == 10.0
    assert float(out[0, 1]) == 0.0
    assert (out >= 0).all()


def test_unknown_kl_kind_is_a_value_error():
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(rows([0.0]), rows([0.0]), "k4")


def test_token_logprobs_hand_case_with_temperature():
    # logits [0, ln 3]: p(1) = 3/4. At temperature 2: [0, ln3/2] -> p(1) = sqrt3 / (1 + sqrt3) = 0.633975
    logits = torch.tensor([[[0.0, LN(3)]]])
    ids = torch.tensor([[1]])
    assert float(token_logprobs(logits, ids)) == pytest.approx(LN(0.75), abs=1e-6)
    assert float(token_logprobs(logits, ids, temperature=2.0)) == pytest.approx(LN(0.633975), abs=1e-6)


def test_token_logprobs_chunked_matches_log_softmax_and_upcasts_bf16():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 7, 11, generator=g)
    ids = torch.randint(0, 11, (2, 7), generator=g)
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, ids, 0.7, chunk_size=3), ref)
    out = token_logprobs(logits.bfloat16(), ids, chunk_size=2)
    assert out.dtype == torch.float32


def test_token_logprobs_gradients_flow_to_logits():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    token_logprobs(logits, torch.tensor([[0, 1, 2, 3]]), chunk_size=3).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_entropy_hand_cases_and_chunking():
    # uniform over 4 -> ln 4; [0, ln 3] -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    assert float(entropy_from_logits(torch.zeros(1, 1, 4))) == pytest.approx(LN(4), abs=1e-6)
    assert float(entropy_from_logits(torch.tensor([[[0.0, LN(3)]]]))) == pytest.approx(0.562335, abs=1e-6)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 9, 13, generator=g) * 4
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=4), expected)


def test_total_loss_combines_terms_with_the_same_aggregation():
    g = torch.Generator().manual_seed(5)
    lp = -torch.rand(2, 5, generator=g, dtype=torch.float64)
    old = lp + 0.1 * torch.randn(2, 5, generator=g, dtype=torch.float64)
    ref = lp + 0.2 * torch.randn(2, 5, generator=g, dtype=torch.float64)
    ent = torch.rand(2, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    adv = torch.tensor([0.5, -1.0], dtype=torch.float64)
    cfg = LossConfig(agg="seq-mean-token-mean", kl_coef=0.1, kl_kind="k3", entropy_coef=0.01)
    loss, st = cfg(lp, old, adv, mask, ref_logprobs=ref, entropy=ent)
    pg, _ = policy_loss(lp, old, adv, mask, agg="seq-mean-token-mean")
    kl = aggregate(kl_penalty(lp, ref, "k3"), mask, "seq-mean-token-mean")
    h = aggregate(ent, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(float(pg + 0.1 * kl - 0.01 * h))
    assert {"loss", "pg_loss", "kl", "entropy", "clip_frac"} <= set(st)
    assert st["kl"] == pytest.approx(float(kl))
    assert st["entropy"] == pytest.approx(float(h))


def test_total_loss_requires_ref_logprobs_when_kl_is_on():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        total_loss(lp, lp, torch.ones(1), torch.ones(1, 2), LossConfig(kl_coef=0.1))


def test_loss_config_rejects_bad_settings_at_construction():
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="KL"):
        LossConfig(kl_kind="k9")


def test_entropy_is_that_of_the_sampling_distribution_softmax_of_logits_over_temperature():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    for t in (0.5, 0.7, 1.0):
        want = torch.distributions.Categorical(logits=logits / t).entropy()
        assert torch.allclose(entropy_from_logits(logits, t), want, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_unchunked_values_and_gradients(monkeypatch, temperature):
    """The default chunking (CHUNK_ELEMENTS shrunk so a small vocabulary still takes 5 chunks) and
    its checkpointed backward give the full log-softmax's values and gradients."""
    from pvpo.trainer.algorithms import losses

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 2 * 3 * 17)  # batch 2 x vocab 17: 3 positions a chunk
    g = torch.Generator().manual_seed(7)
    base = torch.randn(2, 13, 17, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(0, 17, (2, 13), generator=g)
    w = torch.randn(2, 13, generator=g, dtype=torch.float64)
    assert len(losses._chunks(base.shape, None)) == 5

    def full(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(x / temperature, -1)
        return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)

    a = base.clone().requires_grad_(True)
    b = base.clone().requires_grad_(True)
    lp_ref, ent_ref = full(a)
    ((lp_ref * w).sum() + (ent_ref * w).sum()).backward()
    lp = token_logprobs(b, ids, temperature)
    ent = entropy_from_logits(b, temperature)
    ((lp.double() * w).sum() + (ent.double() * w).sum()).backward()
    torch.testing.assert_close(lp.double(), lp_ref.float().double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ent_ref.float().double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantity", ["log-probs", "entropy"])
def test_a_mask_computes_only_masked_positions_with_the_same_floats_and_gradients(quantity: str):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 9, 13, generator=g)
    ids = torch.randint(0, 13, (2, 9), generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 1, 1, 1, 0, 0]])

    def compute(x: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        if quantity == "log-probs":
            return token_logprobs(x, ids, 0.7, chunk_size=4, mask=m)
        return entropy_from_logits(x, 0.7, chunk_size=4, mask=m)

    full_in = logits.clone().requires_grad_(True)
    part_in = logits.clone().requires_grad_(True)
    full, part = compute(full_in), compute(part_in, mask)
    assert torch.equal(part[mask > 0], full[mask > 0])
    assert torch.equal(part[mask == 0], torch.zeros(int((mask == 0).sum())))
    (full * mask).sum().backward()
    (part * mask).sum().backward()
    assert full_in.grad is not None and part_in.grad is not None
    assert torch.equal(part_in.grad, full_in.grad)
    assert float(part_in.grad[mask == 0].abs().sum()) == 0.0


def test_token_logprobs_with_an_empty_mask_is_zero_and_still_differentiable():
    logits = torch.randn(1, 3, 5, requires_grad=True)
    out = token_logprobs(logits, torch.tensor([[0, 1, 2]]), mask=torch.zeros(1, 3))
    assert torch.equal(out.detach(), torch.zeros(1, 3))
    out.sum().backward()  # a zero-weight micro-batch's backward (FSDP's padded plans) must run
    assert logits.grad is not None


def test_entropy_with_an_empty_mask_is_zero_and_a_mask_of_another_shape_is_refused():
    logits = torch.randn(2, 9, 13, requires_grad=True)
    empty = entropy_from_logits(logits, mask=torch.zeros(2, 9))
    assert torch.equal(empty.detach(), torch.zeros(2, 9))
    empty.sum().backward()  # a zero-weight micro-batch's backward must run
    assert logits.grad is not None
    with pytest.raises(ValueError, match="mask"):
        entropy_from_logits(logits, mask=torch.ones(2, 8))


def test_token_logprobs_rejects_a_mask_of_another_shape():
    with pytest.raises(ValueError, match="mask"):
        token_logprobs(torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), mask=torch.ones(1, 4))
