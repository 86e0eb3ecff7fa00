"""The GT trajectory cache and its filling (PVPO, arXiv:2508.21104): a source's trajectories are
kept when their reward reaches `gt.min_reward`, each prompt gets `gt.attempts` tries, and the
cache (`gt_cache.json`: token ids, loss mask, pi_gt log-probs, reward) makes a resumed run
recompute nothing; a prompt that exhausted its attempts is remembered as failed. Sources are in
`sources.py` / `gt_sources.py`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pvpo.atomic import atomic_write_json
from pvpo.envs.data import QAExample
from pvpo.trainer.reference.gt_registry import GTSource
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.state_files import REDO, read_state_file

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
    # each model turn's [start, end) and the source of its pi_gt (`trajectory.SOURCES`)
    model_turns: list[tuple[int, int, str]] = field(default_factory=list)

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
            [(int(a), int(b), str(src)) for a, b, src in t.model_turns],
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
            model_turns=[(int(a), int(b), str(src)) for a, b, src in self.model_turns],
        )


class GTCache:
    """uid -> GTRecord, plus the uids a source failed on, in a JSON file written atomically;
    `read_only` loads the file and never writes it (a torchrun rank other than the main one)."""

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.read_only = read_only
        self.records: dict[str, GTRecord] = {}
        self.failed: dict[str, int] = {}  # uid -> attempts spent
        self.cost: dict[str, float] = {}  # what the source's attempts cost (`state.cost.add_rollout_cost`)
        if self.path is not None and self.path.exists():
            doc = read_state_file(self.path, fix=REDO)
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"{self.path}: GT cache version {doc.get('version')!r}, expected {FORMAT_VERSION}")
            self.records = {u: GTRecord(**r) for u, r in doc["records"].items()}
            self.failed = {u: int(n) for u, n in doc.get("failed", {}).items()}
            self.cost = {k: float(v) for k, v in doc.get("cost", {}).items()}

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
            "cost": self.cost,
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
    `on_generated` sees every trajectory the source wrote (cost accounting); pi_gt of the kept
    ones is set per model turn by `set_pi_gt` (`set_logprobs`: the reference policy's log-probs).
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
    pi_gt = set_pi_gt([t for _, t in kept], set_logprobs)
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
        **pi_gt,
    }


def set_pi_gt(trajs: Sequence[Trajectory], set_logprobs: Callable[[list[Trajectory]], None] | None) -> dict[str, float]:
    """pi_gt of each model turn (PVPO's ratio denominator for an injected GT trajectory, Sec. 3.3):
    a turn whose log-probs an endpoint reported over the policy's tokenization keeps them; with
    `set_logprobs` (`gt.logprobs: reference`) every other turn takes the reference policy's (a
    trajectory without recorded turns: all of it); without it, the source's own (a local model's
    sampler, a script's pi = 1). A turn without log-probs (an endpoint whose tokens did not line
    up) never keeps its 0.0 placeholders: it needs `set_logprobs`, else a ValueError. Each turn's
    source is relabelled to where its pi_gt came from. Returns the `gt/*` counts: trajectories
    wholly the endpoint's (`logprobs_endpoint`) or partly the reference's (`logprobs_reference`),
    and model turns by source (`turns_<source>`)."""
    need: list[Trajectory] = []
    if set_logprobs is None:
        bare = sum(1 for t in trajs for _, _, src in t.model_turns if src == "")
        if bare:
            raise ValueError(
                f"the GT source returned {bare} model turn(s) without log-probs (an endpoint whose tokens do not "
                "line up with the policy's tokenizer); set algorithm.gt.logprobs=reference"
            )
    else:
        need = [t for t in trajs if not t.model_turns or any(src != "endpoint" for _, _, src in t.model_turns)]
        if need:
            kept = [list(t.old_logprobs) for t in need]
            set_logprobs(need)
            for t, own in zip(need, kept, strict=True):
                for a, b, src in t.model_turns:
                    if src == "endpoint":
                        t.old_logprobs[a:b] = own[a:b]
                t.model_turns = [(a, b, src if src == "endpoint" else "reference") for a, b, src in t.model_turns]
    counts = {
        "gt/logprobs_endpoint": float(sum(1 for t in trajs if t.model_turns and t.logprobs_source == "endpoint")),
        "gt/logprobs_reference": float(len(need)),
    }
    for src in ("endpoint", "reference", "sampler", "script"):
        counts[f"gt/turns_{src}"] = float(sum(1 for t in trajs for _, _, s in t.model_turns if s == src))
    return counts
