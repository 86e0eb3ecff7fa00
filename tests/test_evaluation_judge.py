"""Parsing of LLM-judge replies, judge bookkeeping (no-request zeros, cache, summary) and the
restoration of the stop strings OpenAI servers strip. The requests themselves are tested against
a real vLLM server in tests/test_eval_openai.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvpo.evaluation.judge import JudgeCache, Verdict, judge_prompt, judge_summary, parse_score
from pvpo.reward import RESEARCH, SEARCH_R1
from pvpo.trainer.rollout.openai_client import restore_stop


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Score: 4", 4),
        ("score:5", 5),
        ("Score: 4.", 4),
        ("The answer names the same person.\n**Score:** 3", 3),
        ("Score: 2\nOn reflection, Score: 5", 5),
        ('{"score": 1, "reason": "wrong year"}', 1),
        ("\\boxed{0}", 0),
        ("I would give it 4/5.", 4),
        ("5", 5),
        (" 3. ", 3),
        ("Score: 7", None),
        ("The answer 1998 is wrong", None),
        ("", None),
        ("Score: 4.5", None),
    ],
)
def test_parse_score_reads_the_judges_score(reply: str, score: int | None) -> None:
    assert parse_score(reply) == score


def test_judge_prompt_lists_every_golden_answer_and_the_prediction() -> None:
    p = judge_prompt("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"], "the Bard")
    assert "Reference answers: William Shakespeare; Shakespeare" in p and "Answer to grade: the Bard" in p
    assert p.rstrip().endswith("Score: <0-5>")


def test_judge_cache_survives_a_torn_line_and_keys_on_model_api_and_prompt(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    cache = JudgeCache(path)
    k = JudgeCache.key("m", "chat", "p")
    cache.put(k, "Score: 5")
    with path.open("a") as f:
        f.write('{"key": "abc", "rep')
    again = JudgeCache(path)
    assert again.get(k) == "Score: 5" and len(again.data) == 1
    assert (
        len(
            {
                k,
                JudgeCache.key("m2", "chat", "p"),
                JudgeCache.key("m", "completions", "p"),
                JudgeCache.key("m", "chat", "q"),
            }
        )
        == 4
    )


def test_judge_summary_reports_the_distribution_and_unparsed() -> None:
    verdicts = [Verdict(5, "Score: 5", False), Verdict(5, "5", True), Verdict(0, "", True), Verdict(None, "??", False)]
    s = judge_summary(verdicts, model="j")
    assert s["lasj_distribution"] == {"0": 1, "1": 0, "2": 0, "3": 0, "4": 0, "5": 2, "unparsed": 1}
    assert s["lasj_mean"] == pytest.approx(10 / 3) and s["lasj"] == pytest.approx(10 / 15) and s["lasj_cached"] == 2


@pytest.mark.parametrize(
    ("text", "finish", "stop_reason", "want"),
    [
        ("<think>x</think><search> q ", "stop", "</search>", ("<think>x</think><search> q </search>", "stop")),
        ("<think>x</think><search> q ", "stop", None, ("<think>x</think><search> q </search>", "stop")),
        ("<search>a</search> then <answer> B ", "stop", None, ("<search>a</search> then <answer> B </answer>", "stop")),
        ("<answer> B </answer>", "stop", None, ("<answer> B </answer>", "stop")),
        ("I do not know.", "stop", None, ("I do not know.", "eos")),
        ("<search> q", "length", None, ("<search> q", "length")),
    ],
)
def test_restore_stop_puts_back_the_stripped_stop_string(text: str, finish: str, stop_reason, want) -> None:
    assert restore_stop(text, finish, stop_reason, SEARCH_R1) == want


def test_restore_stop_uses_the_protocols_tags() -> None:
    assert restore_stop("<answer> \\boxed{B}", "stop", None, RESEARCH) == ("<answer> \\boxed{B}</answer>", "stop")


def test_openai_client_retries_an_unreachable_endpoint_then_names_it() -> None:
    import socket
    import time

    from pvpo.trainer.rollout.openai_client import OpenAIClient, OpenAIError

    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAIClient(f"http://127.0.0.1:{port}/v1", "m", retries=2, backoff=0.05)
    start = time.perf_counter()
    with pytest.raises(
        OpenAIError, match=rf"127.0.0.1:{port}/v1/chat/completions failed after 3 attempt\(s\): ConnectError"
    ):
        client.post("chat/completions", {"messages": []})
    assert client.requests == 3 and time.perf_counter() - start >= 0.05 + 0.1  # backoff 0.05, then 0.1 (x 1-2 jitter)
