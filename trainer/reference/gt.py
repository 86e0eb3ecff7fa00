"""The GT trajectory cache and its filling (PVPO, arXiv:2508.21104): a source's trajectories are
kept when their reward reaches `gt.min_reward`, each prompt gets `gt.attempts` tries, and the
cache (`gt_cache.json`: token ids, loss mask, pi_gt log-probs, reward) makes a resumed run
recompute nothing; a prompt that exhausted its attempts is remembered as failed. Sources are in
`sources.py` / `gt_sources.py`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pvpo.atomic import atomic_write_json
from pvpo.envs.data import QAExample
from pvpo.trainer.reference.sources import GTSource
from pvpo.trainer.rollout.trajectory import Trajectory

FORMAT_VERSION = 1


@dataclass
class GTRecord:
    """One cached GT trajectory: ids, loss mask and pi_gt per response token, and its outcome."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    gt_logprobs: list[float]
    reward: float
    accuracy: float
    prediction: str | None
    num_tool_calls: int
    num_turns: int
    reward_components: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> GTRecord:
        return cls(
            list(t.prompt_ids),
            list(t.response_ids),
            list(t.loss_mask),
            list(t.old_logprobs),
            t.reward,
            t.accuracy,
            t.prediction,
            t.num_tool_calls,
            t.num_turns,
            dict(t.reward_components),
        )

    def trajectory(self, uid: str) -> Trajectory:
        """A fresh injected trajectory: `is_gt`, with pi_gt as its ratio denominator."""
        return Trajectory(
            uid,
            list(self.prompt_ids),
            list(self.response_ids),
            list(self.loss_mask),
            list(self.gt_logprobs),
            self.reward,
            dict(self.reward_components),
            self.accuracy,
            self.prediction,
            self.num_tool_calls,
            self.num_turns,
            "gt",
            is_gt=True,
            gt_logprobs=list(self.gt_logprobs),
        )


class GTCache:
    """uid -> GTRecord, plus the uids a source failed on, in a JSON file written atomically;
    `read_only` loads the file and never writes it (a torchrun rank other than the main one)."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.read_only = read_only
        self.records: dict[str, GTRecord] = {}
        self.failed: dict[str, int] = {}  # uid -> attempts spent
        if self.path is not None and self.path.exists():
            doc = json.loads(self.path.read_text())
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"{self.path}: GT cache version {doc.get('version')!r}, expected {FORMAT_VERSION}")
            self.records = {u: GTRecord(**r) for u, r in doc["records"].items()}
            self.failed = {u: int(n) for u, n in doc.get("failed", {}).items()}

    def __contains__(self, uid: object) -> bool:
        return uid in self.records

    def __len__(self) -> int:
        return len(self.records)

    def save(self) -> None:
        if self.path is None or self.read_only:
            return
        doc = {
            "version": FORMAT_VERSION,
            "records": {u: asdict(r) for u, r in self.records.items()},
            "failed": self.failed,
        }
        atomic_write_json(self.path, doc)


def fetch_gt(
    examples: Sequence[QAExample],
    source: GTSource,
    cache: GTCache,
    *,
    attempts: int,
    min_reward: float,
    on_generated: Callable[[list[Trajectory]], None] | None = None,
    set_logprobs: Callable[[list[Trajectory]], None] | None = None,
) -> dict[str, float]:
    """Fill `cache` for every example that has no GT trajectory yet (and has not failed before):
    up to `attempts` tries each, keeping the first whose reward reaches `min_reward`.
    `on_generated` sees every trajectory the source wrote (cost accounting); `set_logprobs`
    replaces the kept ones' `old_logprobs` with pi_gt when pi_gt is not the source's own (except
    where the source is an endpoint that reported its log-probs: `logprobs_source="endpoint"`).
    Returns `gt/*` counts of this call."""
    pending = [
        ex for ex in dict((e.uid, e) for e in examples).values() if ex.uid not in cache and ex.uid not in cache.failed
    ]
    asked = len(pending)
    kept: list[tuple[str, Trajectory]] = []
    tries = 0
    attempts = 1 if getattr(source, "deterministic", False) else attempts
    for attempt in range(attempts):
        if not pending:
            break
        trajs = source.generate(pending, attempt=attempt)
        tries += len(pending)
        made = [t for t in trajs if t is not None]
        if on_generated is not None:
            on_generated(made)
        good = {
            ex.uid: t for ex, t in zip(pending, trajs, strict=True) if t is not None and t.reward >= min_reward - 1e-9
        }
        kept += list(good.items())
        pending = [ex for ex in pending if ex.uid not in good]
    # pi_gt: the source's own log-probs where it reported them (an endpoint that returns them
    # over the policy's tokenization), the reference's for the rest
    own = [t for _, t in kept if t.logprobs_source == "endpoint"]
    fallback = [t for _, t in kept if t.logprobs_source != "endpoint"]
    if set_logprobs is not None and fallback:
        set_logprobs(fallback)
    for uid, t in kept:
        t.check()
        cache.records[uid] = GTRecord.from_trajectory(t)
    for ex in pending:
        cache.failed[ex.uid] = attempts
    cache.save()
    return {
        "gt/asked": float(asked),
        "gt/generated": float(len(kept)),
        "gt/failed": float(len(pending)),
        "gt/attempts": float(tries),
        "gt/cached": float(len(cache)),
        "gt/logprobs_endpoint": float(len(own)),  # kept trajectories whose pi_gt is the endpoint's
        "gt/logprobs_reference": float(len(fallback) if set_logprobs is not None else 0),
    }
