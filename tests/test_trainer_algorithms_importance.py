"""Truncated importance weights and the sampler/trainer log-prob mismatch metric (no vLLM)."""

from __future__ import annotations

import math

import pytest
import torch

from pvpo.trainer.algorithms.importance import (
    logprob_mismatch,
    truncated_fraction,
    truncated_importance_weights,
)
from pvpo.trainer.config.schema import ImportanceCorrectionConfig


def test_weights_are_exp_of_the_logprob_gap_on_model_tokens() -> None:
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.2, -1.5, -0.5]])
    mask = torch.tensor([[1, 1, 1]])
    w = truncated_importance_weights(train, sampler, mask, cap=10.0)
    expected = torch.exp(train - sampler)
    assert torch.allclose(w, expected)


def test_weights_are_truncated_at_the_cap() -> None:
    train = torch.tensor([[0.0, -0.1]])
    sampler = torch.tensor([[-3.0, -0.1]])  # ratio e^3 ~ 20 on the first token
    w = truncated_importance_weights(train, sampler, torch.ones(1, 2), cap=2.0)
    assert w[0, 0].item() == pytest.approx(2.0)
    assert w[0, 1].item() == pytest.approx(1.0)


def test_env_tokens_and_padding_get_zero_weight_even_with_nan_inputs() -> None:
    train = torch.tensor([[-1.0, float("-inf"), 0.0]])
    sampler = torch.tensor([[-1.0, float("-inf"), 0.0]])
    mask = torch.tensor([[1, 0, 0]])
    w = truncated_importance_weights(train, sampler, mask, cap=2.0)
    assert w.tolist() == [[1.0, 0.0, 0.0]]


def test_weights_carry_no_gradient() -> None:
    train = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w = truncated_importance_weights(train, torch.tensor([[-1.1, -2.2]]), torch.ones(1, 2))
    assert not w.requires_grad


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        truncated_importance_weights(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def test_mismatch_metric_counts_only_model_tokens() -> None:
    train = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, 0.0, 0.0]])
    sampler = torch.tensor([[-1.1, -1.7, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # the -5 vs 0 gap sits on an env token
    m = logprob_mismatch(train, sampler, mask)
    assert m["mismatch/tokens"] == 3
    assert m["mismatch/abs_max"] == pytest.approx(0.3, abs=1e-6)
    assert m["mismatch/abs_mean"] == pytest.approx((0.1 + 0.3 + 0.0) / 3, abs=1e-6)
    assert m["mismatch/ratio_mean"] == pytest.approx((math.exp(0.1) + math.exp(-0.3) + 1.0) / 3, abs=1e-6)


def test_mismatch_metric_of_an_empty_mask_is_neutral() -> None:
    m = logprob_mismatch(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert m["mismatch/tokens"] == 0 and m["mismatch/abs_max"] == 0.0


def test_truncated_fraction_counts_ratios_above_the_cap() -> None:
    train = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    sampler = torch.tensor([[-2.0, -0.1, 0.0, -5.0]])  # ratios e^2, e^0.1, 1, e^5
    assert truncated_fraction(train, sampler, torch.ones(1, 4), cap=2.0) == pytest.approx(0.5)


def test_config_rejects_a_non_positive_cap() -> None:
    with pytest.raises(ValueError):
        ImportanceCorrectionConfig(enabled=True, cap=0.0)
