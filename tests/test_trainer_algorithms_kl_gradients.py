"""What each KL estimator's gradient is, as a loss on sampled tokens (Schulman 2020's k1, k2, k3 in
`losses.kl_penalty`), against the analytic gradients on a two-action policy: k1's is zero in
expectation, k2's is the reverse KL(pi || pi_ref)'s, k3's (verl's low_var_kl) the forward
KL(pi_ref || pi)'s; and the config refuses k1 as a penalty."""

from __future__ import annotations

import pytest
import torch

from pvpo.trainer.algorithms.losses import kl_penalty
from pvpo.trainer.config.schema import ConfigError, load_config

THETA = [0.3, -0.5]  # the policy's logits over two actions
REF = [-0.2, 0.4]  # the reference's


def _expected_gradient(kind: str) -> torch.Tensor:
    """d/dtheta of E_{a ~ pi}[k(a)] with the expectation's weights held (the loss on sampled tokens
    differentiates through log pi(a) only): sum_a pi(a) grad k(a), exactly over both actions."""
    theta = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(theta, 0)
    ref = torch.log_softmax(torch.tensor(REF, dtype=torch.float64), 0)
    per = kl_penalty(lp.view(1, 2), ref.view(1, 2), kind).view(2)
    (lp.exp().detach() * per).sum().backward()
    assert theta.grad is not None
    return theta.grad


def _analytic(direction: str) -> torch.Tensor:
    theta = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(theta, 0)
    ref = torch.log_softmax(torch.tensor(REF, dtype=torch.float64), 0)
    kl = (lp.exp() * (lp - ref)).sum() if direction == "reverse" else (ref.exp() * (ref - lp)).sum()
    kl.backward()
    assert theta.grad is not None
    return theta.grad


def test_k1s_expected_gradient_is_zero() -> None:
    torch.testing.assert_close(_expected_gradient("k1"), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)


def test_k2s_expected_gradient_is_the_reverse_kls() -> None:
    torch.testing.assert_close(_expected_gradient("k2"), _analytic("reverse"), atol=1e-12, rtol=0)


def test_k3s_expected_gradient_is_the_forward_kls_not_the_reverse_kls() -> None:
    k3, forward, reverse = _expected_gradient("k3"), _analytic("forward"), _analytic("reverse")
    torch.testing.assert_close(k3, forward, atol=1e-12, rtol=0)
    # on this example: forward +-0.3356, reverse +-0.2995; same sign, another size
    assert float((forward - reverse).abs().max()) > 0.01


def test_k1_as_the_configs_kl_estimator_is_refused_naming_k2_and_k3() -> None:
    with pytest.raises(ConfigError, match=r"optim\.kl_estimator=k1 has a zero expected gradient.*k2.*k3"):
        load_config(None, ["optim.kl_estimator=k1", "optim.kl_coef=0.001"])
    assert load_config(None, ["optim.kl_estimator=k2"]).optim.kl_estimator == "k2"
