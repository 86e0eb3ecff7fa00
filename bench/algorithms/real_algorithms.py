"""PVPO + Group Sampling vs GRPO on the real model and real questions (the algorithm
benchmark's smaller comparison), from one warm-started policy, at an equal rollout budget.

Both arms start from the same policy (the real-data recipe's `initial_policy`: SmolLM2-135M-Instruct
after SFT on dataset GT), train on the same RL prompts for the same steps, and are evaluated
greedily on the same held-out questions (the recipe's split: same files, same `shuffle_seed`).
Equal cost, all-in: PVPO+GS at N=2 spends 2 anchor rollouts on each of its prompts once, plus
N=2 per prompt and step (the GT it injects comes from the dataset, not the model); GRPO at N=4
spends 4 per prompt and step. With 8 steps of 4 prompts over 32 prompts both generate 128 rollouts
(PVPO fewer, one per group it gives a GT trajectory). Tool calls are reported beside, measured.

    python bench/algorithms/real_algorithms.py --start /tmp/real1/initial_policy --out runs/real_algorithms \\
        --data ../shared/data/hotpotqa_mini/questions.json ../shared/data/musique_mini/questions.json

An arm may carry config overrides of its own (`--arms "pvpo+gs:4,pvpo+gs:4:optim.lr=5e-5,
pvpo+gs:4:optim.kl_coef=0.05"`): the recipe's learning rate, KL term or step count against its own
setting, from the same start, on the same questions.

Each arm is a `pvpo demo` run of the recipe config under OUT/<arm>/ (skipped when it finished
earlier: resumable); the report, OUT/results.md, compares the arms' per-question held-out EM
(`held_out_em.json`) with paired standard errors. With one RL seed per arm the s.e. is over questions
only, stated as the power; `--seeds 0 1 2` trains each arm once per seed (seed 0 under OUT/<arm>,
seed k under OUT/seed<k>/<arm>) and the report's EM is the mean over seeds, its s.e. counting the
seeds' spread (`pvpo.stats.seeds_difference`, `seeds_contrast`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pvpo.machine import machine_line
from pvpo.stats import mean, paired_difference, seeds_contrast, seeds_difference, standard_error

CONFIG = "real_smollm2_multihop"
DEFAULT_ARMS = "pvpo+gs:2,grpo:4"
ESTIMATORS = {"pvpo+gs": ("pvpo", True), "pvpo": ("pvpo", False), "grpo": ("grpo", False), "rloo": ("rloo", False)}


def is_override(text: str) -> bool:
    """`key.sub=value` with a non-empty value (the shape `pvpo demo` overrides take)."""
    return re.fullmatch(r"[A-Za-z_][\w.]*=\S+", text) is not None


@dataclass(frozen=True)
class Arm:
    """One estimator at one group size, with optional config overrides of its own (a learning
    rate, a KL coefficient, more steps: the recipe's other knobs)."""

    algorithm: str
    n: int
    extra: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        tail = "".join(f"_{k.rsplit('.', 1)[-1]}{v}" for k, _, v in (e.partition("=") for e in self.extra))
        return f"{self.algorithm}_n{self.n}{tail}"

    @property
    def label(self) -> str:
        return " ".join([f"{self.algorithm} N={self.n}", *self.extra])


def parse_arms(spec: str) -> list[Arm]:
    """`"pvpo+gs:4,pvpo+gs:4:optim.lr=5e-5,grpo:4"` -> arms (`algorithm:N[:key=value...]`); a name
    outside `ESTIMATORS`, a bad N, an override without `=` or two arms of one name are refused."""
    arms = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        algo, n, *extra = [x.strip() for x in part.split(":")] + ([""] if ":" not in part else [])
        if algo not in ESTIMATORS:
            raise ValueError(f"--arms: unknown algorithm {algo!r}; options: {', '.join(ESTIMATORS)}")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--arms: {part!r} needs a group size, e.g. {algo}:4")
        bad = [e for e in extra if not is_override(e)]
        if bad:
            raise ValueError(f"--arms: {part!r}: {bad[0]!r} is not a key=value override (e.g. optim.lr=5e-5)")
        arms.append(Arm(algo, int(n), tuple(extra)))
    if len(arms) < 2:
        raise ValueError(f"--arms {spec!r}: give at least two arms to compare")
    names = [a.name for a in arms]
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise ValueError(f"--arms {spec!r}: {', '.join(twice)} given twice")
    return arms


def arm_overrides(
    arm: Arm,
    *,
    start: Path,
    data: Sequence[Path],
    steps: int,
    seed: int,
    common: Sequence[str] = (),
    split: str = "validation",
) -> list[str]:
    """The recipe config's overrides for `arm`: RL only, from `start`, no base-model evaluation,
    evaluated on `split` (validation: settings are chosen there, never on the held-out set); then
    `common` (every arm's), then the arm's own."""
    estimator, gs = ESTIMATORS[arm.algorithm]
    return [
        f"data.source=[{', '.join(str(p) for p in data)}]",
        f"data.evaluate_on={split}",
        f"model.path={start}",
        "model.warm_start_steps=0",
        "run.eval_base=false",
        f"run.steps={steps}",
        f"run.seed={seed}",
        f"algorithm.estimator={estimator}",
        f"algorithm.group_sampling.enabled={'true' if gs else 'false'}",
        f"rollout.n={arm.n}",
        *common,
        *arm.extra,
    ]


def check_configs(arms: Sequence[Arm], config: str = CONFIG, **overrides: Any) -> None:
    """Load every arm's recipe config with its overrides before the first arm runs: an unknown key
    or a bad value in the last arm is a ValueError now, not after the other arms' hours."""
    from pvpo.trainer.config.presets import preset_path
    from pvpo.trainer.config.schema import ConfigError, load_config

    for arm in arms:
        try:
            load_config(preset_path(config), arm_overrides(arm, **overrides))
        except ConfigError as e:
            raise ValueError(f"arm {arm.label}: {' '.join(str(e).split())}") from None


def finished(run_dir: Path) -> bool:
    """A demo run that wrote its summary and per-question EM."""
    return (run_dir / "summary.md").is_file() and (run_dir / "held_out_em.json").is_file()


def arm_dir(out: Path, arm: Arm, seed: int = 0) -> Path:
    """Where `arm`'s run for RL seed `seed` lives: OUT/<arm> for seed 0, OUT/seed<k>/<arm> for another."""
    return out / arm.name if seed == 0 else out / f"seed{seed}" / arm.name


def run_arm(arm: Arm, out: Path, overrides: list[str], config: str = CONFIG, seed: int = 0) -> float:
    """Run `arm`'s demo of `config` for RL seed `seed` into `arm_dir`; its wall time in seconds (0 when
    it had finished)."""
    run_dir = arm_dir(out, arm, seed)
    if finished(run_dir):
        print(f"[{arm.name}] finished earlier, kept", flush=True)
        return 0.0
    resume = (run_dir / "checkpoints" / "latest").exists()  # a killed arm goes on from its last checkpoint
    cmd = [sys.executable, "-m", "pvpo.cli", "demo", "--config", config, "--run-dir", str(run_dir)]
    cmd += ["--resume", *overrides] if resume else overrides
    print(f"[{arm.name}] {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    (run_dir / "bench_wall_s.txt").write_text(f"{wall:.1f}\n")
    return wall


def load_arm(run_dir: Path) -> dict[str, Any]:
    """What the report needs from a finished run: per-question EM, last metrics, wall time."""
    em = json.loads((run_dir / "held_out_em.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    wall = run_dir / "bench_wall_s.txt"
    best = run_dir / "checkpoints" / "best.json"  # run.eval_every's validation curve
    return {
        "curve": json.loads(best.read_text()) if best.is_file() else {},
        "questions": em["questions"],
        "before": em["em"]["before"],
        "after": em["em"]["after"],
        "scores": em.get("scores", {}),
        "last": rows[-1],
        "eval_row": next((r for r in reversed(rows) if "eval/accuracy" in r), {}),
        "wall_s": float(wall.read_text()) if wall.exists() else None,
    }


def load_seeds(out: Path, arm: Arm, seeds: Sequence[int]) -> dict[str, Any]:
    """`load_arm` over `arm`'s finished runs of `seeds` (at least one): `after` the mean over seeds of
    each question's EM, `afters` the per-seed lists, `seeds` the seeds found; costs, F1, format and
    wall the means over seeds; the validation curve's EM averaged at each step every seed evaluated.
    Every seed must have been evaluated on the same questions from the same start."""
    found = [k for k in seeds if finished(arm_dir(out, arm, k))]
    if not found:
        raise ValueError(f"{arm.name}: no finished run for seeds {', '.join(map(str, seeds))} under {out}")
    runs = [load_arm(arm_dir(out, arm, k)) for k in found]
    first = runs[0]
    for k, r in zip(found[1:], runs[1:]):
        if r["questions"] != first["questions"] or r["before"] != first["before"]:
            raise ValueError(f"{arm.name}: seed {k} started from another policy or questions than seed {found[0]}")
    n = len(first["questions"])

    def averaged(rows: list[dict[str, Any]]) -> dict[str, Any]:
        keys = set.intersection(*(set(r) for r in rows))
        return {k: mean([r[k] for r in rows]) for k in keys if all(isinstance(r[k], (int, float)) for r in rows)}

    walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
    curves = [r["curve"] for r in runs if r["curve"].get("points")]
    return {
        **first,
        "after": [mean([r["after"][i] for r in runs]) for i in range(n)],
        "afters": [r["after"] for r in runs],
        "seeds": found,
        "last": averaged([r["last"] for r in runs]),
        "eval_row": averaged([r["eval_row"] for r in runs]),
        "wall_s": mean(walls) if walls else None,
        "curve": curves[0] if len(curves) == 1 else mean_curve(curves),
    }


def mean_curve(curves: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds' validation curves as one: EM averaged at each step every curve evaluated, the
    best step that mean's highest ({} for no curve)."""
    if not curves:
        return {}
    steps = sorted(set.intersection(*({int(p["step"]) for p in c["points"]} for c in curves)))
    points = [
        {"step": t, "accuracy": mean([p["accuracy"] for c in curves for p in c["points"] if int(p["step"]) == t])}
        for t in steps
    ]
    best = {"step": max(points, key=lambda p: p["accuracy"])["step"]} if points else {}
    return {"points": points, "best": best, "questions": curves[0].get("questions")}


def curve_cell(curve: dict[str, Any]) -> str:
    """`0: 0.153, 8: 0.180, 16: 0.173 (8)`: validation EM at each evaluated step, the best step last."""
    points = sorted(curve.get("points", []), key=lambda p: p["step"])
    if not points:
        return "n/a"
    best = curve.get("best") or {}
    return ", ".join(f"{int(p['step'])}: {p['accuracy']:.3f}" for p in points) + f" ({best.get('step', 'n/a')})"


def seed_scores(run: dict[str, Any]) -> list[list[float]]:
    """Each seed's per-question EM after RL (a `load_arm` run: its one seed's)."""
    return run.get("afters") or [run["after"]]


def seeds_label(arm: Arm, run: dict[str, Any]) -> str:
    """The arm's label, with its seeds when it was trained with more than one or with another than 0."""
    seeds = run.get("seeds", [0])
    if seeds == [0]:
        return arm.label
    return f"{arm.label} ({'seed' if len(seeds) == 1 else 'seeds'} {', '.join(map(str, seeds))})"


def curve_point(curve: dict[str, Any], step: int) -> dict[str, Any] | None:
    """The validation point of `step` in a run's best.json record (None when it has none)."""
    return next((p for p in curve.get("points", []) if int(p["step"]) == step), None)


def curve_comparison(reference: dict[str, Any], runs: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Each arm's validation EM at its last evaluated step against the reference run's at the same
    step, paired on the same questions (best.json's per-question EM): one line per arm."""
    lines = []
    for name, r in runs.items():
        curve = r.get("curve", {})
        points = sorted(curve.get("points", []), key=lambda p: p["step"])
        if not points or "em" not in points[-1]:
            lines.append(f"- {labels[name]}: no per-question validation record")
            continue
        step = int(points[-1]["step"])
        ref = curve_point(reference, step)
        if ref is None or "em" not in ref or reference.get("questions") != curve.get("questions"):
            lines.append(
                f"- {labels[name]}: the reference run has no validation point at step {step} on these questions"
            )
            continue
        diff, se = paired_difference(ref["em"], points[-1]["em"])
        z = diff / se if se else 0.0
        lines.append(
            f"- {labels[name]} at step {step}: validation EM {points[-1]['accuracy']:.3f} against the reference's "
            f"{ref['accuracy']:.3f}: {diff:+.3f} (paired s.e. {se:.3f}, {z:+.1f} s.e.)"
        )
    return lines


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def report(
    arms: Sequence[Arm], runs: dict[str, dict[str, Any]], *, command: str, machine: str, split: str = "validation"
) -> str:
    """results.md: one row per arm, then each arm against the first, paired on the same questions,
    and each arm's EM by dataset."""
    first = runs[arms[0].name]
    for arm in arms[1:]:
        if runs[arm.name]["questions"] != first["questions"]:
            raise ValueError(f"{arm.name} was evaluated on other {split} questions than {arms[0].name}")
    n_q = len(first["questions"])
    datasets = sorted({q.split("/", 1)[0] for q in first["questions"]})
    lines = [
        f"# RL arms from one warm start on the real model (SmolLM2-135M-Instruct; {', '.join(datasets)})",
        "",
        f"machine: {machine}",
        f"command: `{command}`",
        "",
        f"Evaluated on the {split} split: {n_q} questions, greedy, in neither SFT nor RL"
        + (
            " (settings are chosen here; the held-out set is never evaluated by an arm)"
            if split == "validation"
            else ""
        )
        + (
            ". Arms with several RL seeds: EM after is the mean over seeds and its gain's s.e. counts the seeds' "
            "spread, sqrt(se_q^2 + sd_seeds^2 / S) (pvpo.stats.seeds_difference; between arms seeds_contrast); "
            "an arm with one seed: over questions only (paired where two columns share questions)."
            if any(len(seed_scores(runs[a.name])) > 1 for a in arms)
            else ". One RL seed per arm: standard errors are over questions only (paired where two columns share "
            "questions)."
        ),
        "",
        "| arm | model rollouts (anchor incl.) | tool calls (all-in) | policy tokens | EM start | EM after "
        "| gain (paired s.e.) | F1 after | format ok after | wall (s) | validation EM by step (best) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        r = runs[arm.name]
        c, e = r["last"], r["eval_row"]
        model_rollouts = c.get("cost/cum_rollouts", 0) - c.get("cost/cum_gt_rollouts", 0)
        g = seeds_difference(r["before"], seed_scores(r))
        gain, se = g["mean"], g["se"]
        lines.append(
            f"| {seeds_label(arm, r)} | {model_rollouts:.0f} | {c.get('cost/cum_tool_calls', 0):.0f} "
            f"| {c.get('cost/cum_policy_tokens', 0):.0f} | {sum(r['before']) / n_q:.3f} | {sum(r['after']) / n_q:.3f} "
            f"(s.e. {standard_error(r['after']):.3f}) | {gain:+.3f} ({se:.3f}) | {_f(e.get('eval/f1'))} "
            f"| {_f(e.get('eval/format_ok'))} | {_f(r['wall_s'], '.0f')} | {curve_cell(r.get('curve', {}))} |"
        )
    lines.append("")
    for arm in arms[1:]:
        r = runs[arm.name]
        c = seeds_contrast(seed_scores(first), seed_scores(r))
        diff, se = c["mean"], c["se"]
        z = diff / se if se else 0.0
        verdict = "resolved" if abs(z) >= 2 else "not resolved"
        kind = "s.e. with seeds" if max(len(seed_scores(first)), len(seed_scores(r))) > 1 else "paired s.e."
        lines.append(
            f"- {seeds_label(arms[0], first)} - {seeds_label(arm, r)}, {split} EM after RL: {diff:+.3f} "
            f"({kind} {se:.3f}, {z:+.1f} s.e.: {verdict} at 2 s.e.; this design resolves differences of about "
            f"{2 * se:.2f} EM)"
        )
    if len(datasets) > 1:
        lines += ["", "| arm | " + " | ".join(f"{d}: EM after (gain, paired s.e.)" for d in datasets) + " |"]
        lines.append("|---|" + "---|" * len(datasets))
        for arm in arms:
            r = runs[arm.name]
            cells = []
            for d in datasets:
                idx = [i for i, q in enumerate(r["questions"]) if q.split("/", 1)[0] == d]
                b, a = [r["before"][i] for i in idx], [r["after"][i] for i in idx]
                gain, se = paired_difference(b, a)
                cells.append(f"{sum(a) / len(a):.3f} ({gain:+.3f}, {se:.3f})")
            lines.append(f"| {seeds_label(arm, r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--start", type=Path, required=True, help="warm-started policy folder (the recipe's initial_policy)"
    )
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="the recipe's QA files, in the recipe's order")
    ap.add_argument("--out", type=Path, default=Path("runs/real_algorithms"), help="one folder per arm + results.md")
    ap.add_argument(
        "--arms",
        default=DEFAULT_ARMS,
        help=f"algorithm:N[:key=value...] arms (the overrides are the arm's own config keys); the first is "
        f"compared with each other one (default {DEFAULT_ARMS})",
    )
    ap.add_argument("--steps", type=int, default=8, help="RL steps per arm (the recipe's 8: each of 32 prompts once)")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="RL seeds: each arm trained once per seed, seed 0 under OUT/<arm>, seed k under OUT/seed<k>/<arm> "
        "(default 0). With --report-only, an arm's finished seeds among these",
    )
    ap.add_argument(
        "--set",
        dest="common",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every arm (repeatable), e.g. --set data.held_out_examples=100",
    )
    ap.add_argument("--config", default=CONFIG, help=f"the recipe preset the arms run (default {CONFIG})")
    ap.add_argument(
        "--split",
        choices=("validation", "held_out"),
        default="validation",
        help="what the arms are evaluated on: validation (default; the recipe's settings are chosen there) or "
        "held_out (only for a config without a validation split)",
    )
    ap.add_argument("--report-only", action="store_true", help="rewrite results.md from finished arms")
    ap.add_argument(
        "--reference-run",
        type=Path,
        help="a run of the recipe with run.eval_every (its checkpoints/best.json): each arm's last validation point "
        "is compared with its point at the same step, paired on the same questions",
    )
    args = ap.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except ValueError as e:
        ap.error(str(e))
    if not (args.start / "config.json").is_file():
        ap.error(f"--start {args.start}: no config.json there; give a policy folder (e.g. <recipe run>/initial_policy)")
    bad = [c for c in args.common if not is_override(c)]
    if bad:
        ap.error(f"--set {bad[0]!r}: give key=value (e.g. data.held_out_examples=100)")
    missing = [str(p) for p in args.data if not p.exists()]
    if missing:
        ap.error(f"--data: no such file: {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        common = {
            "start": args.start,
            "data": args.data,
            "steps": args.steps,
            "common": args.common,
            "split": args.split,
        }
        try:
            check_configs(arms, args.config, seed=args.seeds[0], **common)
        except ValueError as e:
            ap.error(str(e))
        for seed in args.seeds:
            for arm in arms:
                run_arm(arm, args.out, arm_overrides(arm, seed=seed, **common), args.config, seed)
    unfinished = [a.name for a in arms if not any(finished(arm_dir(args.out, a, k)) for k in args.seeds)]
    if unfinished:
        ap.error(f"unfinished arms under {args.out}: {', '.join(unfinished)}; run without --report-only")
    try:
        runs = {a.name: load_seeds(args.out, a, args.seeds) for a in arms}
    except ValueError as e:
        ap.error(str(e))
    text = report(
        arms,
        runs,
        command=shlex.join(["python", "bench/algorithms/real_algorithms.py", *sys.argv[1:]]),
        machine=machine_line(("torch", "transformers")),
        split=args.split,
    )
    if args.reference_run is not None:
        best = args.reference_run / "checkpoints" / "best.json"
        if not best.is_file():
            ap.error(f"--reference-run {args.reference_run}: no checkpoints/best.json (a run with run.eval_every)")
        text += f"\nEach arm's last validation point against {args.reference_run} at the same step:\n\n"
        text += "\n".join(curve_comparison(json.loads(best.read_text()), runs, {a.name: a.label for a in arms})) + "\n"
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
