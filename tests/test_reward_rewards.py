"""Rewards: hand-worked values and hypothesis properties (total, bounded, format-gated)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvpo.reward import RESEARCH, SEARCH_R1, available_rewards, exact_match, f1_score, get_reward

OK = "<think>t</think><search>q</search><information>d</information><answer>{a}</answer>"


def test_registry_lists_the_documented_rewards() -> None:
    assert {"pvpo", "em", "search_r1_format", "research_f1"} <= set(available_rewards())
    with pytest.raises(KeyError, match="known"):
        get_reward("nope")


def test_pvpo_reward_uses_cem_for_short_and_f1_for_long_answers() -> None:
    pvpo = get_reward("pvpo")
    assert pvpo(OK.format(a="Paris"), ["Paris"]).total == 1.0
    # 2 tokens < 3x1: CEM -> gold covered -> 1.0
    assert pvpo(OK.format(a="in Paris"), ["Paris"]).total == 1.0
    # 3 tokens >= 3x1: F1 = 2*(1/3)*1/(1/3+1) = 0.5
    assert pvpo(OK.format(a="Paris or Lyon"), ["Paris"]).total == pytest.approx(0.5)
    # wrong answer, good format: floor
    assert pvpo(OK.format(a="Rome"), ["Paris"]).total == pytest.approx(0.1)
    # bad format: 0 whatever the answer
    assert pvpo("<answer>Paris</answer> extra", ["Paris"]).total == 0.0
    r = pvpo(OK.format(a="Paris or Lyon"), ["Paris"])
    assert r.components == {"format": 1.0, "r_acc": pytest.approx(0.5)} and r.prediction == "Paris or Lyon"


def test_pvpo_length_ratio_is_configurable() -> None:
    assert get_reward("pvpo", length_ratio=4)(OK.format(a="Paris or Lyon"), ["Paris"]).total == 1.0


def test_search_r1_format_table() -> None:
    r = get_reward("search_r1_format")
    assert r(OK.format(a="Paris"), ["paris"]).total == 1.0
    assert r("<answer>Paris</answer> junk", ["paris"]).total == pytest.approx(0.8)
    assert r(OK.format(a="Rome"), ["paris"]).total == pytest.approx(0.2)
    assert r("<answer>Rome</answer> junk", ["paris"]).total == pytest.approx(0.1)
    assert r("no answer at all", ["paris"]).total == 0.0


def test_em_and_research_f1() -> None:
    assert get_reward("em")(OK.format(a="the Paris"), ["Paris"]).total == 1.0
    good = "<search>q</search><result>d</result><answer>\\boxed{Paris Lyon}</answer>"
    assert get_reward("research_f1")(good, ["Paris"], RESEARCH).total == pytest.approx(
        f1_score("Paris Lyon", ["Paris"])
    )
    assert get_reward("research_f1")(good.replace("Paris Lyon", "Rome"), ["Paris"], RESEARCH).total == pytest.approx(
        0.1
    )
    assert get_reward("research_f1")("<answer>Paris</answer>", ["Paris"], RESEARCH).total == 0.0


def test_rewards_are_total_on_non_text_inputs() -> None:
    for name in available_rewards():
        fn = get_reward(name)
        for response, golds in [(None, ["a"]), (3, ["a"]), ("<answer>a</answer>", None), ("<answer>a</answer>", 7)]:
            result = fn(response, golds)
            assert 0.0 <= result.total <= 1.0


PIECES = list("ab <>/\\{}") + [
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
    "\\boxed{",
    "yes",
    "no",
    "the",
    " Paris ",
]
TAGGY = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)
TEXT = st.one_of(st.text(max_size=80), TAGGY)


@settings(max_examples=300, deadline=None)
@given(
    response=TEXT,
    golds=st.lists(st.text(max_size=20), max_size=4),
    name=st.sampled_from(["pvpo", "em", "search_r1_format", "research_f1"]),
)
def test_rewards_never_raise_and_stay_in_unit_interval(response: str, golds: list[str], name: str) -> None:
    for proto in (SEARCH_R1, RESEARCH):
        result = get_reward(name)(response, golds, proto)
        assert 0.0 <= result.total <= 1.0


@settings(max_examples=300, deadline=None)
@given(response=TEXT, golds=st.lists(st.text(max_size=20), min_size=1, max_size=4))
def test_pvpo_gives_zero_whenever_the_format_is_wrong(response: str, golds: list[str]) -> None:
    result = get_reward("pvpo")(response, golds)
    if not SEARCH_R1.check_format(response).ok:
        assert result.total == 0.0
    else:
        assert result.total >= 0.1


@settings(max_examples=300, deadline=None)
@given(a=st.text(max_size=30), b=st.text(max_size=30))
def test_em_and_f1_are_symmetric_for_single_golds(a: str, b: str) -> None:
    assert exact_match(a, [b]) == exact_match(b, [a])
    assert f1_score(a, [b]) == pytest.approx(f1_score(b, [a]))
