"""Two evaluations of the same questions side by side: each question's pair of episodes, paired by
dataset and id, and how the second changed it (e.g. warm start as A, the RL policy as B)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# what became of a question from A to B, by EM: B got right what A got wrong ("gained"), the
# reverse ("lost"), right in both, wrong in both; a question only one of them answered is "only_a" / "only_b"
FLIPS = ("gained", "lost", "both", "neither", "only_a", "only_b")


def flip(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    """What became of one question from episode `a` to `b` (`FLIPS`), by EM."""
    if a is None or b is None:
        return "only_b" if a is None else "only_a"
    right_a, right_b = float(a["em"]) >= 1.0, float(b["em"]) >= 1.0
    if right_a != right_b:
        return "gained" if right_b else "lost"
    return "both" if right_a else "neither"


def pair_episodes(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """`[index in a or -1, index in b or -1, flip]` per question, by the episodes' key (dataset/id):
    A's questions in A's order, then those only B answered in B's order."""
    in_b = {str(e["k"]): i for i, e in enumerate(b)}
    pairs: list[list[Any]] = []
    seen = set()
    for i, e in enumerate(a):
        j = in_b.get(str(e["k"]), -1)
        seen.add(str(e["k"]))
        pairs.append([i, j, flip(e, b[j] if j >= 0 else None)])
    pairs += [[-1, j, "only_b"] for j, e in enumerate(b) if str(e["k"]) not in seen]
    return pairs
