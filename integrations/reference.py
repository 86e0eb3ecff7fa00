"""PVPO's reference products as another trainer reads them: the static anchor (per-prompt mean
reward of M reference rollouts, arXiv:2508.21104 Sec. 3.2) and the Group Sampling partition
(Sec. 3.3), in the JSON files `pvpo train` writes (`pvpo.trainer.reference.anchor`,
`pvpo.trainer.reference.group_sampling`); no other trainer module is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pvpo.trainer.reference.anchor import AnchorStore
from pvpo.trainer.reference.group_sampling import Partition
from pvpo.trainer.reference.group_sampling import load_partition as _load_partition

AnchorSource = str | Path | Mapping[str, float] | AnchorStore
Missing = Literal["error", "group_mean"]
Row = TypeVar("Row")


def load_anchors(source: AnchorSource) -> dict[str, float]:
    """uid -> mean reference reward, from an anchor file (`anchor.json` of a `pvpo train` run, or
    any `AnchorStore.save`), an `AnchorStore`, or a mapping of uid to value."""
    if isinstance(source, AnchorStore):
        return source.values()
    if isinstance(source, Mapping):
        return {str(uid): float(value) for uid, value in source.items()}
    return AnchorStore.load(source).values()


def load_partition(path: str | Path) -> Partition:
    """The Group Sampling partition saved at `path` (`group_sampling.json` of a `pvpo train` run)."""
    part = _load_partition(path)
    if part is None:
        raise FileNotFoundError(f"no Group Sampling partition at {path}; `pvpo train` writes group_sampling.json")
    return part


def uid_of(row: Any) -> str:
    """The prompt uid of a QAExample (`.uid`) or of a dataset row (`row["uid"]`)."""
    uid = row.get("uid") if isinstance(row, Mapping) else getattr(row, "uid", None)
    if uid is None:
        raise KeyError(f"row has no uid: {str(row)[:200]}")
    return str(uid)


def training_pool(
    rows: Iterable[Row], partition: Partition | str | Path | None, *, uid: Callable[[Row], str] = uid_of
) -> list[Row]:
    """`rows` (their prompt uid read by `uid`) without the prompts Group Sampling dropped (the reference policy always solves them,
    so their groups carry no signal and their rollouts are pure cost). The prompts it marks for a
    ground-truth trajectory stay in the pool: injecting that trajectory needs the trainer's own
    loss (`pvpo train`), which TRL and verl do not expose."""
    if partition is None:
        return list(rows)
    part = partition if isinstance(partition, Partition) else load_partition(partition)
    dropped = set(part.dropped)
    return [row for row in rows if uid(row) not in dropped]


def anchor_for(uid: str, anchors: Mapping[str, float]) -> float:
    """The anchor of `uid`; KeyError naming it and the fix when the anchor has none."""
    try:
        return float(anchors[uid])
    except KeyError:
        raise KeyError(
            f"pvpo: no reference anchor for uid {uid!r}; build the anchor over the training prompts first "
            "(`pvpo train` writes anchor.json, or PVPOGRPOTrainer(anchor_rollouts=M) in TRL)"
        ) from None
