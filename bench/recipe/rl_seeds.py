"""RL's gain over the warm start over several RL seeds from one warm start, on the held-out set,
evaluated once: the recipe's own run is the first seed; each further seed is the recipe's RL phase
again from that run's saved warm start (`initial_policy`), with `run.seed` changed and nothing
else (the same config file, splits, index and settings).

    python bench/recipe/rl_seeds.py --recipe-run runs/multihop --seeds 1,2 --out runs/multihop_seeds

The recipe run is a finished `pvpo demo --config real_smollm2_multihop ...` in held-out mode
(`data.evaluate_on: held_out`, the default), or in validation mode (`data.evaluate_on: validation`:
the seeds then evaluate the validation questions, for choosing a setting, and the held-out set is
left alone). Each seed run evaluates those questions before RL (the warm start, greedy: the same
answers in every run) and after; the report (OUT/results.md)
gives per seed RL - warm start with its paired standard error, and the mean over the seeds with a
standard error that counts the seeds' spread (`pvpo.stats.seeds_difference`: sqrt(se_q^2 +
sd_s^2 / S)), per dataset too, beside base model -> RL and the format rate; and, where the runs
kept validation points with each question's EM (`run.eval_every`), the validation EM by RL step
of each seed and the mean over seeds minus the warm start at each step, with the same s.e.

`--reproduce` then evaluates each seed's final policy (and the warm start) with `pvpo eval`,
against a loopback server of the recipe's own index, with the recipe's agent settings, and checks
each reproduces its run's held-out EM question by question (greedy ties in another batch mix may
flip a few; the report counts them).

`--held-out` (a validation-mode recipe run, once its setting is chosen on validation): the
held-out table, evaluated once. `pvpo eval` of the base model, the warm start and each seed's
final policy on the run's held-out questions (the same index as validation), kept under
OUT/held_out and never evaluated again (a later call reads them); OUT/held_out.md has the same
table as results.md, on those questions, with base model -> RL.

The seeds start from the recipe run's warm start (`initial_policy`, written before its RL phase),
so they may run while the recipe run's own RL goes on (on another core); the report waits for it.

Seed runs are resumable: a finished one is kept, a killed one resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.algorithms.real_algorithms import finished
from bench.common.machine import machine_line
from pvpo.stats import mean, paired_difference, seeds_difference


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


# a recipe run's evaluated split: (its name in the report, the questions file the run wrote)
SPLITS = {"held_out": ("held-out", "held_out.jsonl"), "validation": ("validation", "validation.jsonl")}


def split_of(cfg: dict[str, Any]) -> str:
    """The split a recipe run evaluated before and after RL (`data.evaluate_on`)."""
    return str(cfg["data"].get("evaluate_on", "held_out"))


def recipe_config(recipe_run: Path, *, warm_start_only: bool = False) -> dict[str, Any]:
    """The recipe run's resolved config (its config.yaml), checked to be a finished run of a known
    split; with `warm_start_only`, a run past its warm start (the seeds need only its saved policy,
    config and index, so they can start while its own RL phase runs beside them)."""
    if not warm_start_only and not finished(recipe_run):
        raise ValueError(f"--recipe-run {recipe_run}: no finished demo run there (summary.md, held_out_em.json)")
    if warm_start_only and not (recipe_run / "config.yaml").is_file():
        raise ValueError(f"--recipe-run {recipe_run}: no demo run there (config.yaml)")
    if not (recipe_run / "initial_policy" / "config.json").is_file():
        raise ValueError(f"--recipe-run {recipe_run}: no initial_policy (the warm start) to start the seeds from")
    cfg = yaml.safe_load((recipe_run / "config.yaml").read_text())
    if split_of(cfg) not in SPLITS:
        raise ValueError(f"--recipe-run {recipe_run}: evaluated on {split_of(cfg)!r}; known: {', '.join(SPLITS)}")
    return cfg


def run_seed(recipe_run: Path, seed: int, out: Path) -> Path:
    """Seed `seed`'s run under OUT/seed_<seed> (kept when finished, resumed when killed)."""
    run_dir = out / f"seed_{seed}"
    if finished(run_dir):
        print(f"[seed {seed}] finished earlier, kept", flush=True)
        return run_dir
    resume = (run_dir / "checkpoints" / "latest").exists()
    cmd = [sys.executable, "-m", "pvpo.cli", "demo", "--config", str(recipe_run / "config.yaml")]
    cmd += ["--run-dir", str(run_dir), *(["--resume"] if resume else []), *seed_overrides(recipe_run, seed)]
    print(f"[seed {seed}] {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    (run_dir / "bench_wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return run_dir


def load_seed(run_dir: Path) -> dict[str, Any]:
    """A finished seed run's held-out record: questions, each question's scores by stage."""
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


def curve_table(seeds: Sequence[int], runs: Sequence[dict[str, Any]]) -> list[str]:
    """Validation EM by RL step per seed, and the mean over seeds minus the first seed's step-0
    answers (the warm start) with the seeds' spread in its s.e.; the steps every seed evaluated."""
    for seed, run in zip(seeds[1:], runs[1:]):
        if run["questions"] != runs[0]["questions"]:
            raise ValueError(f"seed {seed}'s validation curve is over other questions than seed {seeds[0]}'s")
    curves = [run["points"] for run in runs]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    if 0 not in steps:
        return []
    warm = curves[0][0]
    lines = ["", "| validation EM by RL step | " + " | ".join(str(k) for k in steps) + " |"]
    lines.append("|---|" + "---|" * len(steps))
    for seed, c in zip(seeds, curves):
        lines.append(f"| seed {seed} | " + " | ".join(f"{mean(c[k]):.3f}" for k in steps) + " |")
    cells = []
    for k in steps[1:]:
        d = seeds_difference(warm, [c[k] for c in curves])
        cells.append(f"{d['mean']:+.3f} ({d['se']:.3f})")
    lines.append(
        f"| mean of the {len(curves)} seeds minus seed {seeds[0]}'s step 0 (s.e. with seeds) | | "
        + " | ".join(cells)
        + " |"
    )
    return lines


def _stage_mean(rec: dict[str, Any], stage: str, key: str) -> float | None:
    rows = rec["scores"].get(stage) or []
    return mean([r[key] for r in rows]) if rows else None


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def report(
    seeds: Sequence[int], runs: Sequence[dict[str, Any]], *, command: str, machine: str, split: str = "held-out"
) -> str:
    """results.md: one row per seed, the mean over seeds (seeds' spread counted), per dataset, on
    `split` (the questions the runs evaluated before and after RL)."""
    first = runs[0]
    for s, r in zip(seeds[1:], runs[1:]):
        if r["questions"] != first["questions"]:
            raise ValueError(f"seed {s} was evaluated on other {split} questions than seed {seeds[0]}")
    qs = first["questions"]
    warm = first["em"]["before"]
    afters = [r["em"]["after"] for r in runs]
    lines = [
        f"# RL over the warm start, {len(seeds)} RL seeds from one warm start, {split} ({len(qs)} questions)",
        "",
        f"machine: {machine}",
        f"command: `{command}`",
        "",
        "| seed | warm start EM | after RL EM | RL - warm start (paired s.e.) | z | format ok after | "
        "warm start EM in this run |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, r in zip(seeds, runs):
        gain, se = paired_difference(warm, r["em"]["after"])
        z = gain / se if se else 0.0
        lines.append(
            f"| {s} | {mean(warm):.3f} | {mean(r['em']['after']):.3f} | {gain:+.3f} ({se:.3f}) | {z:+.1f} "
            f"| {_f(_stage_mean(r, 'after', 'format_ok'))} | {mean(r['em']['before']):.3f} |"
        )
    agg = seeds_difference(warm, afters)
    z = agg["mean"] / agg["se"] if agg["se"] else 0.0
    lines += [
        "",
        f"- **Mean over the {len(seeds)} seeds, RL - warm start: {agg['mean']:+.3f} (s.e. {agg['se']:.3f}, "
        f"{z:+.1f} s.e.)**; s.e. = sqrt(se_q^2 + sd_s^2 / S) with se_q = {agg['se_questions']:.3f} (paired, over "
        f"questions, of the seed-averaged differences) and sd_s = {agg['sd_seeds']:.3f} (the per-seed gains' "
        "spread); the warm start is one: its own randomness is not sampled.",
    ]
    base = first["em"].get("base")
    if base:
        b = seeds_difference(base, afters)
        lines.append(
            f"- Base model -> RL, mean over seeds: {b['mean']:+.3f} (s.e. {b['se']:.3f}, "
            f"{b['mean'] / b['se'] if b['se'] else 0.0:+.1f} s.e.); base EM {mean(base):.3f}."
        )
    fmt = [v for v in (_stage_mean(r, "after", "format_ok") for r in runs) if v is not None]
    if fmt:
        lines.append(
            f"- Format ok after RL, mean over seeds: {mean(fmt):.3f} (per seed {', '.join(f'{v:.3f}' for v in fmt)})."
        )
    flips = [sum(1 for b, a in zip(r["em"]["before"], warm) if b != a) for r in runs]
    lines.append(
        f"- Warm-start answers that differ from seed {seeds[0]}'s run, per seed: {flips} (greedy; 0 expected)."
    )
    datasets = sorted({q.split("/", 1)[0] for q in qs})
    if len(datasets) > 1:
        lines += ["", "| dataset | n | warm start EM | after RL, mean over seeds | RL - warm start (s.e. with seeds) |"]
        lines.append("|---|---:|---|---|---|")
        for d in datasets:
            idx = [i for i, q in enumerate(qs) if q.split("/", 1)[0] == d]
            w = [warm[i] for i in idx]
            a = [[run[i] for i in idx] for run in afters]
            g = seeds_difference(w, a)
            lines.append(
                f"| {d} | {len(idx)} | {mean(w):.3f} | {mean([mean(x) for x in a]):.3f} | {g['mean']:+.3f} ({g['se']:.3f}) |"
            )
    return "\n".join(lines) + "\n"


def final_policy(run_dir: Path) -> Path:
    """The policy of a finished run's last checkpoint (`checkpoints/latest`)."""
    from pvpo.trainer.state.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir}: no checkpoint")
    return ckpt / "policy"


def eval_command(cfg: dict[str, Any], model: Path, questions: Path, url: str, out: Path) -> list[str]:
    """`pvpo eval` of `model` on `questions` with the recipe's agent settings (what the run's own
    held-out evaluation used), greedy."""
    r, env = cfg["rollout"], cfg["env"]
    cmd = [sys.executable, "-m", "pvpo.cli", "eval", "--model", str(model), "--dataset", str(questions)]
    # the run's prompt: a named template, else the default prompt under the run's tag protocol
    template = env.get("prompt_template", "default")
    if template == "default" and env["protocol"] != "search_r1":
        template = env["protocol"]
    cmd += ["--retriever-url", url, "--out", str(out), "--overwrite", "--template", template]
    cmd += ["--max-turns", str(r["max_turns"]), "--max-new-tokens", str(r["max_new_tokens"])]
    cmd += ["--max-response-tokens", str(r["max_response_tokens"]), "--topk", str(cfg["retriever"]["topk"])]
    cmd += ["--batch-size", str(r["batch_size"]), "--dtype", str(cfg["model"]["dtype"])]
    if env.get("max_obs_chars"):
        cmd += ["--max-obs-chars", str(env["max_obs_chars"])]
    engine = r.get("engine", "auto")
    if engine in ("auto", "vllm"):
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            cmd += ["--engine", "vllm"]
            kv = (r.get("vllm") or {}).get("kv_cache_memory_bytes")
            cmd += ["--engine-option", f"kv_cache_memory_bytes={kv}"] if kv else []
        else:
            cmd += ["--engine", "hf"]
    else:
        cmd += ["--engine", engine]
    return cmd


def reproduce(recipe_run: Path, seeds: Sequence[int], dirs: Sequence[Path], out: Path) -> list[str]:
    """`pvpo eval` of the warm start and each seed's final policy on the questions the runs
    evaluated (held-out, or validation); one line per policy: EM, the run's EM, and how many
    questions' EM differ."""
    from pvpo.retriever.server import BackgroundServer

    cfg = recipe_config(recipe_run)
    questions = recipe_run / SPLITS[split_of(cfg)][1]
    lines = []
    with BackgroundServer(str(recipe_run / "index")) as server:
        todo = [("warm", recipe_run / "initial_policy", dirs[0], "before")]
        todo += [(f"seed_{s}", final_policy(d), d, "after") for s, d in zip(seeds, dirs)]
        for label, model, run_dir, stage in todo:
            folder = out / "eval" / label
            cmd = eval_command(cfg, model, questions, server.url, folder)
            print(f"[{label}] {shlex.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            got = {}
            for path in folder.glob("*/predictions.jsonl"):
                for row in map(json.loads, path.read_text().splitlines()):
                    got[row["id"]] = float(row["output"]["metric_score"]["em"])
            rec = load_seed(run_dir)
            want = dict(zip(rec["questions"], rec["em"][stage]))
            differ = sum(1 for q, v in want.items() if got.get(q) != v)
            lines.append(
                f"- `pvpo eval` of {label} ({model}): EM {mean(list(got.values())):.3f} against the run's "
                f"{mean(list(want.values())):.3f}; {differ} of {len(want)} questions differ"
            )
    return lines


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


def held_out_once(recipe_run: Path, seeds: Sequence[int], dirs: Sequence[Path], out: Path) -> list[dict[str, Any]]:
    """The held-out questions of a validation-mode recipe run, evaluated once for the chosen setting:
    `pvpo eval` of the base model, the warm start and each seed's final policy on the run's
    held_out.jsonl, against a loopback server of its index (the one index every split searches).
    An evaluation already under OUT/held_out/<label> is read, never run again. One record per seed
    in `load_seed`'s shape (questions, EM before = warm start, after, base; format_ok after)."""
    from pvpo.retriever.server import BackgroundServer

    cfg = recipe_config(recipe_run)
    if split_of(cfg) != "validation":
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own table is the held-out one")
    questions = recipe_run / SPLITS["held_out"][1]
    todo = [("base", base_model(cfg)), ("warm", recipe_run / "initial_policy")]
    todo += [(f"seed_{s}", final_policy(d)) for s, d in zip(seeds, dirs)]
    answers: dict[str, dict[str, dict[str, float]]] = {}
    pending = [(label, model) for label, model in todo if not (out / "held_out" / label / "done").exists()]
    server = BackgroundServer(str(recipe_run / "index")) if pending else contextlib.nullcontext(None)
    with server as srv:
        for label, model in todo:
            folder = out / "held_out" / label
            if (label, model) in pending:
                assert srv is not None  # started above whenever an evaluation is pending
                cmd = eval_command(cfg, model, questions, srv.url, folder)
                print(f"[held-out {label}] {shlex.join(cmd)}", flush=True)
                env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
                subprocess.run(cmd, check=True, env=env)
                (folder / "done").write_text(f"{model}\n")
            answers[label] = read_predictions(folder)
    ids = [json.loads(line)["id"] for line in questions.read_text().splitlines() if line.strip()]
    missing = [label for label, got in answers.items() if set(got) != set(map(str, ids))]
    if missing:
        raise ValueError(f"held-out evaluations that do not cover the {len(ids)} questions: {', '.join(missing)}")

    def col(label: str, key: str = "em") -> list[float]:
        return [answers[label][str(q)][key] for q in ids]

    return [
        {
            "questions": [str(q) for q in ids],
            "em": {"before": col("warm"), "after": col(f"seed_{s}"), "base": col("base")},
            "scores": {"after": [{"format_ok": f} for f in col(f"seed_{s}", "format_ok")]},
        }
        for s in seeds
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--recipe-run",
        type=Path,
        required=True,
        help="a finished run of the recipe, held-out or validation mode (its seed is the first)",
    )
    ap.add_argument("--seeds", default="1,2", help="the further RL seeds, comma-separated (default 1,2)")
    ap.add_argument("--out", type=Path, default=Path("runs/rl_seeds"), help="one folder per seed + results.md")
    ap.add_argument("--report-only", action="store_true", help="rewrite results.md from finished seed runs")
    ap.add_argument("--reproduce", action="store_true", help="then pvpo eval each seed's policy (module docstring)")
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="a validation-mode recipe run, its setting chosen: evaluate the base model, the warm start and "
        "each seed's final policy on the held-out questions, once (kept under OUT/held_out), into OUT/held_out.md",
    )
    args = ap.parse_args(argv)
    try:
        # running seeds needs the recipe's warm start only; the report needs the recipe run finished
        cfg = recipe_config(args.recipe_run, warm_start_only=not args.report_only)
        extra = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError as e:
        ap.error(str(e))
    own = int(cfg["run"]["seed"])
    if own in extra or len(set(extra)) != len(extra):
        ap.error(f"--seeds {args.seeds}: give each seed once, none equal to the recipe run's own seed {own}")
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = [args.recipe_run] + [
        (args.out / f"seed_{s}") if args.report_only else run_seed(args.recipe_run, s, args.out) for s in extra
    ]
    unfinished = [str(d) for d in dirs if not finished(d)]
    if unfinished == [str(args.recipe_run)] and not args.report_only:
        print(f"the seeds are done; {args.recipe_run} is still running: --report-only once it ends", flush=True)
        return 0
    if unfinished:
        ap.error(f"unfinished seed runs: {', '.join(unfinished)}; run without --report-only")
    seeds = [own, *extra]
    text = report(
        seeds,
        [load_seed(d) for d in dirs],
        command=shlex.join(["python", "bench/recipe/rl_seeds.py", *sys.argv[1:]]),
        machine=machine_line(("torch", "transformers", "vllm")),
        split=SPLITS[split_of(cfg)][0],
    )
    curves = [load_curve(d) for d in dirs]
    if all(c is not None for c in curves):  # validation points with per-question EM (run.eval_every)
        text += "\n".join(curve_table(seeds, [c for c in curves if c is not None])) + "\n"
    if args.reproduce:
        text += "\n" + "\n".join(reproduce(args.recipe_run, seeds, dirs, args.out)) + "\n"
    (args.out / "results.md").write_text(text)
    print(text)
    if args.held_out:
        try:
            records = held_out_once(args.recipe_run, seeds, dirs, args.out)
        except ValueError as e:
            ap.error(str(e))
        held = report(
            seeds,
            records,
            command=shlex.join(["python", "bench/recipe/rl_seeds.py", *sys.argv[1:]]),
            machine=machine_line(("torch", "transformers", "vllm")),
            split="held-out, evaluated once with `pvpo eval`",
        )
        (args.out / "held_out.md").write_text(held)
        print(held)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
