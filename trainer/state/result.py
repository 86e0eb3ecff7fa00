"""What `pvpo train` returns: the run's steps and metrics, its held-out evaluations (before and
after RL, before the warm start) with each question's scores, the warm start's losses and the
validation curve."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainResult:
    """A training run's outcome (`loop.train`, `Trainer.run`)."""

    run_dir: Path
    steps_done: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    warm_start_losses: list[float] = field(default_factory=list)
    warm_start_seconds: float = 0.0
    eval_em: dict[str, list[float]] = field(default_factory=dict)  # evaluation tag -> each question's EM (one process)
    eval_scores: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # tag -> each question's scores
    eval_base: dict[str, float] = field(default_factory=dict)  # before the warm start (run.eval_base)
    resumed_from: int = 0  # the checkpoint's step this process resumed from; 0 for a fresh run
    validation: dict[str, Any] = field(default_factory=dict)  # run.eval_every's curve and best step (best.json)
