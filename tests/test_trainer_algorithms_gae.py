"""PPO with a critic: GAE over model tokens with env spans skipped, the clipped value loss, the
critic learning a fixed batch, token-level advantages through the update."""

from __future__ import annotations

import pytest
import torch

from pvpo.trainer.algorithms.advantages import advantage_stats, broadcast_to_tokens
from pvpo.trainer.algorithms.critic import Critic, critic_update, value_loss
from pvpo.trainer.algorithms.gae import gae, masked_whiten, outcome_token_rewards
from pvpo.trainer.algorithms.spec import get_spec
from pvpo.trainer.config.policy import TinyModelConfig
from pvpo.trainer.model.policy import build_tiny_policy
from pvpo.trainer.rollout.trajectory import Trajectory, collate

MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])  # model, model, env, env, model
VALUES = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.8]])  # the env tokens' values are never read


def test_gae_hand_computed_five_tokens_with_an_env_span_in_the_middle():
    r = outcome_token_rewards(torch.tensor([1.0]), MASK)
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    adv, ret = gae(r, VALUES, MASK, gamma=0.9, lam=0.8)
    # t=4: delta = 1 - 0.8 = 0.2, A = 0.2; the env span carries V=0.8 and A=0.2 back to t=1
    # t=1: delta = 0.9*0.8 - 0.6 = 0.12, A = 0.12 + 0.72*0.2 = 0.264
    # t=0: delta = 0.9*0.6 - 0.5 = 0.04, A = 0.04 + 0.72*0.264 = 0.23008
    torch.testing.assert_close(adv, torch.tensor([[0.23008, 0.264, 0.0, 0.0, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.73008, 0.864, 0.0, 0.0, 1.0]]))
    adv1, _ = gae(r, VALUES, MASK, gamma=1.0, lam=1.0)  # lambda = 1: Monte-Carlo return minus V
    torch.testing.assert_close(adv1, torch.tensor([[0.5, 0.4, 0.0, 0.0, 0.2]]))


def test_clipped_value_loss_takes_the_larger_error():
    v, old, ret = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.5]])
    loss, st = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 0: unclipped err 0, clipped V = 0.2 -> err 0.64; token 1: both 0.25 -> 0.5*(0.64+0.25)/2
    assert loss.item() == pytest.approx(0.2225) and st["critic/vf_clipfrac"] == 0.5
    assert value_loss(v, old, ret, torch.ones(1, 2), clip=None)[0].item() == pytest.approx(0.0625)


def test_ppo_estimator_is_token_level_whitened_over_model_tokens():
    est = get_spec("ppo")
    assert est.level == "token" and not est.needs_anchors
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    values = torch.zeros(2, 4)
    adv = est(torch.tensor([1.0, 0.0]), ["a", "b"], values=values, mask=mask, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    w = est(torch.tensor([1.0, 0.0]), ["a", "b"], values=values, mask=mask, gamma=1.0, lam=1.0)
    vals = w[mask > 0]
    assert abs(float(vals.mean())) < 1e-6 and float(vals.std()) == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(w[mask == 0], torch.zeros(2))
    torch.testing.assert_close(masked_whiten(adv, mask), w, atol=1e-5, rtol=0)
    s = advantage_stats(w, ["a", "b"], mask=mask)  # over the 6 model tokens, not the padding
    assert s["adv/mean"] == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(broadcast_to_tokens(w, mask), w)
    with pytest.raises(ValueError, match="values="):
        est(torch.tensor([1.0]), ["a"])


def _fixed_batch():
    pol = build_tiny_policy(
        ["alpha beta gamma delta", "one two three"],
        TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=300
        ),
        tags=("think", "search", "information", "answer"),
        seed=0,
    )
    trajs = []
    for i, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        t = Trajectory(f"p{i}", [5 + i, 6, 7 + i])
        t.append_model([20 + i, 21 + 2 * i], [-1.0, -1.0])
        t.append_env([40, 41 + i])
        t.append_model([22 + 3 * i], [-1.0])
        t.reward = reward
        trajs.append(t)
    return pol, collate(trajs, pol.tokenizer.pad_token_id)


def test_critic_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    pol, batch = _fixed_batch()
    critic = Critic(pol.model)
    opt = torch.optim.AdamW(critic.parameters(), lr=3e-3)
    old = critic.values(batch)
    assert torch.equal(old, torch.zeros_like(old))  # zero head: V = 0 before training
    _, returns = gae(outcome_token_rewards(batch.rewards, batch.loss_mask), old, batch.loss_mask, gamma=1.0, lam=1.0)
    losses = []
    for step in range(40):
        v = critic.values(batch)
        losses.append(critic_update(critic, opt, batch, v, returns, clip=None, seed=step)["critic/vf_loss"])
    assert losses[0] == pytest.approx(0.25, abs=1e-6)  # half the squared error of V=0 against 0/1 returns
    assert losses[-1] < 0.1 * losses[0]
    # the policy's weights are not the critic's: training the critic leaves them alone
    assert not any(p is q for p in pol.model.parameters() for q in critic.parameters())
