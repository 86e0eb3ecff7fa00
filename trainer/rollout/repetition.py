"""The repetition stop: a turn that has fallen into a loop (the same few tokens over and over, as a
small base model writes "0000..." or one sentence again and again) ends there instead of running
to its token budget.

A turn ends in a loop when its last `n` tokens equal the `n` tokens `p` positions before them, for
a period `p` of at most `MAX_PERIOD` tokens: at least `n + p` tokens of one pattern repeated. In
2,360 turns of Search-R1 (Qwen2.5-7B) evaluated on NQ and Bamboogle
(`../shared/data/scored`, SmolLM2's tokenizer), the longest such repeat of a turn that was not
degenerate is 18 tokens; the one longer (477 tokens) is a loop that scored EM 0. `pvpo eval`'s
default `n` of 32 stops that one and none of the others.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PERIOD = 32  # a sentence a small model repeats is a few dozen tokens at most


def ends_in_loop(ids: Sequence[int], n: int, max_period: int = MAX_PERIOD) -> bool:
    """Whether the last `n` tokens of `ids` repeat the `n` before them at a period of at most
    `max_period` tokens (`n` <= 0: never)."""
    if n <= 0 or len(ids) <= n:
        return False
    last = ids[-1]
    tail = list(ids[-n:])
    for p in range(1, min(max_period, len(ids) - n) + 1):
        if ids[-1 - p] == last and list(ids[-n - p : -p]) == tail:
            return True
    return False
