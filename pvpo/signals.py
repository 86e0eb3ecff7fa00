"""Stop signals: SIGTERM ends a command as Ctrl-C does, a stop's clean-up runs to its end however
often the key is pressed, and the moves that replace a folder are never cut in half by one.

Python raises KeyboardInterrupt at every SIGINT, wherever the main thread is: a second Ctrl-C
lands in the `except`/`finally` blocks of the first (a replaced run half put back, "Exception
ignored" tracebacks, and at interpreter shutdown an abort, rc -6, measured with 40 SIGINTs 5 ms
apart). So within `stop_on_signals` the first signal stops the command and every later one is
ignored, the `pvpo` command ignores them while its process ends, and `hold_signals` makes a few
file moves wait for a signal instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so it ends as Ctrl-C (SIGINT) does: files closed,
    temporary files removed, and one line saying where the command stopped."""

    signum = signal.SIGTERM


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _ignore(signum: int, frame: Any) -> None:
    """A stop is under way: a further signal changes nothing."""


# set by `pvpo`'s entry point: a stop ends this process, so after one the signals stay ignored
# (the stop's line is printed and the process exits after the block: a late Ctrl-C must cut neither)
_process_ends_on_stop = False
_stopped = False


def stops_end_the_process() -> None:
    """Say that a stop signal ends this process (the `pvpo` command): once one has stopped a
    `stop_on_signals` block, SIGINT and SIGTERM stay ignored after it too, to the process's end."""
    global _process_ends_on_stop
    _process_ends_on_stop = True


def _stop(signum: int, frame: Any) -> None:
    global _stopped
    _stopped = True
    for s in _STOP_SIGNALS:
        if signal.getsignal(s) != signal.SIG_IGN:
            signal.signal(s, _ignore)
    if signum == signal.SIGTERM:
        raise Stopped()
    raise KeyboardInterrupt()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block the first SIGINT raises KeyboardInterrupt and the first SIGTERM `Stopped`
    (by default SIGTERM kills the process with no word and no clean-up); every later one within
    the block is ignored, so the clean-up the first one started (the `finally` and `except`
    blocks it runs through) finishes. The previous handlers come back after the block, unless a
    stop ends the process (`stops_end_the_process`): then they stay ignored. Outside the main
    thread (where Python cannot set handlers) the block runs as it is."""
    if not _in_main_thread():
        yield
        return
    # a signal the process was started ignoring stays ignored (a background job of a script, nohup)
    previous = {s: signal.signal(s, _stop) for s in _STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    finally:
        if not (_stopped and _process_ends_on_stop):
            _restore(previous)


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on: for a process that is ending, whose shutdown (threads
    of torch and the tokenizers joined, files closed) a late Ctrl-C would cut into."""
    if _in_main_thread():
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def hold_signals() -> Iterator[None]:
    """SIGINT and SIGTERM arriving within the block wait for its end, then act as they would have
    (the handler in place is called; SIGTERM's default ends the process). For a few renames that
    must all happen or none. Outside the main thread the block runs as it is."""
    if not _in_main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        _restore(previous)
        if caught:
            _deliver(caught[0], previous[signal.Signals(caught[0])])


def _restore(previous: dict[signal.Signals, Any]) -> None:
    """Put back the handlers `signal.signal` returned (None: one set outside Python, left as is)."""
    for s, handler in previous.items():
        if handler is not None:
            signal.signal(s, handler)


def _deliver(signum: int, handler: Any) -> None:
    """What `handler` (a previous disposition of `signum`) would have done with it."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt()
        os.kill(os.getpid(), signum)
