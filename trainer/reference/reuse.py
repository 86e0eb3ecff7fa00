"""A fresh run's reference state taken from an earlier run (`algorithm.anchor.reuse_from`): PVPO's
anchor is static, computed once from the reference policy (arXiv:2508.21104, Sec. 3.2), so the
arms of a sweep that share the warm start and the RL prompts can share it, its Group Sampling
partition and its GT cache instead of each sampling them again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from pvpo.trainer.state.run_dir import RunDir


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
    for f in names:
        shutil.copyfile(f, run.root / f.name)
    return [f.name for f in names]
