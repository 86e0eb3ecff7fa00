"""Two evaluations of the same questions side by side: each question's pair of episodes, paired by
dataset and id (or, where the files record no ids, by the question's text), and how the second
changed it (e.g. warm start as A, the RL policy as B)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# what became of a question from A to B, by EM: B got right what A got wrong ("gained"), the
# reverse ("lost"), right in both, wrong in both; a question only one of them answered is "only_a" / "only_b"
FLIPS = ("gained", "lost", "both", "neither", "only_a", "only_b")

Episode = Mapping[str, Any]


class PairingError(ValueError):
    """Two evaluations whose questions cannot be paired without guessing; the message says why,
    `disjoint` whether it is only that no question is on both sides."""

    def __init__(self, why: Sequence[str], disjoint: bool) -> None:
        super().__init__("; ".join(why))
        self.disjoint = disjoint


def flip(a: Episode | None, b: Episode | None) -> str:
    """What became of one question from episode `a` to `b` (`FLIPS`), by EM."""
    if a is None or b is None:
        return "only_b" if a is None else "only_a"
    right_a, right_b = float(a["em"]) >= 1.0, float(b["em"]) >= 1.0
    if right_a != right_b:
        return "gained" if right_b else "lost"
    return "both" if right_a else "neither"


def _text(e: Episode) -> str:
    return " ".join(str(e["q"]).lower().split())


def _by_id(e: Episode) -> str:
    return f"{e['ds']}/{e['id']}"


def _by_text(e: Episode) -> str:
    return f"{e['ds']}\n{_text(e)}"


# how two evaluations are paired, in order of preference: the first whose keys are unique on each
# side, shared by some question and, for ids, naming the same question on both sides. Both keep
# the dataset: the same question in two datasets is two questions
KEYS: tuple[tuple[str, Callable[[Episode], str]], ...] = (
    ("id", _by_id),
    ("question text", _by_text),
)


def _unique(episodes: Sequence[Episode], key: Callable[[Episode], str]) -> dict[str, int] | None:
    index: dict[str, int] = {}
    for i, e in enumerate(episodes):
        k = key(e)
        if k in index:
            return None
        index[k] = i
    return index


def pairing(a: Sequence[Episode], b: Sequence[Episode]) -> tuple[str, Callable[[Episode], str]]:
    """`(name, key)` of the first of `KEYS` that pairs `a` and `b` without guessing; PairingError
    saying why none does. Ids pair when every episode has one, unique on its side, and paired
    episodes ask the same question; question texts when each is unique on its side."""
    if not a or not b:
        return KEYS[0]
    why = []
    disjoint = True
    for name, key in KEYS:
        if name == "id" and not all(e["id"] for e in [*a, *b]):
            why.append("some episodes record no id")
            continue
        in_a, in_b = _unique(a, key), _unique(b, key)
        if in_a is None or in_b is None:
            why.append(f"{name}s repeat on side {'A' if in_a is None else 'B'}")
            disjoint = False
            continue
        shared = in_a.keys() & in_b.keys()
        if not shared:
            why.append(f"no {name} is on both sides")
            continue
        if name == "id":
            differ = sorted(k for k in shared if _text(a[in_a[k]]) != _text(b[in_b[k]]))
            if differ:
                why.append(f"id {differ[0]} asks another question on each side ({len(differ)} such ids)")
                disjoint = False
                continue
        return name, key
    raise PairingError(why, disjoint)


def pair_episodes(a: Sequence[Episode], b: Sequence[Episode]) -> list[list[Any]]:
    """`[index in a or -1, index in b or -1, flip]` per question, paired as `pairing` says: A's
    questions in A's order, then those only B answered in B's order."""
    _, key = pairing(a, b)
    in_b = {key(e): i for i, e in enumerate(b)}
    pairs: list[list[Any]] = []
    seen = set()
    for i, e in enumerate(a):
        k = key(e)
        j = in_b.get(k, -1)
        seen.add(k)
        pairs.append([i, j, flip(e, b[j] if j >= 0 else None)])
    pairs += [[-1, j, "only_b"] for j, e in enumerate(b) if key(e) not in seen]
    return pairs
