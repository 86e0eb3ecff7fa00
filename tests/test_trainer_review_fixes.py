"""Defects a review of the RL code found, each pinned by the behaviour that was wrong: env text
judged as the agent's, Dr.GRPO's moving divisor, entropy of the wrong distribution, top-p
log-probs that cannot match the trainer's, and (in test_trainer_group_sampling) the anchor a resume
sees."""

from __future__ import annotations

import pytest
import torch

from pvpo.envs.data import QAExample
from pvpo.envs.episode import Episode, EpisodeConfig
from pvpo.trainer.algorithms.losses import entropy_from_logits
from pvpo.trainer.algorithms.spec import get_spec
from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.model.update import loss_config

EX = QAExample(uid="q", question="Who is the mentor of Zaro?", golden_answers=("Kelmo",))


def _episode(max_turns: int = 4) -> Episode:
    cfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=max_turns)
    return Episode(EX, cfg, cfg.reward_fn())


def test_a_correct_answer_after_one_correction_scores_full_reward_not_the_env_text():
    ep = _episode()
    ep.begin_step("<think>I am not sure what to do.</think>")
    first = ep.finish_step()
    assert "<search>" in first.observation  # the correction names the tags the agent must use
    ep.begin_step("<think>The mentor of Zaro is Kelmo.</think><answer>Kelmo</answer>")
    last = ep.finish_step()
    assert last.terminated and last.reward == 1.0
    assert last.info["prediction"] == "Kelmo"
    assert "<search>" in last.info["response"] and "invalid" not in last.info["judged_response"]


def test_an_episode_without_an_answer_predicts_nothing_rather_than_the_correction_words():
    ep = _episode(max_turns=2)
    ep.begin_step("no tags at all")
    ep.finish_step()
    end = ep.end("still no tags")
    assert end.info["prediction"] is None and end.reward == 0.0


def test_dr_grpo_divides_by_the_response_budget_whatever_the_batch_longest_response():
    est = get_spec("dr_grpo")
    assert est.loss_agg == "seq-mean-token-sum-norm" and get_spec("grpo").loss_agg == "token-mean"
    cfg = load_config(None, ["algorithm.estimator=dr_grpo", "rollout.max_response_tokens=64"])
    lc = loss_config(cfg.optim, default_agg=est.loss_agg, norm_len=cfg.rollout.max_response_tokens)
    assert (lc.agg, lc.norm_len) == ("seq-mean-token-sum-norm", 64)
    lp = torch.full((2, 5), -1.0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0])
    short, _ = lc(lp, lp, adv, mask)
    wide, _ = lc(
        torch.nn.functional.pad(lp, (0, 7)),
        torch.nn.functional.pad(lp, (0, 7)),
        adv,
        torch.nn.functional.pad(mask, (0, 7)),
    )
    assert float(short) == pytest.approx(float(wide)) == pytest.approx(-(3 - 2) / 64 / 2)
    user = load_config(None, ["algorithm.estimator=dr_grpo", "optim.loss_agg=token-mean"])
    assert loss_config(user.optim, default_agg=est.loss_agg).agg == "token-mean"  # an explicit choice wins


def test_entropy_is_that_of_the_sampling_distribution_softmax_of_logits_over_temperature():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    for t in (0.5, 0.7, 1.0):
        want = torch.distributions.Categorical(logits=logits / t).entropy()
        assert torch.allclose(entropy_from_logits(logits, t), want, atol=1e-5)


def test_training_rollouts_refuse_top_p_below_one_while_evaluation_may_use_it():
    with pytest.raises(ConfigError, match=r"rollout.top_p.*run.eval_top_p"):
        load_config(None, ["rollout.top_p=0.95"])
    cfg = load_config(None, ["run.eval_temperature=0.6", "run.eval_top_p=0.95"])
    assert (cfg.run.eval_temperature, cfg.run.eval_top_p) == (0.6, 0.95)
