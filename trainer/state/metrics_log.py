"""Per-step metrics: one JSON line per step in `metrics.jsonl`, mirrored to TensorBoard.

On resume the log is cut back to the checkpointed step, so a step that was logged but not
checkpointed before a crash is logged once, when it is redone; a line torn by a crash mid-append
is dropped then (`read_jsonl`). Each append is fsynced, so every step a checkpoint covers is on
disk before that checkpoint is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pvpo.atomic import append_jsonl, atomic_write_jsonl, read_jsonl
from pvpo.trainer.state.run_dir import RunDir


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` (a torn last line dropped, `read_jsonl`), each checked to be
    one step's metrics - an object whose `step` is a whole number - so a line edited or damaged by
    hand is a ValueError naming the file and the row, not a traceback in the code that reads it."""
    rows = read_jsonl(path)
    for k, row in enumerate(rows, 1):
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(
                f'{path}: row {k} ({json.dumps(row)[:60]}) is not a step\'s metrics (an object whose "step" is a '
                "whole number): fix or remove that line"
            )
    return rows


class MetricsLogger:
    """Appends `{"step": s, **metrics}` lines; optional TensorBoard scalars under `<run>/tb`."""

    def __init__(self, run_dir: str | Path, *, resume_step: int = 0, tensorboard: bool = True) -> None:
        self.path = RunDir(run_dir).metrics
        kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
        atomic_write_jsonl(self.path, kept)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                str(RunDir(run_dir).tensorboard), purge_step=resume_step + 1 if resume_step else None
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: _clean(float(v)) for k, v in metrics.items()}}
        append_jsonl(self.path, [row])  # fsynced: a checkpoint never outruns its log
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
