"""The GDPO, PPO and V0.5 estimators inside the training loop on the tiny config: GDPO fed the reward's
components, PPO's critic warm-up then token-level advantages, V0.5's extra rollouts counted."""

from __future__ import annotations

import math

import torch
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.schema import load_config
from pvpo.trainer.loop import train


def _train(tmp_path, *overrides: str):
    cfg = load_config(None, TINY + ["data.max_eval_examples=1", "run.checkpoint_every=0", *overrides])
    return train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)


def test_gdpo_trains_on_the_pvpo_rewards_format_and_r_acc_components(tmp_path):
    m = _train(tmp_path, "algorithm.estimator=gdpo", "algorithm.gdpo.weights={r_acc: 2.0}", "run.steps=1").metrics[0]
    assert math.isfinite(m["loss"]) and "adv/std" in m
    assert abs(m["adv/mean"]) < 1e-5  # the batch step centres the advantages


def test_ppo_warms_up_its_critic_then_updates_the_policy_with_token_advantages(tmp_path):
    res = _train(
        tmp_path,
        "algorithm.estimator=ppo",
        "algorithm.ppo.critic.warmup_steps=1",
        "algorithm.ppo.critic.lr=0.01",
        "run.steps=2",
        "run.checkpoint_every=2",
    )
    m1, m2 = res.metrics
    assert "loss" not in m1 and math.isfinite(m1["critic/vf_loss"])  # warm-up: only the critic trained
    assert math.isfinite(m2["loss"]) and math.isfinite(m2["critic/vf_loss"])
    assert m1["critic/value_mean"] == 0.0  # the zero value head; its learning is test_trainer_gae's
    state = torch.load(next((res.run_dir / "checkpoints").glob("*/trainer_state.pt")), weights_only=True)
    assert "critic" in state["extra"] and "critic_optimizer" in state["extra"]


def test_v05_extra_rollouts_go_through_the_trainer_and_are_counted(tmp_path, monkeypatch):
    from pvpo.trainer.loop import Trainer

    real = Trainer.rollout

    def scored(self, examples, **kw):  # a random tiny policy scores 0 everywhere: give the train rollouts 1, 1, 0, ...
        out = real(self, examples, **kw)
        if kw.get("kind", "train") == "train":
            for i, t in enumerate(out):
                t.reward = 0.0 if i % 3 == 2 else 1.0
        return out

    monkeypatch.setattr(Trainer, "rollout", scored)
    m = _train(
        tmp_path, "algorithm.estimator=v05", "rollout.n=3", "algorithm.prior_fusion.k_max=6", "run.steps=1"
    ).metrics[0]
    # anchor 0 (real rewards) vs rewards 1, 1, 0: the prior is rejected and rollouts are added
    assert m["v05/extra_rollouts"] > 0 and m["v05/prior_rejected_frac"] == 1.0
    sampled = 2 * 3 + m["v05/extra_rollouts"]  # 2 prompts x k_init=3, plus the budget's extra ones
    assert m["cost/rollouts"] == m["cost/cum_anchor_rollouts"] + sampled
    assert 3 < m["v05/k_mean"] <= 6 and 0.0 < m["v05/w_mean"] <= 1.0


def test_v05_value_learns_its_prior_from_the_prompts_it_has_seen(tmp_path):
    import json

    res = _train(tmp_path, "algorithm.estimator=v05_value", "algorithm.prior_fusion.adaptive=false", "run.steps=2")
    m1, m2 = res.metrics
    assert m1["v05/w_mean"] == 1.0  # step 1: an empty value model, the group mean alone
    # step 2: MiniLM kNN over step 1's prompts predicts their mean reward (0 for a random policy),
    # which the rollouts (all 0) cannot reject: the prior is trusted
    assert m2["v05/w_mean"] == 0.0 and m2["v05/prior_rejected_frac"] == 0.0
    entries = json.loads((res.run_dir / "value_model.json").read_text())["entries"]
    assert len(entries) == 4 and all(len(vec) == 384 for vec, _ in entries.values())
    assert "anchor/mean" not in m1 and m1["cost/cum_anchor_rollouts"] == 0  # no reference rollouts
