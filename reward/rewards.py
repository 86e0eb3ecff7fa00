"""Trajectory rewards by name. Each is pure and total: any response in, a float in [0, 1] out.

A reward takes `(response, golds, protocol)` and returns a `RewardResult` whose `total` trains the
policy and whose `components` are kept apart for multi-reward estimators (GDPO).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from pvpo.registry import Registry
from pvpo.reward.metrics import as_golds, cover_exact_match, exact_match, f1_score
from pvpo.reward.normalize import answer_tokens
from pvpo.reward.protocol import SEARCH_R1, TagProtocol


@dataclass(frozen=True)
class RewardResult:
    """A scalar reward with its named parts and the answer it was computed from."""

    total: float
    components: Mapping[str, float] = field(default_factory=dict)
    prediction: str | None = None
    format_ok: bool = False


class RewardFn(Protocol):
    def __call__(
        self, response: str, golds: Sequence[str] | str, protocol: TagProtocol = SEARCH_R1
    ) -> RewardResult: ...


REWARDS: Registry[Callable[..., RewardResult]] = Registry("reward")
# The valid range `(low, high)` of each numeric parameter, by reward name (`register_reward(ranges=)`):
# a reward clamps its total to [0, 1], so a floor of 5 (or NaN) would score every well-formed answer
# alike and train nothing, without a word.
PARAM_RANGES: dict[str, dict[str, tuple[float, float]]] = {}
_UNIT = (0.0, 1.0)


def register_reward(
    name: str, *, ranges: Mapping[str, tuple[float, float]] | None = None
) -> Callable[[Callable[..., RewardResult]], Callable[..., RewardResult]]:
    """Decorator: make a reward function available to `get_reward(name)`; `ranges` gives the valid
    `(low, high)` of its numeric parameters (inclusive; `math.inf` for no bound), checked with the
    parameters (`check_reward_params`)."""

    def deco(fn: Callable[..., RewardResult]) -> Callable[..., RewardResult]:
        registered = REWARDS.register(name, _total(fn))
        PARAM_RANGES[name] = dict(ranges or {})
        return registered

    return deco


def _range_text(low: float, high: float) -> str:
    return f"[{low:g}, {high:g}]".replace("inf]", "inf)")


def _total(fn: Callable[..., RewardResult]) -> Callable[..., RewardResult]:
    """Make a reward total: bad inputs score 0 instead of raising, results clamp to [0, 1]."""

    def safe(response: Any, golds: Any, protocol: TagProtocol = SEARCH_R1, **kwargs: Any) -> RewardResult:
        if not isinstance(response, str):
            return RewardResult(0.0, {}, None, False)
        try:
            result = fn(response, as_golds(golds), protocol, **kwargs)
        except (TypeError, ValueError, AttributeError, IndexError, KeyError, RecursionError):
            return RewardResult(0.0, {}, None, False)
        total = min(1.0, max(0.0, float(result.total)))
        return RewardResult(total, dict(result.components), result.prediction, result.format_ok)

    safe.__name__ = getattr(fn, "__name__", "reward")
    safe.__doc__ = fn.__doc__
    safe.__wrapped__ = fn  # type: ignore[attr-defined]  # its signature, for check_reward_params
    return safe


def reward_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters reward `name` takes beyond (response, golds, protocol)."""
    fn = REWARDS.get(name)
    params = list(inspect.signature(getattr(fn, "__wrapped__", fn)).parameters.values())[3:]
    return {p.name: p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


_NUMBER = (int, float)


def _fits(value: Any, annotation: Any) -> bool:
    """Whether `value` is of a parameter's plain annotation (float, int, bool, str); True for any other."""
    kinds = {"float": _NUMBER, "int": (int,), "bool": (bool,), "str": (str,)}
    want = kinds.get(annotation if isinstance(annotation, str) else getattr(annotation, "__name__", ""))
    if want is None:
        return True
    return isinstance(value, want) and (want == (bool,) or not isinstance(value, bool))


def check_reward_params(name: str, params: Mapping[str, Any]) -> None:
    """ValueError when `params` do not fit reward `name`: a keyword its function does not take
    (the message lists those it takes, and the nearest to the one given), a value of the wrong
    type, or a number outside the parameter's range (`PARAM_RANGES`; NaN is in none). A total reward turns a bad keyword into a 0 for every answer, which trains nothing
    without a word, so this is checked where the parameters are given (config, env)."""
    takes = reward_parameters(name)
    fn = REWARDS.get(name)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in inspect.signature(getattr(fn, "__wrapped__", fn)).parameters.values())
    for key, value in params.items():
        if key not in takes:
            if var_kw:
                continue
            near = difflib.get_close_matches(key, list(takes), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            known = ", ".join(sorted(takes)) or "none"
            raise ValueError(f"reward {name!r} takes no parameter {key!r}{hint}; its parameters: {known}")
        if not _fits(value, takes[key].annotation):
            raise ValueError(f"reward {name!r}: parameter {key!r} must be a {takes[key].annotation}, got {value!r}")
        if isinstance(value, _NUMBER) and not isinstance(value, bool):
            low, high = PARAM_RANGES.get(name, {}).get(key, (-math.inf, math.inf))
            if not (math.isfinite(value) or value in (low, high)) or not low <= value <= high:
                raise ValueError(
                    f"reward {name!r}: parameter {key!r} must be a number in {_range_text(low, high)}, got {value!r}"
                )


def get_reward(name: str, **params: Any) -> RewardFn:
    """A registered reward by name, with its parameters bound (e.g. `get_reward("pvpo", length_ratio=4)`).
    Unknown names raise UnknownNameError listing the known ones; parameters the reward does not
    take, or of the wrong type, a ValueError (`check_reward_params`)."""
    fn = REWARDS.get(name)
    if params:
        check_reward_params(name, params)
    return partial(fn, **params) if params else fn


def available_rewards() -> list[str]:
    return REWARDS.names()


def _accuracy_vs_length(prediction: str, golds: list[str], length_ratio: float) -> float:
    """PVPO's r_acc per gold: F1 if the prediction is at least `length_ratio` times as long as the
    gold (in normalised tokens), else cover-EM; max over golds."""
    pred_len = len(answer_tokens(prediction))
    best = 0.0
    for gold in golds:
        if pred_len >= length_ratio * len(answer_tokens(gold)):
            score = f1_score(prediction, [gold])
        else:
            score = cover_exact_match(prediction, [gold])
        best = max(best, score)
    return best


@register_reward("pvpo", ranges={"length_ratio": (0.0, math.inf), "floor": _UNIT})
def pvpo_reward(
    response: str, golds: list[str], protocol: TagProtocol = SEARCH_R1, *, length_ratio: float = 3.0, floor: float = 0.1
) -> RewardResult:
    """PVPO (Feng et al., 2025, arXiv:2508.21104): `max(floor, r_acc)` when the format is correct,
    else 0. `r_acc` is F1 when the prediction has at least `length_ratio` x the gold's tokens (a
    long answer must not win cover-EM by listing everything), else cover-EM."""
    check = protocol.check_format(response)
    prediction = protocol.extract_answer(response)
    acc = _accuracy_vs_length(prediction, golds, length_ratio) if prediction is not None else 0.0
    total = max(floor, acc) if check.ok else 0.0
    # `r_acc`, the paper's name: "accuracy" is exact match everywhere else (the trainer's metric)
    return RewardResult(total, {"format": float(check.ok), "r_acc": acc}, prediction, check.ok)


@register_reward("em")
def em_reward(response: str, golds: list[str], protocol: TagProtocol = SEARCH_R1) -> RewardResult:
    """Search-R1 (Jin et al., 2025, arXiv:2503.09516) outcome reward: exact match of the extracted
    answer, format not judged."""
    prediction = protocol.extract_answer(response)
    em = exact_match(prediction, golds) if prediction is not None else 0.0
    ok = protocol.check_format(response).ok
    return RewardResult(em, {"em": em, "format": float(ok)}, prediction, ok)


@register_reward("search_r1_format", ranges={"structure_score": _UNIT, "final_format_score": _UNIT})
def search_r1_format_reward(
    response: str,
    golds: list[str],
    protocol: TagProtocol = SEARCH_R1,
    *,
    structure_score: float = 0.2,
    final_format_score: float = 0.1,
) -> RewardResult:
    """Search-R1's format-aware EM reward (`qa_em_format.py`): correct + well-formed 1.0; correct but
    malformed 1 - structure_score (0.8); wrong but well-formed structure_score (0.2); wrong,
    malformed, with an answer final_format_score (0.1); malformed without an answer 0."""
    ok = protocol.check_format(response).ok
    prediction = protocol.extract_answer(response)
    correct = prediction is not None and exact_match(prediction, golds) == 1.0
    if correct:
        total = 1.0 if ok else 1.0 - structure_score
    elif ok:
        total = structure_score
    else:
        total = final_format_score if prediction is not None else 0.0
    return RewardResult(total, {"em": float(correct), "format": float(ok)}, prediction, ok)


@register_reward("research_f1", ranges={"floor": _UNIT})
def research_f1_reward(
    response: str, golds: list[str], protocol: TagProtocol = SEARCH_R1, *, floor: float = 0.1
) -> RewardResult:
    """ReSearch (Chen et al., 2025, arXiv:2503.19470): answer F1 when the format is correct, with a
    `floor` (0.1) for a well-formed but wrong answer; 0 when the format is wrong."""
    check = protocol.check_format(response)
    prediction = protocol.extract_answer(response)
    f1 = f1_score(prediction, golds) if prediction is not None else 0.0
    total = (f1 if f1 > 0 else floor) if check.ok else 0.0
    return RewardResult(total, {"f1": f1, "format": float(check.ok)}, prediction, check.ok)
