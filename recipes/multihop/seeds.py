"""`pvpo recipe seeds`: RL's gain over the warm start over several RL seeds from one warm start. The
recipe's own run is the first seed; each further seed is the recipe's RL phase again from that
run's saved warm start (`initial_policy`), with `run.seed` changed and nothing else (the same config
file, splits, index and settings), run as a child `pvpo demo` into OUT/seed_<k>.

The recipe run is a finished `pvpo demo --config real_smollm2_multihop ...` in held-out mode
(`data.evaluate_on: held_out`, the default), or in validation mode (the seeds then evaluate the
validation questions, for choosing a setting, and the held-out set is left alone). The report
(OUT/results.md, `seeds_report`) gives per seed RL - warm start and the mean over the seeds, per
dataset too, and, where the runs kept validation points with each question's EM
(`run.eval_every`), the validation EM by RL step.

`reproduce` evaluates the warm start and each seed's final policy again with `pvpo eval` and counts
the questions whose EM differs from its run's. `held_out_once` (a validation-mode recipe run, once
its setting is chosen on validation) evaluates the base model, the warm start and each seed's final
policy on the held-out questions, kept under OUT/held_out and never evaluated again, into
OUT/held_out.md.

The seeds start from the recipe run's warm start, so they may run while the recipe run's own RL
goes on (on another core); the report waits for it. A finished seed run is kept, a killed one
resumes from its last checkpoint."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.machine import machine_line
from pvpo.recipes.multihop.evaluate import evaluate_once, reproduce, run_child
from pvpo.recipes.multihop.runs import (
    SPLITS,
    base_model,
    final_policy,
    load_curve,
    load_seed,
    question_ids,
    recipe_config,
    run_finished,
    split_of,
)
from pvpo.recipes.multihop.seeds_report import curve_table, report

PACKAGES = ("torch", "transformers", "vllm")  # the versions each report's machine line gives


def seed_overrides(recipe_run: Path, seed: int) -> list[str]:
    """The recipe's RL phase again from `recipe_run`'s warm start with `run.seed=seed`: the saved
    policy, no SFT, no base-model evaluation, the run's own index."""
    return [
        f"model.path={recipe_run / 'initial_policy'}",
        "model.warm_start_steps=0",
        "run.eval_base=false",
        f"run.seed={seed}",
        f"retriever.index_dir={recipe_run / 'index'}",
    ]


def run_seed(recipe_run: Path, seed: int, out: Path) -> Path:
    """Seed `seed`'s run under OUT/seed_<seed> (kept when finished, resumed when killed); its wall
    seconds written to its `bench_wall_s.txt`."""
    run_dir = out / f"seed_{seed}"
    if run_finished(run_dir):
        print(f"[seed {seed}] finished earlier, kept", flush=True)
        return run_dir
    resume = (run_dir / "checkpoints" / "latest").exists()
    cmd = [sys.executable, "-m", "pvpo.cli", "demo", "--config", str(recipe_run / "config.yaml")]
    cmd += ["--run-dir", str(run_dir), *(["--resume"] if resume else []), *seed_overrides(recipe_run, seed)]
    print(f"[seed {seed}] {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    run_child(cmd, f"RL seed {seed} (pvpo demo into {run_dir})")
    (run_dir / "bench_wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return run_dir


def held_out_once(recipe_run: Path, seeds: Sequence[int], dirs: Sequence[Path], out: Path) -> list[dict[str, Any]]:
    """The held-out questions of a validation-mode recipe run, evaluated once for the chosen setting:
    `pvpo eval` of the base model, the warm start and each seed's final policy on the run's
    held_out.jsonl, against a loopback server of its index (the one index every split searches).
    An evaluation already under OUT/held_out/<label> is read, never run again. One record per seed
    in `load_seed`'s shape (questions, EM before = warm start, after, base; format_ok after)."""
    cfg = recipe_config(recipe_run)
    if split_of(cfg) != "validation":
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own table is the held-out one")
    questions = recipe_run / SPLITS["held_out"][1]
    todo = [("base", base_model(cfg)), ("warm", recipe_run / "initial_policy")]
    todo += [(f"seed_{s}", final_policy(d)) for s, d in zip(seeds, dirs)]
    found = evaluate_once(recipe_run, [(label, m, out / "held_out" / label) for label, m in todo], questions)
    answers = {label: got for (label, _), got in zip(todo, found)}
    ids = question_ids(questions)

    def col(label: str, key: str = "em") -> list[float]:
        return [answers[label][q][key] for q in ids]

    return [
        {
            "questions": ids,
            "em": {"before": col("warm"), "after": col(f"seed_{s}"), "base": col("base")},
            "scores": {"after": [{"format_ok": f} for f in col(f"seed_{s}", "format_ok")]},
        }
        for s in seeds
    ]


def parse_seeds(text: str, own: int) -> list[int]:
    """The further RL seeds of `--seeds` ("1,2"): each once, none equal to the recipe run's `own`."""
    try:
        extra = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text}: give whole numbers, comma-separated (e.g. 1,2)") from None
    if own in extra or len(set(extra)) != len(extra):
        raise ValueError(f"--seeds {text}: give each seed once, none equal to the recipe run's own seed {own}")
    return extra


def seeds_recipe(
    recipe_run: Path,
    seeds_text: str,
    out: Path,
    *,
    report_only: bool,
    again: bool,
    held_out: bool,
    command: str,
) -> int:
    """Run the further seeds (unless `report_only`), then write OUT/results.md; with `again`, the
    `reproduce` lines after it; with `held_out`, OUT/held_out.md (`held_out_once`). Returns 0, and
    leaves the report for later when only the recipe run itself is still running."""
    # running seeds needs the recipe's warm start only; the report needs the recipe run finished
    cfg = recipe_config(recipe_run, warm_start_only=not report_only)
    own = int(cfg["run"]["seed"])
    extra = parse_seeds(seeds_text, own)
    if held_out and split_of(cfg) != "validation":
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own table is the held-out one")
    out.mkdir(parents=True, exist_ok=True)
    dirs = [recipe_run] + [(out / f"seed_{s}") if report_only else run_seed(recipe_run, s, out) for s in extra]
    unfinished = [str(d) for d in dirs if not run_finished(d)]
    if unfinished == [str(recipe_run)] and not report_only:
        print(f"the seeds are done; {recipe_run} is still running: --report-only once it ends", flush=True)
        return 0
    if unfinished:
        raise ValueError(f"unfinished seed runs: {', '.join(unfinished)}; run without --report-only")
    seeds = [own, *extra]
    machine = machine_line(PACKAGES)
    text = report(seeds, [load_seed(d) for d in dirs], command=command, machine=machine, split=SPLITS[split_of(cfg)][0])
    curves = [load_curve(d) for d in dirs]
    if all(c is not None for c in curves):  # validation points with per-question EM (run.eval_every)
        text += "\n".join(curve_table(seeds, [c for c in curves if c is not None])) + "\n"
    if again:
        todo = [("warm", recipe_run / "initial_policy", dirs[0], "before")]
        todo += [(f"seed_{s}", final_policy(d), d, "after") for s, d in zip(seeds, dirs)]
        text += "\n" + "\n".join(reproduce(recipe_run, todo, out)) + "\n"
    (out / "results.md").write_text(text)
    print(text)
    if held_out:
        records = held_out_once(recipe_run, seeds, dirs, out)
        held = report(
            seeds, records, command=command, machine=machine, split="held-out, evaluated once with `pvpo eval`"
        )
        (out / "held_out.md").write_text(held)
        print(held)
    return 0
