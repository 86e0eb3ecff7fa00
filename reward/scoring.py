"""Per-question scores and their aggregate: the one scoring layer of the held-out evaluation during
training (`pvpo.trainer.heldout`), `pvpo eval` (`pvpo.evaluation`) and the recipe tables
(`pvpo.recipes.heldout_table`). It takes plain values (a predicted answer or None, the golden
answers, the env's format verdict, the number of searches, the reward, the retrieved passages'
texts), so every caller scores a question the same way and names the figures the same way.

The names, one set for every caller (`NAMES`):

- `em`: exact match of the normalised answer with some golden answer (FlashRAG's `em`,
  arXiv:2405.13576; as Search-R1, arXiv:2503.09516, reports it).
- `f1`: token F1, max over the golden answers, with HotpotQA's yes/no rule (FlashRAG's `f1`).
- `cem`: cover-EM, some normalised golden answer inside the normalised answer (FlashRAG's `acc`).
- `format_ok`: the env's verdict on the response's tag format, the gate of PVPO's reward
  (arXiv:2508.21104: a malformed response scores 0 whatever its answer).
- `searches`: the search calls the episode made.
- `reward`: the episode's reward (the run's reward function, PVPO's format-gated one by default).
- `in_reach`: a golden answer occurs in the passages the episode retrieved (normalised as EM is,
  as a whole phrase), so whether a right answer was within the policy's reach.
- aggregates: each score's mean over the questions that record it, `em_se` the standard error of
  EM (`pvpo.stats`), `n` the questions, `em_<h>hop` EM over the questions of h hops.

Files on disk keep the names they were written with, so old runs, FlashRAG's tools and the viewer
read them unchanged; this module is the one place that spells them:

- a training run's `metrics.jsonl` / `eval_before.json`: `eval/<name>` (`val/<name>` at a
  validation point), with `em` as `accuracy`, `em_se` as `accuracy_se`, `searches` as
  `searches_per_traj` and `em_<h>hop` as `accuracy_<h>hop` (`on_disk`);
- `pvpo eval`'s items and `metrics.json`: FlashRAG's layout, `cem` as `acc` (`flashrag_metric_score`,
  `flashrag_summary`, `item_score`).

`canonical` reads either back under the names above (`ALIASES`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from pvpo.reward.metrics import answer_metrics, as_golds
from pvpo.reward.normalize import normalize_answer
from pvpo.stats import mean, standard_error

SCORES = ("em", "f1", "cem", "format_ok", "searches", "reward", "in_reach")
NAMES = ("n", "em", "em_se", "f1", "cem", "format_ok", "searches", "reward", "in_reach")

# name on disk -> name here; `accuracy_<h>hop` -> `em_<h>hop` by `_HOP_ON_DISK`
ALIASES = {"accuracy": "em", "accuracy_se": "em_se", "searches_per_traj": "searches", "acc": "cem"}
_TRAINER_NAMES = {"em": "accuracy", "em_se": "accuracy_se", "searches": "searches_per_traj"}
# the order a run's metrics.jsonl has always listed its evaluation's figures in
_TRAINER_ORDER = ("em", "em_se", "f1", "cem", "reward", "format_ok", "searches", "in_reach", "n")
_HOP = re.compile(r"em_(\d+)hop")
_HOP_ON_DISK = re.compile(r"accuracy_(\d+)hop")
SPLITS = ("eval", "val")


@dataclass(frozen=True)
class QuestionScore:
    """One question's scores under `SCORES`' names (module docstring); None where the scorer did
    not record it (an answer file without searches, an evaluation without a reward)."""

    em: float
    f1: float
    cem: float
    format_ok: float | None = None
    searches: float | None = None
    reward: float | None = None
    in_reach: float | None = None

    def as_dict(self) -> dict[str, float]:
        """The recorded scores by name: what a run keeps per question (`eval_before.json`'s `scores`)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def answer_in_reach(passages: Sequence[str], golds: str | Sequence[str] | None) -> bool:
    """Whether a golden answer, normalised as EM normalises it, occurs as a whole phrase in the
    normalised text of `passages` (the texts the episode's searches returned)."""
    seen = normalize_answer(" ".join(passages))
    return any(g and f" {g} " in f" {seen} " for g in (normalize_answer(x) for x in as_golds(golds)))


def _opt(value: float | bool | None) -> float | None:
    return None if value is None else float(value)


def score_answer(
    prediction: str | None,
    golds: str | Sequence[str],
    *,
    format_ok: bool | float | None = None,
    searches: int | float | None = None,
    reward: float | None = None,
    passages: Sequence[str] | None = None,
) -> QuestionScore:
    """A question's scores: EM, F1 and cover-EM of `prediction` against `golds` (0 for no
    prediction), the env's format verdict, its searches and reward as given, and whether an answer
    was in reach when the retrieved `passages`' texts are given."""
    m = answer_metrics(prediction, golds)
    return QuestionScore(
        em=m["em"],
        f1=m["f1"],
        cem=m["cem"],
        format_ok=_opt(format_ok),
        searches=_opt(searches),
        reward=_opt(reward),
        in_reach=None if passages is None else float(answer_in_reach(passages, golds)),
    )


def read_score(record: Mapping[str, Any]) -> QuestionScore:
    """A question's scores as a run stored them (`QuestionScore.as_dict`, or under an older name
    in `ALIASES`); a missing EM, F1 or CEM reads as 0."""
    named = {ALIASES.get(k, k): v for k, v in record.items()}
    return QuestionScore(
        em=float(named.get("em", 0.0)),
        f1=float(named.get("f1", 0.0)),
        cem=float(named.get("cem", 0.0)),
        **{k: _opt(named.get(k)) for k in ("format_ok", "searches", "reward", "in_reach")},
    )


def aggregate(scores: Sequence[QuestionScore], hops: Sequence[int | None] | None = None) -> dict[str, float]:
    """The figures of an evaluation under `NAMES`: `n`, each score's mean over the questions that
    record it (left out when none does; NaN for no questions), `em_se`, and, with each question's
    hop count (`hops`, None where unknown), `em_<h>hop` for each h in increasing order."""
    ems = [s.em for s in scores]
    out: dict[str, float] = {"n": float(len(scores)), "em": mean(ems), "em_se": standard_error(ems)}
    out["f1"] = mean([s.f1 for s in scores])
    out["cem"] = mean([s.cem for s in scores])
    for name in ("format_ok", "searches", "reward", "in_reach"):
        vals = [v for s in scores if (v := getattr(s, name)) is not None]
        if vals:
            out[name] = mean(vals)
    by_hops: dict[int, list[float]] = {}
    for s, h in zip(scores, hops if hops is not None else [None] * len(scores), strict=True):
        if h is not None:
            by_hops.setdefault(int(h), []).append(s.em)
    for h, hop_ems in sorted(by_hops.items()):
        out[f"em_{h}hop"] = mean(hop_ems)
    return out


def on_disk(figures: Mapping[str, float], split: str = "eval") -> dict[str, float]:
    """`aggregate`'s figures under a training run's names (`eval/accuracy`, ...; `val/...` for
    `split="val"`), in the order its metrics.jsonl lists them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    hops = [k for k in figures if _HOP.fullmatch(k)]
    out: dict[str, float] = {}
    for name in [*_TRAINER_ORDER, *hops]:
        if name in figures:
            hop = _HOP.fullmatch(name)
            disk = f"accuracy_{hop.group(1)}hop" if hop else _TRAINER_NAMES.get(name, name)
            out[f"{split}/{disk}"] = figures[name]
    return out


def canonical(metrics: Mapping[str, Any], split: str | None = None) -> dict[str, Any]:
    """Figures read from any file this package wrote, under `NAMES`: a `pvpo eval` metrics.json
    (`acc` is `cem`) or, with `split` (`eval` / `val`), that split's figures of a training run's
    metrics row (`eval/accuracy` is `em`, ...); keys it does not know pass through unchanged."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if split is not None:
            if not key.startswith(f"{split}/"):
                continue
            key = key.split("/", 1)[1]
        hop = _HOP_ON_DISK.fullmatch(key)
        out[f"em_{hop.group(1)}hop" if hop else ALIASES.get(key, key)] = value
    return out


# ---- FlashRAG's layout (`pvpo eval`'s items and metrics.json) ---------------------------------------
def flashrag_metric_score(score: QuestionScore) -> dict[str, float]:
    """An item's `metric_score` as FlashRAG writes it: `em`, `f1`, `acc` (cover-EM)."""
    return {"em": score.em, "f1": score.f1, "acc": score.cem}


def item_score(item: Mapping[str, Any]) -> QuestionScore:
    """A FlashRAG-layout item's stored scores (`output.metric_score`, `output.format_ok`,
    `output.num_searches`): what `pvpo eval` wrote, or any FlashRAG file (fields it lacks are None,
    a score it lacks 0)."""
    out = item.get("output", {})
    stored = out.get("metric_score", {})
    return QuestionScore(
        em=float(stored.get("em", 0.0)),
        f1=float(stored.get("f1", 0.0)),
        cem=float(stored.get("acc", stored.get("cem", 0.0))),
        format_ok=_opt(out.get("format_ok")),
        searches=_opt(out.get("num_searches")),
    )


def flashrag_summary(figures: Mapping[str, float]) -> dict[str, Any]:
    """`aggregate`'s figures as `pvpo eval`'s metrics.json names them: `n` (an int), `em`, `f1`,
    `acc` (cover-EM), `em_se`, then `format_ok` and `searches` where recorded."""
    out: dict[str, Any] = {"n": int(figures["n"])}
    for name in ("em", "f1", "cem", "em_se", "format_ok", "searches"):
        if name in figures:
            out["acc" if name == "cem" else name] = figures[name]
    return out
