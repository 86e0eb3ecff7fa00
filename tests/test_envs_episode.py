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


def test_a_policy_query_longer_than_the_retriever_takes_is_searched_cut_counted_and_warned(caplog) -> None:
    """A 3,239-character model-written query ended a whole `pvpo eval` (the server's 422) and made
    the gym env's step() raise: the query is the model's output, so it is cut, never fatal."""
    import logging

    from pvpo.retriever.types import MAX_QUERY_CHARS

    ep = _episode()
    long = ("what is the name of the river " * 108)[:3239]
    with caplog.at_level(logging.WARNING, logger="pvpo.envs.episode"):
        query = ep.begin_step(f"<search> {long} </search>")
    assert query is not None and len(query) <= MAX_QUERY_CHARS and long.startswith(query.removesuffix("..."))
    step = ep.finish_step([])
    assert step.info["num_queries_cut"] == 1 and step.info["queries"] == [query]
    assert any("3239 characters was cut to 2048" in r.getMessage() for r in caplog.records)
    assert ep.begin_step("<search> short </search>") == "short"


def test_reward_parameters_the_reward_does_not_take_are_refused_by_the_episode_rules() -> None:
    import pytest

    with pytest.raises(ValueError, match="takes no parameter 'foramt_score'"):
        EpisodeConfig(reward="pvpo", reward_params={"foramt_score": 0.1})
    assert EpisodeConfig(reward="pvpo", reward_params={"floor": 0.2}).reward_fn()("x", ["y"]).total == 0.0


def test_a_question_given_as_a_mapping_without_a_uid_gets_one_from_its_text() -> None:
    import pytest

    a = QAExample.coerce({"question": "who?", "golden_answers": ["a"]})
    assert a.uid.startswith("given/") and a.uid == QAExample.coerce({"question": "who?", "answers": "a"}).uid
    with pytest.raises(ValueError, match="needs a non-empty 'question'.*golden_answers"):
        QAExample.coerce({"golden_answers": ["a"]})
