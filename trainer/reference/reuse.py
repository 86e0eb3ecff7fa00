"""A fresh run's reference state taken from an earlier run (`algorithm.anchor.reuse_from`): PVPO's
anchor is static, computed once from the reference policy (arXiv:2508.21104, Sec. 3.2), so the
arms of a sweep that share the warm start and the RL prompts can share it, its Group Sampling
partition and its GT cache instead of each sampling them again."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pvpo.atomic import atomic_write_json
from pvpo.trainer.state.run_dir import RunDir

if TYPE_CHECKING:
    from pvpo.envs.data import QAExample

log = logging.getLogger(__name__)


def reuse_reference(
    source: str | Path, run: RunDir, train_uids: Sequence[str], *, group_sampling: bool, num_rollouts: int
) -> list[str]:
    """Copy `source`'s anchor.json (and, with `group_sampling`, group_sampling.json and gt_cache.json
    where it has them) into `run`; the names copied. ValueError naming the key when `source` has no
    anchor, an anchor of another M (`num_rollouts`), or one that misses some of this run's RL
    prompts (`train_uids`)."""
    src = RunDir(source)
    if not src.anchor.is_file():
        raise ValueError(f"algorithm.anchor.reuse_from={source}: no anchor.json there; give a run that built one")
    stats = json.loads(src.anchor.read_text()).get("stats", {})
    missing = [u for u in train_uids if u not in stats]
    if missing:
        raise ValueError(
            f"algorithm.anchor.reuse_from={source}: its anchor lacks {len(missing)} of this run's {len(train_uids)} "
            f"RL prompts (first: {missing[0]}); reuse an anchor only across runs with the same RL prompts"
        )
    other_m = sorted({int(stats[u]["n"]) for u in train_uids} - {num_rollouts})
    if other_m:
        raise ValueError(
            f"algorithm.anchor.reuse_from={source}: its anchor has M={other_m[0]} reference rollouts a prompt, "
            f"this run asks for algorithm.anchor.num_rollouts={num_rollouts}"
        )
    names = [src.anchor]
    if group_sampling:
        names += [f for f in (src.group_sampling, src.gt_cache) if f.is_file()]
    run.root.mkdir(parents=True, exist_ok=True)
    for f in names:  # without the cost they record: this run did not pay it
        doc = json.loads(f.read_text())
        doc.pop("cost", None)
        atomic_write_json(run.root / f.name, doc)
    return [f.name for f in names]


def reuse_if_asked(algorithm: Any, run: RunDir, train: Sequence[QAExample]) -> None:
    """`reuse_reference` from `algorithm.anchor.reuse_from`, when set, into a fresh run that has no
    anchor yet (a sweep's arms sharing one reference)."""
    source = algorithm.anchor.reuse_from
    if not source or run.anchor.exists():
        return
    copied = reuse_reference(
        source,
        run,
        [q.uid for q in train],
        group_sampling=algorithm.group_sampling.enabled,
        num_rollouts=algorithm.anchor.num_rollouts,
    )
    log.info("reference state from %s: %s", source, ", ".join(copied))
