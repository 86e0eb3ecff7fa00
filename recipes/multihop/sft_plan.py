"""How many SFT steps the compute-matched SFT arm (`pvpo recipe sft-arm`) takes: the mean RL phase
of the RL runs it is compared with, over one warm-start SFT step's seconds on the machine that ran
both, written once to OUT/plan.json (a later call with other runs is refused), so the count is a
measurement of that machine, not a constant.

The RL phase of a run is the sum over its `metrics.jsonl` rows of the step's rollouts and update
(`time/rollout_s`, `time/train_s`) and the reference work before it (`time/anchor_s`,
`time/group_sampling_s`); evaluations are left out (both arms are evaluated alike). One SFT step's
time is the recipe run's warm start's: its SFT seconds (`warm_start.json`'s `sft_seconds`) over its
steps."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pvpo.atomic import atomic_write_json, read_jsonl
from pvpo.recipes.multihop.runs import recipe_config, run_finished
from pvpo.stats import mean

# the RL phase of a run: each step's rollouts and update, and the reference work before it
RL_PHASE_KEYS = ("time/rollout_s", "time/train_s", "time/anchor_s", "time/group_sampling_s")


def rl_phase_seconds(run_dir: Path) -> float:
    """The RL phase's wall time of a finished run (module docstring): the sum over its metrics
    rows of `RL_PHASE_KEYS`, evaluations left out."""
    if not run_finished(run_dir):
        raise ValueError(f"--match-wall-of {run_dir}: no finished demo run there (summary.md, held_out_em.json)")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if not rows or not any("time/train_s" in r for r in rows):
        raise ValueError(f"--match-wall-of {run_dir}: its metrics.jsonl has no RL step's timings (time/train_s)")
    return sum(float(r.get(k) or 0.0) for r in rows for k in RL_PHASE_KEYS)


_WALL_ROW = re.compile(
    r"\| wall time \(s\): total / index\+serve / warm start / RL\+eval \| [\d.]+ / [\d.]+ / ([\d.]+) /"
)


def sft_step_seconds(recipe_run: Path) -> tuple[float, str]:
    """One warm-start SFT step's seconds on the machine that ran `recipe_run`, and where they were
    read: `warm_start.json`'s `sft_seconds` over its steps; for a run written before that record,
    the summary's warm-start wall time over its steps (writing the GT trajectories included: an
    upper bound, so the arm gets at most its share of steps)."""
    ws = json.loads((recipe_run / "warm_start.json").read_text())
    steps = len(ws.get("losses", []))
    if not steps:
        raise ValueError(f"--recipe-run {recipe_run}: its warm_start.json records no warm-start step")
    if ws.get("sft_seconds"):
        return float(ws["sft_seconds"]) / steps, f"warm_start.json: {ws['sft_seconds']:.0f} s of SFT over {steps} steps"
    summary = recipe_run / "summary.md"
    found = _WALL_ROW.search(summary.read_text()) if summary.is_file() else None
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(
            f"--recipe-run {recipe_run}: neither warm_start.json's sft_seconds nor the summary's warm-start wall "
            "time (a run resumed past its warm start keeps neither): rerun the recipe"
        )
    wall = float(found.group(1))
    return wall / steps, f"summary.md: {wall:.0f} s of warm start (GT trajectories written included) over {steps} steps"


def plan(recipe_run: Path, rl_runs: Sequence[Path]) -> dict[str, Any]:
    """The arm's step count and what it was derived from (module docstring): the RL phase of each
    of `rl_runs`, their mean, one SFT step's seconds and where they were read, the warm start's
    own steps, seed, batch size and learning rate (what the continuation skips and repeats)."""
    cfg = recipe_config(recipe_run)
    phases = {str(r): rl_phase_seconds(r) for r in rl_runs}
    start = (recipe_run / "initial_policy").resolve()
    for r in rl_runs:
        path = Path(str(yaml.safe_load((r / "config.yaml").read_text())["model"]["path"]))
        if r.resolve() != recipe_run.resolve() and path.resolve() != start:
            raise ValueError(
                f"--match-wall-of {r}: it started from {path}, not from {start} (the warm start continued)"
            )
    step_s, source = sft_step_seconds(recipe_run)
    rl_s = mean(list(phases.values()))
    m = cfg["model"]
    if not m.get("warm_start_steps"):
        raise ValueError(
            f"--recipe-run {recipe_run}: it ran no warm start (model.warm_start_steps=0): nothing to continue"
        )
    return {
        "steps": max(1, round(rl_s / step_s)),
        "rl_phase_s": phases,
        "rl_phase_mean_s": rl_s,
        "sft_step_s": step_s,
        "sft_step_source": source,
        "warm_start": {
            "steps": int(m["warm_start_steps"]),
            "seed": int(cfg["run"]["seed"]),
            "batch_size": int(m["warm_start_batch_size"]),
            "lr": float(m["warm_start_lr"]),
        },
    }


def fixed_plan(out: Path, new: dict[str, Any]) -> dict[str, Any]:
    """`new`, written to OUT/plan.json the first time; later calls must derive the same step count
    (the seeds of one arm take one count): another is refused naming the file."""
    path = out / "plan.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old["steps"] != new["steps"]:
            raise ValueError(
                f"{path}: planned {old['steps']} SFT steps from {', '.join(old['rl_phase_s'])}; these runs give "
                f"{new['steps']}: give the same --match-wall-of runs, or another --out"
            )
        return dict(old)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, new)
    return new
