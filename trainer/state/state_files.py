"""The run's state files (`anchor.json`, `group_sampling.json`, `gt_cache.json`,
`value_model.json`) checked against their layout before anything reads or copies them: a file
cut by a crash or edited by hand is one error naming it and what to do, never a traceback from
deep inside the code that reads it, and never copied over a good one (`checkpoint.restore_state_files`
checks every saved copy before it restores any)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pvpo.atomic import DamagedFileError, read_json

# what to do with a damaged state file of the run dir itself (a checkpoint's copy says which
# checkpoint to resume from instead): the run computes a missing one again
REDO = "delete it and resume: the run computes it again"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Stat(_Doc):
    mean_reward: float
    accuracy: float
    n: int


class AnchorFile(_Doc):
    """`anchor.json` (`pvpo.trainer.reference.anchor.AnchorStore`)."""

    version: int
    computed_at_step: int
    source: str
    num_rollouts: int | None = None
    stats: dict[str, _Stat]
    cost: dict[str, float] = {}


class PartitionFile(_Doc):
    """`group_sampling.json` (`pvpo.trainer.reference.group_sampling.Partition`)."""

    version: int
    computed_at_step: int
    dropped: list[str]
    kept: list[str]
    gt: list[str]
    report: dict[str, float] = {}
    unavailable: list[str] = []


class _GTRecord(_Doc):
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    gt_logprobs: list[float]
    reward: float
    accuracy: float
    prediction: str | None
    num_tool_calls: int
    num_turns: int
    reward_components: dict[str, float] = {}
    model_turns: list[tuple[int, int, str]] = []


class GTCacheFile(_Doc):
    """`gt_cache.json` (`pvpo.trainer.reference.gt_cache.GTCache`)."""

    version: int
    records: dict[str, _GTRecord]
    failed: dict[str, int] = {}
    cost: dict[str, float] = {}


class ValueModelFile(_Doc):
    """`value_model.json` (V0.5's prior, `pvpo.trainer.algorithms.value_model`)."""

    entries: dict[str, tuple[list[float], float]]


LAYOUTS: dict[str, type[_Doc]] = {
    "anchor.json": AnchorFile,
    "group_sampling.json": PartitionFile,
    "gt_cache.json": GTCacheFile,
    "value_model.json": ValueModelFile,
}


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "the document"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {e['msg']}{more}"


def read_state_file(path: str | Path, *, fix: str) -> dict[str, Any]:
    """The JSON document of state file `path` once it matches its layout (by its name; a name
    without one is only read as JSON); a DamagedFileError naming the file, the first bad key and
    `fix` otherwise."""
    path = Path(path)
    doc = read_json(path, fix=fix)
    layout = LAYOUTS.get(path.name)
    if layout is None:
        return doc if isinstance(doc, dict) else {"value": doc}
    if not isinstance(doc, dict):
        raise DamagedFileError(path, f"holds a JSON {type(doc).__name__}, not an object", fix)
    try:
        layout.model_validate(doc)
    except ValidationError as e:
        raise DamagedFileError(path, _first_error(e), fix) from None
    return doc


def check_state_files(paths: Sequence[str | Path], *, fix: str) -> None:
    """`read_state_file` on each of `paths` that exists (DamagedFileError at the first bad one)."""
    for p in map(Path, paths):
        if p.exists():
            read_state_file(p, fix=fix)
