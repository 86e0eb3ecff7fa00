"""The trainer and `pvpo eval` build their episode rules and loop limits in one place
(`pvpo.trainer.rollout.agent_settings.AgentSettings`): a run's config and the equivalent evaluation
settings give equal `EpisodeConfig` and `LoopConfig`."""

from __future__ import annotations

import dataclasses

import pytest

from pvpo.evaluation.run import EvalSettings
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.data import agent_settings


def test_a_runs_config_reaches_every_episode_and_loop_field() -> None:
    cfg = load_config(
        None,
        [
            "rollout.max_turns=3",
            "retriever.topk=2",
            "env.max_obs_chars=700",
            "env.max_question_chars=900",
            "rollout.temperature=0.7",
            "rollout.max_new_tokens=33",
            "rollout.max_response_tokens=444",
            "rollout.max_concurrency=5",
            "rollout.search_timeout_s=2.5",
            "algorithm.reward=em",
        ],
    )
    a = agent_settings(cfg)
    ep, loop = a.episode(), a.loop()
    assert (ep.max_turns, ep.topk, ep.max_obs_chars, ep.max_question_chars, ep.reward) == (3, 2, 700, 900, "em")
    assert (loop.temperature, loop.top_p, loop.max_new_tokens, loop.max_response_tokens) == (0.7, 1.0, 33, 444)
    assert (loop.max_concurrency, loop.search_timeout_s) == (5, 2.5)
    assert agent_settings(cfg, temperature=0.0).loop().temperature == 0.0


@pytest.mark.parametrize("chat", [True, False])
def test_pvpo_evals_settings_and_a_runs_config_give_the_same_episode_and_loop(chat: bool) -> None:
    cfg = load_config(
        None,
        [
            "env.protocol=search_r1",
            "env.prompt_template=search_r1",
            "algorithm.reward=em",
            "rollout.max_turns=4",
            "retriever.topk=3",
            "env.max_obs_chars=1000",
            "rollout.max_new_tokens=64",
            "rollout.max_response_tokens=512",
            "rollout.max_concurrency=8",
            f"model.chat_template={str(chat).lower()}",
        ],
    )
    run = agent_settings(cfg, temperature=0.6)
    ev = EvalSettings(
        temperature=0.6,
        max_turns=4,
        topk=3,
        max_obs_chars=1000,
        max_new_tokens=64,
        max_response_tokens=512,
        batch_size=8,
        chat_template=chat,
        max_completion_tokens=None,  # eval's own bounds of a degenerate answer; a run's config has none
        repetition_stop=0,
    )
    assert ev.episode() == run.episode()
    assert ev.loop(None) == run.loop()
    assert dataclasses.replace(ev.agent(None), top_k=5).loop().top_k == 5  # eval's top-k reaches the loop
