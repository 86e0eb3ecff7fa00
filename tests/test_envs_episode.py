"""Episode rules: the reward and the prediction judge the agent's own text, never the env's
correction messages."""

from __future__ import annotations

from pvpo.envs.data import QAExample
from pvpo.envs.episode import Episode, EpisodeConfig

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


def test_an_untrimmed_search_result_stops_at_the_cap() -> None:
    from pvpo.envs.episode import OBS_CHARS_CAP
    from pvpo.retriever.types import Passage

    cfg = EpisodeConfig(max_obs_chars=None)
    ep = Episode(EX, cfg, cfg.reward_fn())
    ep.begin_step("<search> Zaro </search>")
    result = ep.finish_step([Passage("1", '"Zaro"\n' + "word " * 1_000_000)])  # a 5 MB passage
    assert OBS_CHARS_CAP < len(result.observation) < OBS_CHARS_CAP + 100
