"""`pvpo eval` never looks hung: inside a question it shows the turn and the tokens written, the
token rate and the time left estimated from tokens (with the budget's bound), on a line every
`PVPO_PROGRESS_EVERY_S` seconds off a terminal even while no question ends."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pvpo.envs.data import QAExample
from pvpo.evaluation.progress import EvalProgress, duration, tokens_left
from pvpo.evaluation.run import EvalSettings, Outcome, run_eval


def test_tokens_left_expects_what_longer_answers_needed_and_bounds_by_the_budget() -> None:
    expected, most = tokens_left([100, 700], 2, [50, 150, 300], 1000)
    # waiting: 2 x the mean answer (166.7); at 100 tokens: answers longer than it needed 50 and 200
    # more (mean 125); at 700, past every answer: a fresh question's mean, within its budget's 300
    assert expected == pytest.approx(3 * 500 / 3 + 125)
    assert tokens_left([950], 0, [50, 150, 300], 1000)[0] == 50  # past every answer, 50 tokens of budget left
    assert most == 900 + 300 + 2 * 1000
    assert tokens_left([100], 3, [], 1000) == (None, 900 + 3000)  # no answer yet: only the bound


def test_durations_read_as_seconds_minutes_or_hours() -> None:
    assert [duration(s) for s in (40, 89, 180, 3900)] == ["40 s", "89 s", "3 min", "1 h 05 min"]


def test_the_status_names_the_turn_the_tokens_the_rate_and_the_time_left() -> None:
    sampled = [1000]  # the engine's count before the run
    meter = EvalProgress(
        total=20, initial=0, desc="eval", max_turns=6, most_tokens=1000, sampled=lambda: sampled[0], enabled=False
    )
    q = SimpleNamespace(completion_tokens=0, num_turns=0)
    meter.started(19, q)
    assert meter.status(now=0.0) == "1 in flight: turn 1 of 6, 0 tokens"
    sampled[0] += 60  # 60 tokens of its first turn, still generating
    # 19 questions waiting and this one's 940 left: 19,940 tokens at 6 tokens/s
    assert meter.status(now=10.0) == "at most 55 min left, 6.0 tokens/s, 1 in flight: turn 1 of 6, 60 tokens"
    q.completion_tokens, q.num_turns = 60, 1  # the turn ended; the next one starts
    sampled[0] += 40
    assert meter.status(now=20.0).endswith("1 in flight: turn 2 of 6, 100 tokens")
    meter.answered(19, 100)
    assert meter.status(now=30.0).startswith("~")  # an answer to expect from


def test_a_line_is_written_every_period_while_one_question_is_still_generating() -> None:
    stream, sampled = io.StringIO(), [0]
    meter = EvalProgress(
        total=2,
        initial=0,
        desc="eval hotpotqa",
        max_turns=6,
        most_tokens=500,
        sampled=lambda: sampled[0],
        stream=stream,
        every_s=0.1,
        tick_s=0.02,
    )
    q = SimpleNamespace(completion_tokens=0, num_turns=0)
    meter.started(0, q)
    for _ in range(30):
        time.sleep(0.02)
        sampled[0] += 5
    lines_before_an_answer = stream.getvalue().splitlines()
    meter.answered(0, sampled[0])
    meter.close()
    assert len(lines_before_an_answer) >= 3, lines_before_an_answer
    last = lines_before_an_answer[-1]
    assert last.startswith("eval hotpotqa: 0/2 q (0%)") and "tokens/s" in last and "at most" in last
    assert "1 in flight: turn 1 of 6" in last
    assert stream.getvalue().splitlines()[-1].startswith("eval hotpotqa: done 1/2 q")


class SlowPolicy:
    """An EvalPolicy answering each question after writing `tokens` tokens, `pace` seconds apiece,
    counted as an engine counts them (`sampled_tokens`)."""

    def __init__(self, tokens: int, pace: float) -> None:
        self.tokens, self.pace, self.count = tokens, pace, 0

    def sampled_tokens(self) -> int:
        return self.count

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Any,
        episode: Any,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        out = []
        for i, _ in enumerate(examples):
            live = SimpleNamespace(completion_tokens=0, num_turns=0)
            if on_start is not None:
                on_start(i, live)
            for _ in range(self.tokens):
                time.sleep(self.pace)
                self.count += 1
            o = Outcome("prompt", "<answer> a </answer>", "a", 0, 1, 3, self.tokens, "answer", format_ok=True)
            out.append(o)
            if on_done is not None:
                on_done(i, o)
        return out


def test_pvpo_evals_log_shows_a_long_question_as_it_generates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PVPO_PROGRESS_EVERY_S", "0.1")
    examples = [QAExample(f"qa/{i}", f"question {i}?", ("a",)) for i in range(2)]
    run_eval(SlowPolicy(40, 0.01), examples, None, EvalSettings(), tmp_path / "out", meta={"dataset": "qa"})
    lines = capsys.readouterr().err.splitlines()
    during = [ln for ln in lines if ln.startswith("eval qa: 0/2 q") and "1 in flight: turn 1 of 6" in ln]
    assert len(during) >= 2, lines  # while the first question was still writing
    assert any("tokens/s" in ln for ln in during)
