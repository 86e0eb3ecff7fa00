"""Prompt templates: `search_r1` is Search-R1's training prompt, word for word."""

from __future__ import annotations

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.templates import get_template, render_prompt
from pvpo.reward import RESEARCH, SEARCH_R1

# ---- templates and config ----------------------------------------------------------------------
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: who wrote hamlet?\n"
)


def test_search_r1_template_is_search_r1s_training_prompt():
    assert render_prompt("search_r1", SEARCH_R1, "  who wrote hamlet ") == SEARCH_R1_PROMPT
    assert render_prompt("search_r1", SEARCH_R1, "who wrote hamlet?") == SEARCH_R1_PROMPT
    ep = EpisodeConfig(protocol="search_r1", prompt_template="search_r1")
    assert (
        ep.prompt(QAExample(uid="a", question="who wrote hamlet", golden_answers=["Shakespeare"])) == SEARCH_R1_PROMPT
    )
    # tags follow the protocol in use; the default template and plain format strings still work
    assert "<result> and </result>" in render_prompt("search_r1", RESEARCH, "q")
    assert render_prompt("default", SEARCH_R1, "q") == f"{SEARCH_R1.instruction()} Question: q\n"
    assert render_prompt("Q: {question}", SEARCH_R1, "q") == "Q: q"
    assert get_template("search_r1").prompt_template == "search_r1"
