"""PVPO's static value anchor: per-prompt mean reward of M reference-policy rollouts.

The anchor is computed once before training (and refreshed on a schedule) by `build_anchor`,
stored per prompt uid in an `AnchorStore`, and handed to the `pvpo` advantage estimator as
`anchors=store.values()`. The store is a JSON file saved atomically after every batch, so an
interrupted build resumes where it stopped. Accuracy over the M rollouts also tells Group
Sampling which prompts the reference policy always or never solves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json
from pvpo.progress import Progress
from pvpo.trainer.state.state_files import REDO, read_state_file

FORMAT_VERSION = 1

RolloutFn = Callable[[list[Any]], list[tuple[str, float, float]]]


@dataclass(frozen=True)
class AnchorStat:
    """Reference statistics of one prompt: mean reward and mean accuracy over `n` rollouts."""

    mean_reward: float
    accuracy: float
    n: int


class AnchorStore:
    """uid -> AnchorStat, backed by a JSON file at `path` (or memory only when `path` is None).

    If `path` exists it is loaded, so constructing a store on the same path resumes a build.
    `computed_at_step` and `source` describe the policy the anchor was computed with: "reference"
    (the frozen initial policy) or "current" (the policy being trained, at `computed_at_step`), the
    two values of `algorithm.anchor.refresh_from`.
    """

    def __init__(self, path: Path | str | None = None, *, source: str = "reference", computed_at_step: int = 0):
        self.path = Path(path) if path is not None else None
        self.source = source
        self.computed_at_step = computed_at_step
        self.num_rollouts: int | None = None
        self._stats: dict[str, AnchorStat] = {}
        self.cost: dict[str, float] = {}  # what the rollouts of these stats cost (`state.cost.add_rollout_cost`)
        if self.path is not None and self.path.exists():
            self._read(self.path)

    # -- mapping-like access ------------------------------------------------------------------

    def get(self, uid: str, default: AnchorStat | None = None) -> AnchorStat | None:
        """The stat of `uid`, or `default` if it has none."""
        return self._stats.get(uid, default)

    def __getitem__(self, uid: str) -> AnchorStat:
        return self._stats[uid]

    def __contains__(self, uid: object) -> bool:
        return uid in self._stats

    def __len__(self) -> int:
        return len(self._stats)

    def __iter__(self) -> Iterator[str]:
        return iter(self._stats)

    def values(self) -> dict[str, float]:
        """uid -> mean reference reward: the `anchors` argument of the pvpo estimator."""
        return {uid: s.mean_reward for uid, s in self._stats.items()}

    def stats(self) -> dict[str, AnchorStat]:
        """A copy of uid -> AnchorStat."""
        return dict(self._stats)

    def is_complete(self, uid: str, num_rollouts: int) -> bool:
        """Whether `uid` already has at least `num_rollouts` reference rollouts."""
        s = self._stats.get(uid)
        return s is not None and s.n >= num_rollouts

    # -- updates ------------------------------------------------------------------------------

    def update(self, uid: str, rewards: Sequence[float], accuracies: Sequence[float]) -> AnchorStat:
        """Add rollouts of `uid` (one reward and one accuracy each); merges with rollouts already
        stored for it, so the stat is the mean over all of them."""
        if len(rewards) != len(accuracies):
            raise ValueError(f"{len(rewards)} rewards but {len(accuracies)} accuracies for uid {uid!r}")
        if not rewards:
            raise ValueError(f"no rollouts given for uid {uid!r}")
        old = self._stats.get(uid)
        n0 = old.n if old else 0
        r0 = old.mean_reward * n0 if old else 0.0
        a0 = old.accuracy * n0 if old else 0.0
        n = n0 + len(rewards)
        stat = AnchorStat(
            mean_reward=(r0 + sum(map(float, rewards))) / n,
            accuracy=(a0 + sum(map(float, accuracies))) / n,
            n=n,
        )
        self._stats[uid] = stat
        return stat

    def reset(self, *, step: int, source: str) -> None:
        """Forget every stat and start an anchor computed at `step` by `source`."""
        self._stats.clear()
        self.computed_at_step = step
        self.source = source
        self.num_rollouts = None
        self.cost = {}

    # -- persistence --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `save` writes."""
        return {
            "version": FORMAT_VERSION,
            "computed_at_step": self.computed_at_step,
            "source": self.source,
            "num_rollouts": self.num_rollouts,
            "stats": {uid: asdict(s) for uid, s in self._stats.items()},
            "cost": dict(self.cost),
        }

    def save(self, path: Path | str | None = None) -> Path:
        """Write the store to `path` (default: its own path) atomically (`pvpo.atomic`)."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("this AnchorStore has no path; pass one to save()")
        target.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write_json(target, self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def load(cls, path: Path | str) -> AnchorStore:
        """Read a store saved by `save`; FileNotFoundError if `path` does not exist."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no anchor store at {path}")
        return cls(path)

    def _read(self, path: Path) -> None:
        doc = read_state_file(path, fix=REDO)
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: anchor store version {doc.get('version')!r}, expected {FORMAT_VERSION}")
        self.computed_at_step = int(doc["computed_at_step"])
        self.source = str(doc["source"])
        self.num_rollouts = doc.get("num_rollouts")
        self._stats = {
            uid: AnchorStat(float(s["mean_reward"]), float(s["accuracy"]), int(s["n"]))
            for uid, s in doc["stats"].items()
        }
        self.cost = {k: float(v) for k, v in doc.get("cost", {}).items()}


def needs_refresh(step: int, refresh_every: int, last_step: int) -> bool:
    """Whether the anchor computed at `last_step` is due for recomputation at `step`
    (every `refresh_every` steps; 0 = never refresh)."""
    if refresh_every < 0:
        raise ValueError(f"refresh_every must be >= 0 (0 = never), got {refresh_every}")
    return refresh_every > 0 and step - last_step >= refresh_every


def build_anchor(
    examples: Sequence[Any],
    rollout_fn: RolloutFn,
    *,
    num_rollouts: int,
    batch_size: int,
    store: AnchorStore,
    step: int = 0,
    source: str | None = None,
    show_progress: bool = True,
) -> AnchorStore:
    """Fill `store` with M=`num_rollouts` reference rollouts for every example (anything with a
    `.uid`), resumably.

    Examples are processed `batch_size` prompts at a time: `rollout_fn` receives each pending
    example repeated once per missing rollout (so up to `batch_size * num_rollouts` items) and
    returns one `(uid, reward, accuracy)` per rollout, in any order. The store is saved after
    every batch (when it has a path). Prompts that already hold `num_rollouts` rollouts are
    skipped, so rerunning after a crash only does the unfinished work. If the store holds an
    anchor from another `step` or `source` (a refresh), it is cleared first. `source` defaults to
    the store's own.
    """
    if num_rollouts < 1 or batch_size < 1:
        raise ValueError(f"num_rollouts and batch_size must be >= 1, got {num_rollouts}, {batch_size}")
    source = source if source is not None else store.source
    if len(store) and (store.computed_at_step != step or store.source != source):
        store.reset(step=step, source=source)
    store.computed_at_step, store.source, store.num_rollouts = step, source, num_rollouts

    seen: set[str] = set()
    pending: list[Any] = []
    for ex in examples:
        if ex.uid in seen:
            continue
        seen.add(ex.uid)
        if not store.is_complete(ex.uid, num_rollouts):
            pending.append(ex)

    bar = Progress(
        total=len(seen),
        initial=len(seen) - len(pending),
        enabled=show_progress,
        desc=f"reference anchor (M={num_rollouts})",
        unit="prompt",
    )
    try:
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            wanted: dict[str, int] = {}
            requests: list[Any] = []
            for ex in chunk:
                have = store.get(ex.uid)
                wanted[ex.uid] = num_rollouts - (have.n if have else 0)
                requests.extend([ex] * wanted[ex.uid])
            results = rollout_fn(requests)
            rewards: dict[str, list[float]] = defaultdict(list)
            accs: dict[str, list[float]] = defaultdict(list)
            for uid, reward, acc in results:
                if uid not in wanted:
                    raise ValueError(f"rollout_fn returned uid {uid!r} that was not in its batch")
                rewards[uid].append(float(reward))
                accs[uid].append(float(acc))
            for uid in wanted:
                if rewards[uid]:
                    store.update(uid, rewards[uid], accs[uid])
            if store.path is not None:
                store.save()
            bar.update(sum(store.is_complete(u, num_rollouts) for u in wanted))
    finally:
        bar.close()
    if store.path is not None and not pending:
        store.save()
    return store
