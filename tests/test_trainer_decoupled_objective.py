"""AReaL's decoupled PPO objective as the update computes it with rollouts ahead of the update
(`rollout.max_staleness > 0`): the clip against the proximal policy times the clamped behaviour
weight pi_prox / pi_behav, a GT row against its own pi_gt, checked against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from pvpo.trainer.algorithms.importance import truncated_fraction, truncated_importance_weights
from pvpo.trainer.algorithms.losses import policy_loss
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.update import importance_denominator, importance_for
from pvpo.trainer.rollout.trajectory import Trajectory, collate

# Three rows of two response positions: two sampled rows (the sampler's log-probs are pi_behav) and
# an injected GT row (its log-probs are pi_gt).
BEHAV = [[-1.0, -2.0], [-0.5, 0.0], [-0.3, -0.2]]  # row 1's second position is an env token
PROX = [[-1.2, -0.5], [-0.4, -9.0], [-0.9, -0.8]]  # the weights the update starts from
THETA = [[-1.0, -0.1], [-0.3, -7.0], [-0.1, -0.2]]  # the policy being updated
ADV = [1.0, -2.0, 0.5]


def _batch():
    rows = []
    for i, lp in enumerate(BEHAV):
        t = Trajectory(uid=f"q{i}", prompt_ids=[1, 2])
        if i == 1:
            t.append_model([5], lp[:1])
            t.append_env([6])
        else:
            t.append_model([5, 7], lp)
        t.is_gt = i == 2
        rows.append(t)
    return collate(rows, pad_id=0)


def _decoupled(mode: str):
    cfg = load_config(
        None,
        [
            "rollout.max_staleness=1",
            "rollout.importance_correction.cap=2.0",
            f"rollout.importance_correction.mode={mode}",
        ],
    )
    return importance_for(cfg.rollout)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_the_decoupled_loss_equals_a_hand_computation_with_a_gt_row_against_pi_gt(mode):
    batch = _batch()
    theta = torch.tensor(THETA, requires_grad=True)
    denominator, weights = importance_denominator(torch.tensor(PROX), batch, _decoupled(mode))
    loss, _ = policy_loss(
        theta,
        denominator,
        torch.tensor(ADV),
        batch.loss_mask,
        clip_low=0.2,
        clip_high=0.28,
        is_weights=weights,
    )
    e = math.exp
    # sampled row 0, A = 1: token 0, u = pi/pi_prox = e^0.2 (unclipped), w = pi_prox/pi_behav = e^-0.2;
    # token 1, u = e^0.4 > 1.28 (clipped), w = e^1.5 > cap 2: truncated to 2, or dropped (mask)
    r0 = -1.0 * e(0.2) * e(-0.2) + (-1.28 * 2.0 if mode == "truncate" else 0.0)
    # sampled row 1, A = -2: u = e^0.1, w = e^0.1; its env token counts nowhere
    r1 = 2.0 * e(0.1) * e(0.1)
    # GT row, A = 0.5: its denominator is pi_gt, weight 1: u = e^0.2, then u = 1
    r2 = -0.5 * e(0.2) - 0.5
    assert float(loss.detach()) == pytest.approx((r0 + r1 + r2) / 5, abs=1e-6)  # token-mean over 5 model tokens
    loss.backward()
    grad = theta.grad
    # d/d log pi of -A u w / N is -A u w / N where unclipped; 0 where the clip is active
    assert float(grad[0, 0]) == pytest.approx(-1.0 * e(0.2) * e(-0.2) / 5, abs=1e-6)
    assert float(grad[0, 1]) == 0.0
    assert float(grad[1, 0]) == pytest.approx(2.0 * e(0.1) * e(0.1) / 5, abs=1e-6)
    assert float(grad[1, 1]) == 0.0
    assert float(grad[2, 0]) == pytest.approx(-0.5 * e(0.2) / 5, abs=1e-6)


def test_rollouts_ahead_of_the_update_turn_the_correction_on_and_eta_0_leaves_it_as_configured():
    off = load_config(None, []).rollout
    assert not importance_for(off).enabled
    ahead = load_config(None, ["rollout.max_staleness=2", "rollout.importance_correction.enabled=false"]).rollout
    assert importance_for(ahead).enabled and importance_for(ahead).cap == ahead.importance_correction.cap


def test_the_clamp_truncates_or_drops_the_tokens_above_the_cap_and_its_share_counts_them():
    prox = torch.tensor([[0.0, -0.1, -1.0, 0.0]])
    behav = torch.tensor([[-3.0, -0.1, -0.5, 0.0]])  # ratios e^3 (~20), 1, e^-0.5, and an env token
    mask = torch.tensor([[1, 1, 1, 0]])
    truncated = truncated_importance_weights(prox, behav, mask, cap=2.0, mode="truncate")
    dropped = truncated_importance_weights(prox, behav, mask, cap=2.0, mode="mask")
    assert truncated[0].tolist() == pytest.approx([2.0, 1.0, math.exp(-0.5), 0.0])
    assert dropped[0].tolist() == pytest.approx([0.0, 1.0, math.exp(-0.5), 0.0])
    assert truncated_fraction(prox, behav, mask, cap=2.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="clamp mode"):
        truncated_importance_weights(prox, behav, mask, cap=2.0, mode="clip")
