"""The run's validation curve and its best point (`checkpoints/best.json`): every validation
evaluation's EM by step, the step with the highest EM, and the checkpoint kept for it.

A run with `run.eval_every` and a validation split evaluates the validation questions before RL
and every `eval_every` steps; when an evaluation beats every earlier one (strictly: a tie keeps the
earlier, cheaper policy) the step is checkpointed and named here, and checkpoint pruning keeps that
checkpoint beside the newest ones (`checkpoint.prune_checkpoints`). Step 0 is the policy RL started
from (`initial_policy`, or `model.path` without a warm start): no checkpoint is kept for it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json

BEST_FILE = "best.json"


class BestFileError(ValueError):
    """A `best.json` that cannot be read; the message names the file (pvpo's one-line error, rc 2)."""


@dataclass
class ValidationCurve:
    """Validation EM by step, and the best step so far."""

    points: list[dict[str, Any]] = field(default_factory=list)  # {"step", "accuracy", "accuracy_se", "n"[, "em"]}
    questions: list[str] = field(default_factory=list)  # the validation uids, the order of each point's "em"
    best_step: int | None = None
    best_accuracy: float = -math.inf
    best_checkpoint: str | None = None  # the step folder under checkpoints/ (None for step 0)

    def record(
        self, step: int, metrics: dict[str, float], em: list[float] | None = None, prefix: str = "val/"
    ) -> bool:
        """Add the evaluation of `step` (`<prefix>accuracy`, `_se`, `n` of `metrics`; `em`: each
        question's EM in `questions`' order, for paired comparisons between steps and runs); whether
        it is the best so far (strictly higher EM than every earlier point)."""
        acc = float(metrics[f"{prefix}accuracy"])
        self.points = [p for p in self.points if int(p["step"]) != step]  # a resumed run re-evaluates a step
        point: dict[str, Any] = {
            "step": float(step),
            "accuracy": acc,
            "accuracy_se": float(metrics.get(f"{prefix}accuracy_se", 0.0)),
            "n": float(metrics.get(f"{prefix}n", 0.0)),
        }
        if em:
            point["em"] = [float(x) for x in em]
        self.points.append(point)
        if acc > self.best_accuracy:
            self.best_step, self.best_accuracy, self.best_checkpoint = step, acc, None
            return True
        return False

    def kept(self, step: int, checkpoint: str | None) -> None:
        """The checkpoint folder saved for the best `step`."""
        if step == self.best_step:
            self.best_checkpoint = checkpoint

    def to_json(self) -> dict[str, Any]:
        return {
            "best": None
            if self.best_step is None
            else {"step": self.best_step, "accuracy": self.best_accuracy, "checkpoint": self.best_checkpoint},
            "points": self.points,
            "questions": self.questions,
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, self.to_json(), indent=1)

    @classmethod
    def from_json(cls, data: Any) -> ValidationCurve:
        """The curve `to_json` gave (ValueError, KeyError or TypeError when `data` is not one)."""
        points: list[dict[str, Any]] = []
        for p in data["points"]:
            point: dict[str, Any] = {k: float(p[k]) for k in ("step", "accuracy", "accuracy_se", "n")}
            if "em" in p:
                point["em"] = [float(x) for x in p["em"]]
            points.append(point)
        curve = cls(points, [str(q) for q in data.get("questions", [])])
        best = data["best"]
        if best is not None:
            curve.best_step, curve.best_accuracy = int(best["step"]), float(best["accuracy"])
            curve.best_checkpoint = best["checkpoint"] if isinstance(best["checkpoint"], str) else None
        return curve

    @classmethod
    def load(cls, path: Path) -> ValidationCurve:
        """The curve saved at `path`; an empty one when the file is missing."""
        if not path.exists():
            return cls()
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise BestFileError(
                f"{path}: not a validation record written by pvpo ({type(e).__name__}: {e}); remove it to start the "
                "record afresh (the best checkpoint is then chosen from the evaluations after the resume)"
            ) from None


def best_checkpoint_name(checkpoints: Path) -> str | None:
    """The step folder `checkpoints/best.json` names (kept by pruning), None when there is none.
    Raises BestFileError when the file is damaged (pruning then deletes nothing)."""
    return ValidationCurve.load(checkpoints / BEST_FILE).best_checkpoint
