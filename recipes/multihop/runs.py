"""What the multi-hop recipe's commands read from finished runs: a recipe run's config and the split
it evaluated, whether a run finished, its per-question EM before and after RL, its validation curve,
its final policy, the base model under its warm start, and a `pvpo eval` folder's answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

# a recipe run's evaluated split: (its name in the report, the questions file the run wrote)
SPLITS = {"held_out": ("held-out", "held_out.jsonl"), "validation": ("validation", "validation.jsonl")}


def run_finished(run_dir: Path) -> bool:
    """A demo run that wrote its summary and per-question EM."""
    return (run_dir / "summary.md").is_file() and (run_dir / "held_out_em.json").is_file()


def split_of(cfg: dict[str, Any]) -> str:
    """The split a recipe run evaluated before and after RL (`data.evaluate_on`)."""
    return str(cfg["data"].get("evaluate_on", "held_out"))


def recipe_config(recipe_run: Path, *, warm_start_only: bool = False) -> dict[str, Any]:
    """The recipe run's resolved config (its config.yaml), checked to be a finished run of a known
    split; with `warm_start_only`, a run past its warm start (the seeds need only its saved policy,
    config and index, so they can start while its own RL phase runs beside them)."""
    if not warm_start_only and not run_finished(recipe_run):
        raise ValueError(f"--recipe-run {recipe_run}: no finished demo run there (summary.md, held_out_em.json)")
    if warm_start_only and not (recipe_run / "config.yaml").is_file():
        raise ValueError(f"--recipe-run {recipe_run}: no demo run there (config.yaml)")
    if not (recipe_run / "initial_policy" / "config.json").is_file():
        raise ValueError(f"--recipe-run {recipe_run}: no initial_policy (the warm start) to start the seeds from")
    cfg = yaml.safe_load((recipe_run / "config.yaml").read_text())
    if split_of(cfg) not in SPLITS:
        raise ValueError(f"--recipe-run {recipe_run}: evaluated on {split_of(cfg)!r}; known: {', '.join(SPLITS)}")
    return dict(cfg)


def load_seed(run_dir: Path) -> dict[str, Any]:
    """A finished run's record of the split it evaluated (`held_out_em.json`): questions, each
    question's EM by stage (`before` = the warm start, `after` RL, `base`), its scores by stage."""
    rec = json.loads((run_dir / "held_out_em.json").read_text())
    return {"questions": rec["questions"], "em": rec["em"], "scores": rec.get("scores", {})}


def load_curve(run_dir: Path) -> dict[str, Any] | None:
    """A run's validation curve with each question's EM (`checkpoints/best.json`, written with
    `run.eval_every` on a validation split): its questions, and by step the EM of each in that
    order; None when the run kept none."""
    path = run_dir / "checkpoints" / "best.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    points = {int(p["step"]): [float(x) for x in p["em"]] for p in data["points"] if "em" in p}
    return {"questions": list(data.get("questions", [])), "points": points} if points else None


def final_policy(run_dir: Path) -> Path:
    """The policy of a finished run's last checkpoint (`checkpoints/latest`)."""
    from pvpo.trainer.state.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir}: no checkpoint")
    return ckpt / "policy"


def base_model(cfg: dict[str, Any]) -> Path:
    """The base model under a recipe run's warm start: its `model.path`, or, where that is another
    run's saved policy (a run started from a finished run's `initial_policy` or checkpoint with its
    own config.yaml beside it, as an arm from a shared warm start is), that run's base, followed back."""
    path = Path(str(cfg["model"]["path"]))
    seen: set[Path] = set()
    while (path / "config.json").is_file():  # a saved model folder (a catalog name is not one)
        # a run's initial_policy sits in the run's folder, a checkpoint's policy three levels down
        origin = next((d for d in path.parents[:3] if (d / "config.yaml").is_file()), None)
        if origin is None or origin in seen:
            break
        seen.add(origin)
        path = Path(str(yaml.safe_load((origin / "config.yaml").read_text())["model"]["path"]))
    return path


def read_predictions(folder: Path) -> dict[str, dict[str, float]]:
    """A finished `pvpo eval` output folder's answers: per question id, its EM and format_ok."""
    got: dict[str, dict[str, float]] = {}
    for path in folder.glob("*/predictions.jsonl"):
        for row in map(json.loads, path.read_text().splitlines()):
            out = row["output"]
            got[str(row["id"])] = {"em": float(out["metric_score"]["em"]), "format_ok": float(out["format_ok"])}
    return got


def question_ids(questions: Path) -> list[str]:
    """The ids of a questions file a run wrote (`held_out.jsonl`, `validation.jsonl`), in order."""
    return [str(json.loads(line)["id"]) for line in questions.read_text().splitlines() if line.strip()]
