"""What `pvpo eval` shows while it runs: questions answered, and inside the questions in flight their
turn and tokens, the token rate, and the time left estimated from tokens.

A question's time is its tokens, not a share of the run's: a base model's question that writes
"000..." to every turn's budget takes many times the others together, and an estimate from the
questions answered says seconds are left while it runs. So the estimate is in tokens: each question in flight is expected to
need what the answered ones that ran past its tokens needed beyond them (where none did, what a
fresh question needs, within its budget), each waiting question the answered ones' mean; seconds
are tokens over the rate of the last minute. The budget gives the bound beside it ("at most"),
true whatever the model writes.

Tokens inside a turn come from the engine's `sampled_tokens` where it counts them (the
transformers engine); elsewhere a question's tokens move at the end of each turn.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from pvpo.progress import Progress

RATE_WINDOW_S = 60.0  # the token rate is measured over the last minute: the batch shrinks at the end


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: 40 s, 3 min, 1 h 05 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def tokens_left(in_flight: list[int], waiting: int, answered: list[int], most: int) -> tuple[float | None, int]:
    """(expected, most) model tokens the run still needs: `in_flight` holds the tokens each question
    in flight has written, `waiting` the questions not started, `answered` the tokens of each
    answered one, `most` a question's budget. The expectation is None before the first answer."""
    bound = sum(max(0, most - t) for t in in_flight) + waiting * most
    if not answered:
        return None, bound
    mean = sum(answered) / len(answered)
    expected = waiting * mean
    for t in in_flight:
        longer = [a - t for a in answered if a > t]
        expected += sum(longer) / len(longer) if longer else min(mean, max(0, most - t))
    return expected, bound


class EvalProgress:
    """The meter of one dataset's evaluation: `started(i, trajectory)` as a question starts (the
    live trajectory, read for its turn and tokens), `answered(i, tokens)` as it is saved. A watcher
    thread refreshes the line every `tick_s` (a terminal's bar) and writes one every `every_s` off a
    terminal (`pvpo.progress.Progress`), so a long question never looks hung."""

    def __init__(
        self,
        *,
        total: int,
        initial: int,
        desc: str,
        max_turns: int,
        most_tokens: int,
        sampled: Callable[[], int] | None = None,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        tick_s: float | None = None,
    ) -> None:
        """`most_tokens`: a question's model-token budget; `sampled`: the engine's count of sampled
        tokens (None where the engine does not count them); `tick_s`: how often the watcher
        refreshes (default 2 s, or `every_s` if shorter)."""
        self.bar = Progress(
            total=total,
            initial=initial,
            desc=desc,
            unit="q",
            enabled=enabled,
            stream=stream,
            every_s=every_s,
            count_eta=False,
        )
        self.total, self.done0 = total, initial
        self.max_turns, self.most = max_turns, most_tokens
        self.sampled = sampled
        self.sampled0 = sampled() if sampled is not None else 0
        self.live: dict[int, Any] = {}  # question -> its trajectory, while in flight
        self.answered_tokens: list[int] = []
        self.finished_turn_tokens = 0  # model tokens of the answered questions
        self.samples: deque[tuple[float, int]] = deque()  # (time, tokens written so far)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled:
            tick_s = tick_s if tick_s is not None else min(2.0, self.bar.every_s or 2.0)
            self._thread = threading.Thread(target=self._watch, args=(tick_s,), name="pvpo-eval-progress", daemon=True)
            self._thread.start()

    def started(self, i: int, trajectory: Any) -> None:
        """Question `i` started; `trajectory` grows as its turns end (`completion_tokens`, `num_turns`)."""
        with self._lock:
            self.live[i] = trajectory

    def answered(self, i: int, tokens: int) -> None:
        """Question `i` is answered and saved, after `tokens` model tokens."""
        with self._lock:
            self.live.pop(i, None)
            self.answered_tokens.append(tokens)
            self.finished_turn_tokens += tokens
        self.bar.update(1)

    def status(self, now: float | None = None) -> str:
        """The line's text after the count: time left, token rate, the questions in flight."""
        now = time.monotonic() if now is None else now
        with self._lock:
            live = list(self.live.values())
            answered = list(self.answered_tokens)
            turn_tokens = self.finished_turn_tokens + sum(int(t.completion_tokens) for t in live)
        in_turn = 0
        if self.sampled is not None:  # tokens of the turns still generating, not yet in any trajectory
            in_turn = max(0, self.sampled() - self.sampled0 - turn_tokens)
        written = turn_tokens + in_turn
        self.samples.append((now, written))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        t0, w0 = self.samples[0]
        rate = (written - w0) / (now - t0) if now > t0 else 0.0
        share = in_turn / len(live) if live else 0.0
        mine = [int(t.completion_tokens) + share for t in live]
        waiting = max(0, self.total - self.done0 - len(answered) - len(live))
        expected, bound = tokens_left([round(m) for m in mine], waiting, answered, self.most)
        parts = []
        if rate > 0:
            if expected is not None:
                parts.append(f"~{duration(expected / rate)} left (at most {duration(bound / rate)})")
            else:
                parts.append(f"at most {duration(bound / rate)} left")
            parts.append(f"{rate:.1f} tokens/s")
        if live:
            turns = sorted(min(int(t.num_turns) + 1, self.max_turns) for t in live)
            turn = f"turn {turns[0]}" if turns[0] == turns[-1] else f"turns {turns[0]}-{turns[-1]}"
            parts.append(f"{len(live)} in flight: {turn} of {self.max_turns}, {round(sum(mine))} tokens")
        return ", ".join(parts)

    def _watch(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            self.bar.set_status(self.status())
            self.bar.tick()

    def close(self) -> None:
        """Stop the watcher and end the meter (its final line)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.set_status("")  # the final line counts what was answered; nothing is in flight
        self.bar.close()
