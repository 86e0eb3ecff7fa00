"""Progress of long work: a tqdm bar on a terminal, periodic one-line log lines otherwise (logs of
`make demo` piped to a file or CI hold lines, not thousands of `\\r` bar frames)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

EVERY_S_ENV = "PVPO_PROGRESS_EVERY_S"  # seconds between two log lines off a terminal (default 30)


def _every_s() -> float:
    raw = os.environ.get(EVERY_S_ENV, "30")
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise ValueError(f"{EVERY_S_ENV}={raw!r} is not a number of seconds") from None


def quiet_library_bars(stream: TextIO | None = None) -> None:
    """Off a terminal, turn off the bars of Hugging Face libraries (transformers' "Loading
    weights", hub downloads), which honour `HF_HUB_DISABLE_PROGRESS_BARS` when first imported;
    an explicit setting of that variable is kept."""
    if not getattr(stream if stream is not None else sys.stderr, "isatty", lambda: False)():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class Progress:
    """A progress meter with tqdm's `update` / `set_postfix` / `close` and iteration. `enabled=False`
    shows nothing; on a TTY it is a tqdm bar; elsewhere it writes `desc: n/total (p%) ...` to
    `stream` when it starts, then at most every `every_s` seconds, and when it closes. Its methods
    may be called from several threads (a watcher's `tick` beside the worker's `update`)."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        desc: str = "",
        initial: int = 0,
        unit: str = "it",
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float | None = None,
        brief: bool = False,
        count_eta: bool = True,
    ) -> None:
        """`brief`: a phase inside longer work (a step's rollouts, its update): on a terminal its bar
        is cleared when it ends; off one it writes no line when it starts, and one when it ends
        only if it wrote any before (a phase shorter than `every_s` leaves no line).
        `count_eta=False`: no time left estimated from the count (the caller says it in
        `set_status`, from a better measure than units done)."""
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
        self.desc, self.unit, self.n, self.initial = desc, unit, initial, initial
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = _every_s() if every_s is None else every_s
        self.postfix: dict[str, Any] = {}
        self.status = ""
        self._count_eta = count_eta
        self._lock = threading.RLock()
        self._bar: Any = None
        self._log = False
        self._closed = False
        self._t0 = self._last = time.monotonic()
        self._brief, self._lines = brief, 0
        if not enabled:
            return
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total,
                initial=initial,
                desc=desc,
                unit=unit,
                file=self.stream,
                dynamic_ncols=True,
                leave=not brief,
                **({} if count_eta else {"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"}),
            )
        else:
            self._log = True
            if not brief:
                self._line()

    def _line(self, final: bool = False) -> None:
        elapsed = time.monotonic() - self._t0
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        left = ""
        if self._count_eta and not final and self.total and rate > 0 and self.n > self.initial:
            left = f", ~{(self.total - self.n) / rate:.0f} s left"
        post = "".join(f", {k}={v}" for k, v in self.postfix.items())
        post += f", {self.status}" if self.status and not final else ""
        state = "done" if final else ""
        text = f"{self.desc}: {state + ' ' if state else ''}{count} {self.unit}{pct}, {elapsed:.0f} s{left}{post}"
        print(text, file=self.stream, flush=True)
        self._last = time.monotonic()
        self._lines += 1

    def update(self, n: int = 1) -> None:
        """Count `n` more units done."""
        with self._lock:
            self.n += n
            if self._bar is not None:
                self._bar.update(n)
            elif self._log and time.monotonic() - self._last >= self.every_s:
                self._line()

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the count (e.g. the current loss)."""
        with self._lock:
            self.postfix = dict(values)
            if self._bar is not None:
                self._bar.set_postfix(**values)

    def set_status(self, text: str) -> None:
        """A sentence shown after the count and the postfix (what the current unit is doing)."""
        with self._lock:
            self.status = text
            if self._bar is not None and not self._closed:
                self._bar.set_postfix_str(text, refresh=False)

    def tick(self) -> None:
        """Show the meter as it stands though no unit ended: the bar redrawn on a terminal, a line
        off one when `every_s` has passed since the last (work whose units take minutes)."""
        with self._lock:
            if self._closed:
                return
            if self._bar is not None:
                self._bar.refresh()
            elif self._log and time.monotonic() - self._last >= self.every_s:
                self._line()

    def close(self) -> None:
        """End the meter (a final line off a terminal); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif self._log and (self._lines or not self._brief):
                self._line(final=True)

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this Progress was made without an iterable; call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
