"""PVPO's Group Sampling (arXiv:2508.21104, Sec. 3.3): filter the training pool by the reference
policy's accuracy over its M anchor rollouts.

Accuracy is read by `group_sampling.metric` (`correctness`): `reward` (default) is the
correctness component of the reward in use (PVPO's `r_acc`, cover-EM or F1; Search-R1's `em`;
ReSearch's `f1`), so a prompt the reference solves every time by the training reward is dropped
even when its exact match is 0; `em`, `cem`, `f1` score the prediction against the gold answers
directly. (Exact match alone would send a prompt the reference solves in long answers to GT.)

- accuracy >= `drop_threshold` (default 1, always solved): dropped, its groups would carry no
  signal and its rollouts are pure cost;
- `gt_threshold` < accuracy < `drop_threshold`: kept as is;
- accuracy <= `gt_threshold` (default 0, never solved): kept, and a ground-truth trajectory is
  injected into its groups (see `pvpo.trainer.reference.gt_cache`), so a weak policy gets a positive
  example; when the GT source fails on it, it is `unavailable` and leaves the pool too (the paper
  removes the currently impossible samples: without GT its groups carry only zero advantages).

The partition is recomputed from the anchor at every refresh and saved (`group_sampling.json`)
with the report of that refresh: PVPO reports 7.6% dropped / 42.6% kept / 49.8% given GT on
MuSiQue with M=5.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json
from pvpo.reward import answer_metrics
from pvpo.trainer.reference.anchor import AnchorStat
from pvpo.trainer.state.state_files import REDO, read_state_file

FORMAT_VERSION = 1
METRICS = ("reward", "em", "cem", "f1")
# the correctness component of each shipped reward, first match wins (pvpo: r_acc; em and
# search_r1_format: em; research_f1: f1); a reward without one is read whole
CORRECTNESS_COMPONENTS = ("r_acc", "em", "f1", "cem")


def correctness(
    reward: float, components: Mapping[str, float], prediction: str | None, golds: Sequence[str], metric: str
) -> float:
    """One rollout's accuracy for Group Sampling by `metric` (module docstring)."""
    if metric == "reward":
        for name in CORRECTNESS_COMPONENTS:
            if name in components:
                return float(components[name])
        return float(reward)
    if metric not in METRICS:
        raise ValueError(f"unknown group sampling metric {metric!r}; known: {', '.join(METRICS)}")
    return float(answer_metrics(prediction, list(golds))[metric])


@dataclass
class Partition:
    """The Group Sampling decision of one anchor, computed at `computed_at_step`."""

    computed_at_step: int
    dropped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # neither dropped nor given GT
    gt: list[str] = field(default_factory=list)
    report: dict[str, float] = field(default_factory=dict)
    unavailable: list[str] = field(default_factory=list)  # of `gt`: the GT source failed on them

    @property
    def pool(self) -> set[str]:
        """The uids that stay in the training pool (kept, and given GT when GT was found)."""
        return set(self.kept) | (set(self.gt) - set(self.unavailable))

    def fractions(self) -> dict[str, float]:
        n = max(1, len(self.dropped) + len(self.kept) + len(self.gt))
        return {
            "gs/dropped_frac": len(self.dropped) / n,
            "gs/kept_frac": len(self.kept) / n,
            "gs/gt_frac": len(self.gt) / n,
        }


def partition(
    uids: Sequence[str],
    stats: Mapping[str, AnchorStat],
    *,
    drop_threshold: float = 1.0,
    gt_threshold: float = 0.0,
    computed_at_step: int = 0,
) -> Partition:
    """Split `uids` (in order, duplicates ignored) by their reference accuracy in `stats`; a uid
    without a stat raises KeyError naming it (the anchor must be complete first)."""
    if not 0.0 <= gt_threshold < drop_threshold <= 1.0:
        raise ValueError(f"need 0 <= gt_threshold < drop_threshold <= 1, got {gt_threshold}, {drop_threshold}")
    out = Partition(computed_at_step)
    eps = 1e-9
    for uid in dict.fromkeys(uids):
        if uid not in stats:
            raise KeyError(f"group sampling: no anchor statistics for uid {uid!r}")
        acc = stats[uid].accuracy
        if acc >= drop_threshold - eps:
            out.dropped.append(uid)
        elif acc <= gt_threshold + eps:
            out.gt.append(uid)
        else:
            out.kept.append(uid)
    return out


def savings(part: Partition, *, rollouts_per_prompt: int, seconds_per_rollout: float) -> dict[str, float]:
    """What the filter saves per pass over the training pool: the rollouts the dropped prompts'
    groups would have cost, and their wall time at the anchor build's measured seconds per rollout."""
    saved = len(part.dropped) * rollouts_per_prompt
    return {"gs/saved_rollouts_per_epoch": float(saved), "gs/saved_s_per_epoch": saved * seconds_per_rollout}


def save_partition(part: Partition, path: str | Path) -> None:
    """Write `part` as JSON atomically (temp file + rename)."""
    atomic_write_json(path, {"version": FORMAT_VERSION, **asdict(part)}, indent=1)


def load_partition(path: str | Path) -> Partition | None:
    """The partition saved at `path`, or None if there is none."""
    path = Path(path)
    if not path.exists():
        return None
    doc: dict[str, Any] = read_state_file(path, fix=REDO)
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: group sampling state version {doc.get('version')!r}, expected {FORMAT_VERSION}")
    return Partition(
        int(doc["computed_at_step"]),
        list(doc["dropped"]),
        list(doc["kept"]),
        list(doc["gt"]),
        {k: float(v) for k, v in doc.get("report", {}).items()},
        list(doc.get("unavailable", [])),
    )
