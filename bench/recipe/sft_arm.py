"""The compute-matched SFT arm: the recipe's warm start continued for as many SFT steps as fit the
wall time of the RL phase it is compared with, from the same warm start, over several data-order
seeds; then RL against it on the split the RL runs evaluated, and on the held-out set once.

    python bench/recipe/sft_arm.py --recipe-run runs/C/recipe \\
        --match-wall-of runs/C/recipe runs/C/rl_seeds/seed_1 runs/C/rl_seeds/seed_2 --seeds 0,1,2 --out runs/C/sft
    python bench/recipe/sft_arm.py ... --report-only --held-out --rl-seeds-out runs/C/rl_seeds

The recipe run is a finished `pvpo demo --config real_smollm2_multihop ...` (validation mode for
choosing; its `initial_policy` is the warm start every arm starts from); `--match-wall-of` names the
RL arm's finished seed runs from that warm start (the recipe run and `bench/recipe/rl_seeds.py`'s).

- **Steps.** The RL phase of a run is the sum over its `metrics.jsonl` rows of the step's rollouts
  and update (`time/rollout_s`, `time/train_s`) and the reference work before it (`time/anchor_s`,
  `time/group_sampling_s`); evaluations are left out (both arms are evaluated alike). One SFT step's
  time is the recipe run's warm start's: its SFT seconds (`warm_start.json`'s `sft_seconds`) over
  its steps. The arm takes round(mean RL phase / SFT step) steps, written once to OUT/plan.json
  (a later call with other runs is refused), so the count is a measurement of the machine that ran
  both, not a constant. Run the arm as the RL runs ran (the same `run.threads`, nothing beside).
- **Data.** The warm start's own GT trajectories, rebuilt as it built them (the same questions,
  index and settings; checked against its `warm_start.json`): first those its steps never drew
  (new trajectories), then whole epochs, each shuffled with the arm's data-order seed
  (`pvpo.trainer.model.warmstart.continued_batches`). The SFT is the warm start's own (its
  learning rate, batch size, micro-batch budget, dtype and schedule: a fresh AdamW, warm-up to
  10% of the steps then linear decay; the warm start's AdamW state is not kept by a run).
- **Seeds.** Seed k trains in a child process into OUT/seed_<k> (`policy/`, `sft.json`: losses,
  seconds, steps, how many new trajectories); a finished seed is kept; a killed one starts again.
- **Evaluation.** `pvpo eval` of each seed's policy on the questions the recipe run evaluated
  (`validation.jsonl` in validation mode), with the recipe's agent settings against a loopback
  server of its index (`bench/rl_seeds.eval_command`: as the RL policies are evaluated), into
  OUT/seed_<k>/eval; OUT/results.md compares it with the RL runs' own evaluations of those questions
  (`pvpo eval` reproduces them answer for answer: `bench/recipe/rl_seeds.py --reproduce`), each arm minus
  the warm start and RL minus SFT, with standard errors counting the seeds' spread
  (`pvpo.stats.seeds_difference`, `seeds_contrast`), overall and per dataset.
- **Held-out** (`--held-out`, once the setting is chosen on validation): `pvpo eval` of each seed's
  policy on the recipe run's `held_out.jsonl`, kept under OUT/held_out/seed_<k> and never evaluated
  again; OUT/held_out.md compares it with the RL seeds' and the warm start's held-out evaluations
  that `bench/recipe/rl_seeds.py --held-out` kept under `--rl-seeds-out`/held_out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
from bench.recipe.rl_seeds import SPLITS, eval_command, read_predictions, recipe_config, split_of
from pvpo.atomic import atomic_write_json, read_jsonl
from pvpo.stats import mean, seeds_contrast, seeds_difference

BENCH = Path(__file__).resolve().parent
# the RL phase of a run: each step's rollouts and update, and the reference work before it
RL_PHASE_KEYS = ("time/rollout_s", "time/train_s", "time/anchor_s", "time/group_sampling_s")
SEED_ENTRIES = {"policy", "policy.tmp", "sft.json", "eval"}  # what a seed's folder holds


def rl_phase_seconds(run_dir: Path) -> float:
    """The RL phase's wall time of a finished run (module docstring): the sum over its metrics
    rows of `RL_PHASE_KEYS`, evaluations left out."""
    if not finished(run_dir):
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


def seed_dir(out: Path, seed: int) -> Path:
    """Where data-order seed `seed`'s continuation lives."""
    return out / f"seed_{seed}"


def seed_finished(folder: Path) -> bool:
    """A seed whose SFT ended: its policy and its record written."""
    return (folder / "sft.json").is_file() and (folder / "policy" / "config.json").is_file()


def check_seed_folder(folder: Path) -> None:
    """Refuse a seed folder holding anything this arm does not write (it is never modified)."""
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in SEED_ENTRIES) if folder.is_dir() else []
    if foreign:
        raise ValueError(f"{folder} holds files this arm does not write ({', '.join(foreign[:3])}): give another --out")


def train_command(recipe_run: Path, seed: int, steps: int, out: Path) -> list[str]:
    """The child process that trains data-order seed `seed` (`train_seed`)."""
    return [
        sys.executable,
        str(BENCH / "sft_arm.py"),
        "--recipe-run",
        str(recipe_run),
        "--out",
        str(out),
        "--train-seed",
        str(seed),
        "--steps",
        str(steps),
    ]


def sft_overrides(recipe_run: Path) -> list[str]:
    """The recipe run's config with its warm start as the model and its index as the retriever's
    (the questions, splits and agent settings the warm start's trajectories were written with)."""
    return [f"model.path={recipe_run / 'initial_policy'}", f"retriever.index_dir={recipe_run / 'index'}"]


def train_seed(
    recipe_run: Path, seed: int, steps: int, folder: Path, *, searcher: Any = None, show_progress: bool = True
) -> dict[str, Any]:
    """Continue `recipe_run`'s warm start for `steps` SFT steps in data-order seed `seed` (module
    docstring) and save the policy to FOLDER/policy and the record to FOLDER/sft.json; `searcher`
    replaces a loopback server of the run's index (tests)."""
    import tempfile

    import torch

    from pvpo.atomic import atomic_write_dir
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import load_data, retriever_session
    from pvpo.trainer.model.device import place_policy_model, placement, resolve_device, with_resolved_dtype
    from pvpo.trainer.model.memory import process_peak_rss_gib
    from pvpo.trainer.model.policy import load_policy, save_policy
    from pvpo.trainer.model.warmstart import continued_batches, sft_batches, warm_start
    from pvpo.trainer.setup import warm_start_trajectories

    recipe_config(recipe_run, warm_start_only=True)  # a run past its warm start, or a one-line error
    cfg = load_config(recipe_run / "config.yaml", sft_overrides(recipe_run))
    cfg = with_resolved_dtype(cfg, resolve_device(cfg.model.device))
    m = cfg.model
    saved = json.loads((recipe_run / "warm_start.json").read_text())
    if len(saved.get("losses", [])) != m.warm_start_steps:
        raise ValueError(
            f"{recipe_run}/warm_start.json: {len(saved.get('losses', []))} steps recorded, the config says "
            f"model.warm_start_steps={m.warm_start_steps}"
        )
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(seed)
    policy = load_policy(recipe_run / "initial_policy", dtype="float32")
    where = placement(m.device, m.dtype, m.attn_implementation, m.gradient_checkpointing)
    place_policy_model(policy.model, where)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # load_data writes the split files: not into the recipe run
        data = load_data(cfg, Path(tmp))
        session = contextlib.nullcontext(searcher) if searcher is not None else None
        with session or retriever_session(cfg, Path(tmp), data.corpus_path) as s:
            trajs, questions, _ = warm_start_trajectories(cfg, data, policy.tokenizer, s)
    if [q.uid for q in questions] != saved["questions"]:
        differ = len(set(saved["questions"]) ^ {q.uid for q in questions})
        raise ValueError(
            f"{recipe_run}: the warm start's GT trajectories were not rebuilt as its warm_start.json lists them "
            f"({len(questions)} questions against {len(saved['questions'])}, {differ} differ): another index, "
            "data file or retriever setting"
        )
    trajectories_s = time.perf_counter() - t0
    first = {"first_steps": m.warm_start_steps, "first_seed": cfg.run.seed}
    batches = continued_batches(len(trajs), m.warm_start_batch_size, steps, seed=seed, **first)
    seen = {i for b in sft_batches(len(trajs), m.warm_start_batch_size, m.warm_start_steps, cfg.run.seed) for i in b}
    t1 = time.perf_counter()
    with where.autocast():  # the warm start's compute dtype
        losses = warm_start(
            policy.model,
            trajs,
            policy.tokenizer.pad_token_id,
            steps=steps,
            lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size,
            seed=seed,
            max_tokens=cfg.optim.max_tokens_per_micro_batch,
            show_progress=show_progress,
            batches=batches,
        )
    sft_s = time.perf_counter() - t1
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_dir(folder / "policy", lambda tmp: save_policy(policy, tmp))
    record = {
        "seed": seed,
        "steps": steps,
        "losses": losses,
        "sft_seconds": sft_s,
        "trajectories_seconds": trajectories_s,
        "trajectories": len(trajs),
        "new_trajectories": len({i for b in batches for i in b} - seen),
        "epochs": steps * m.warm_start_batch_size / len(trajs),
        "peak_rss_gib": process_peak_rss_gib(),  # the child process's, the policy's SFT and its data
        "start": str(recipe_run / "initial_policy"),
    }
    atomic_write_json(folder / "sft.json", record)
    return record


def run_seeds(recipe_run: Path, seeds: Sequence[int], steps: int, out: Path) -> None:
    """Train each unfinished seed in a child process (`train_seed`); finished ones are kept."""
    for seed in seeds:
        folder = seed_dir(out, seed)
        if seed_finished(folder):
            print(f"[sft seed {seed}] finished earlier, kept", flush=True)
            continue
        check_seed_folder(folder)
        cmd = train_command(recipe_run, seed, steps, out)
        print(f"[sft seed {seed}] {shlex.join(cmd)}", flush=True)
        done = subprocess.run(cmd, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if done.returncode != 0:
            raise ValueError(f"SFT seed {seed} failed (exit status {done.returncode}): its output is above")


def evaluate_once(recipe_run: Path, todo: Sequence[tuple[Path, Path]], questions: Path) -> list[dict[str, Any]]:
    """`pvpo eval` of each (model, output folder) of `todo` on `questions` with the recipe's agent
    settings against a loopback server of its index (`rl_seeds.eval_command`), once: a folder that
    holds a finished evaluation (its `done` file) is read, never evaluated again. Each folder's
    answers by question id (`rl_seeds.read_predictions`), which must cover `questions`."""
    from pvpo.retriever.server import BackgroundServer

    cfg = recipe_config(recipe_run)
    pending = [(model, folder) for model, folder in todo if not (folder / "done").exists()]
    server = BackgroundServer(str(recipe_run / "index")) if pending else contextlib.nullcontext(None)
    with server as srv:
        for model, folder in pending:
            assert srv is not None  # started above whenever an evaluation is pending
            cmd = eval_command(cfg, model, questions, srv.url, folder)
            print(f"[eval {folder}] {shlex.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            (folder / "done").write_text(f"{model}\n")
    ids = {str(json.loads(x)["id"]) for x in questions.read_text().splitlines() if x.strip()}
    answers = [read_predictions(folder) for _, folder in todo]
    short = [str(folder) for (_, folder), got in zip(todo, answers) if not ids <= set(got)]
    if short:
        raise ValueError(f"evaluations that do not cover the {len(ids)} questions of {questions}: {', '.join(short)}")
    return answers


def _z(d: dict[str, float]) -> float:
    return d["mean"] / d["se"] if d["se"] else 0.0


def comparison(
    questions: Sequence[str],
    warm: Sequence[float],
    rl: Sequence[Sequence[float]],
    sft: Sequence[Sequence[float]],
    *,
    rl_label: str,
    sft_label: str,
    rl_format: Sequence[float] = (),
    sft_format: Sequence[float] = (),
    warm_format: Sequence[float] = (),
) -> list[str]:
    """The comparison's tables (markdown lines): each arm's EM (mean of its seeds) and its gain
    over the warm start with the seeds' spread in the s.e. (`seeds_difference`), RL minus SFT
    (`seeds_contrast`) with its verdict at 2 s.e.; then per dataset (the uid's prefix)."""
    lines = [
        "| arm | seeds | EM, mean of the seeds (per seed) | minus warm start (s.e. with seeds) | z | format ok |",
        "|---|---:|---|---|---:|---|",
        f"| warm start | | {mean(list(warm)):.3f} | | | {f'{mean(list(warm_format)):.3f}' if warm_format else 'n/a'} |",
    ]
    for label, runs, fmt in ((rl_label, rl, rl_format), (sft_label, sft, sft_format)):
        g = seeds_difference(warm, runs)
        per = ", ".join(f"{mean(list(r)):.3f}" for r in runs)
        fmt_cell = f"{mean(list(fmt)):.3f}" if fmt else "n/a"
        lines.append(
            f"| {label} | {len(runs)} | {mean([mean(list(r)) for r in runs]):.3f} ({per}) | {g['mean']:+.3f} "
            f"({g['se']:.3f}) | {_z(g):+.1f} | {fmt_cell} |"
        )
    c = seeds_contrast(rl, sft)
    verdict = "resolved" if abs(_z(c)) >= 2 else "not resolved"
    lines += [
        "",
        f"- **RL - SFT at equal compute: {c['mean']:+.3f} EM (s.e. with seeds {c['se']:.3f}, {_z(c):+.1f} s.e.: "
        f"{verdict} at 2 s.e.)**; s.e. = sqrt(se_q^2 + sd_rl^2 / S_rl + sd_sft^2 / S_sft) with se_q "
        f"{c['se_questions']:.3f} (paired over the {len(questions)} questions), sd_rl {c['sd_a']:.3f}, sd_sft "
        f"{c['sd_b']:.3f} (`pvpo.stats.seeds_contrast`).",
    ]
    datasets = sorted({q.split("/", 1)[0] for q in questions})
    if len(datasets) > 1:
        lines += [
            "",
            "| dataset | n | warm start EM | RL - warm start | SFT - warm start | RL - SFT (s.e. with seeds) |",
            "|---|---:|---|---|---|---|",
        ]
        for d in datasets:
            idx = [i for i, q in enumerate(questions) if q.split("/", 1)[0] == d]
            w = [warm[i] for i in idx]
            r = [[run[i] for i in idx] for run in rl]
            s = [[run[i] for i in idx] for run in sft]
            cells = [seeds_difference(w, r), seeds_difference(w, s), seeds_contrast(r, s)]
            lines.append(
                f"| {d} | {len(idx)} | {mean(w):.3f} | "
                + " | ".join(f"{x['mean']:+.3f} ({x['se']:.3f})" for x in cells)
                + " |"
            )
    return lines


def plan_lines(p: dict[str, Any], records: Sequence[dict[str, Any]], rl_steps: int) -> list[str]:
    """How the step count was derived, and what the arms spent (wall seconds of each phase)."""
    ws = p["warm_start"]
    phases = ", ".join(f"{Path(k).name} {v:.0f}" for k, v in p["rl_phase_s"].items())
    sft_s = [r["sft_seconds"] for r in records]
    new = [r["new_trajectories"] for r in records]
    peaks = [r["peak_rss_gib"] for r in records if r.get("peak_rss_gib")]
    return [
        f"- RL phase ({rl_steps} steps; rollouts, updates, anchor and Group Sampling, evaluations left out): "
        f"{phases} s; mean {p['rl_phase_mean_s']:.0f} s.",
        f"- One SFT step: {p['sft_step_s']:.1f} s ({p['sft_step_source']}), so the SFT arm takes "
        f"round({p['rl_phase_mean_s']:.0f} / {p['sft_step_s']:.1f}) = **{p['steps']} steps** of "
        f"{ws['batch_size']} trajectories (lr {ws['lr']:g}, the warm start's schedule) after the warm start's "
        f"{ws['steps']}.",
        f"- The SFT arm's steps took {', '.join(f'{x:.0f}' for x in sft_s)} s (mean {mean(sft_s):.0f}, "
        f"{mean(sft_s) / p['rl_phase_mean_s']:.2f}x the RL phase); of each seed's trajectories "
        f"{', '.join(map(str, new))} of {records[0]['trajectories']} were new to the warm start "
        f"({records[0]['epochs']:.2f} epochs of them in all)"
        + (
            f"; peak resident memory of each seed's process {', '.join(f'{x:.2f}' for x in peaks)} GiB."
            if peaks
            else "."
        ),
    ]


def _format(answers: dict[str, dict[str, float]], qs: Sequence[str]) -> list[float]:
    return [answers[q]["format_ok"] for q in qs]


def _em(answers: dict[str, dict[str, float]], qs: Sequence[str]) -> list[float]:
    return [answers[q]["em"] for q in qs]


def split_report(
    recipe_run: Path, rl_runs: Sequence[Path], seeds: Sequence[int], out: Path, p: dict[str, Any]
) -> list[str]:
    """OUT/results.md's body: the SFT seeds (evaluated here with `pvpo eval`) against the RL runs'
    own evaluations of the questions they evaluated, from one warm start."""
    recs = [json.loads((r / "held_out_em.json").read_text()) for r in rl_runs]
    qs = [str(q) for q in recs[0]["questions"]]
    for r, rec in zip(rl_runs[1:], recs[1:]):
        if [str(q) for q in rec["questions"]] != qs or rec["em"]["before"] != recs[0]["em"]["before"]:
            raise ValueError(
                f"--match-wall-of {r}: evaluated other questions, or from another start, than {rl_runs[0]}"
            )
    cfg = recipe_config(recipe_run)
    split = split_of(cfg)
    questions = recipe_run / SPLITS[split][1]
    todo = [(seed_dir(out, s) / "policy", seed_dir(out, s) / "eval") for s in seeds]
    sft = evaluate_once(recipe_run, todo, questions)
    records = [json.loads((seed_dir(out, s) / "sft.json").read_text()) for s in seeds]
    rl_steps = int(yaml.safe_load((rl_runs[0] / "config.yaml").read_text())["run"]["steps"])
    rl_fmt = [
        mean([x["format_ok"] for x in rec["scores"]["after"]]) for rec in recs if rec.get("scores", {}).get("after")
    ]
    lines = [
        f"# RL against SFT at equal compute, from one warm start: {SPLITS[split][0]} ({len(qs)} questions)",
        "",
        *plan_lines(p, records, rl_steps),
        "",
        *comparison(
            qs,
            recs[0]["em"]["before"],
            [rec["em"]["after"] for rec in recs],
            [_em(a, qs) for a in sft],
            rl_label=f"RL, {rl_steps} steps ({', '.join(r.name for r in rl_runs)})",
            sft_label=f"SFT continued, {p['steps']} steps (data-order seeds {', '.join(map(str, seeds))})",
            rl_format=rl_fmt,
            warm_format=[x["format_ok"] for x in recs[0].get("scores", {}).get("before", [])],
            sft_format=[mean(_format(a, qs)) for a in sft],
        ),
        "",
        f"EM of the RL runs: their own evaluations (`held_out_em.json`); of the SFT arm: `pvpo eval` of "
        f"OUT/seed_<k>/policy on {questions} (OUT/seed_<k>/eval).",
    ]
    return lines


def held_out_report(
    recipe_run: Path, rl_seeds_out: Path, seeds: Sequence[int], out: Path, p: dict[str, Any]
) -> list[str]:
    """OUT/held_out.md's body: the held-out questions evaluated once with `pvpo eval`, each SFT
    seed's policy here (OUT/held_out/seed_<k>), the warm start and the RL seeds' final policies
    as `bench/recipe/rl_seeds.py --held-out` kept them (`rl_seeds_out`/held_out/{warm,seed_<k>})."""
    cfg = recipe_config(recipe_run)
    if split_of(cfg) != "validation":
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own evaluations are the held-out ones")
    held = rl_seeds_out / "held_out"
    rl_folders = sorted(d for d in held.glob("seed_*") if (d / "done").exists())
    if not (held / "warm" / "done").exists() or not rl_folders:
        raise ValueError(
            f"--rl-seeds-out {rl_seeds_out}: no held-out evaluations of the warm start and the RL seeds under "
            f"{held} (run bench/recipe/rl_seeds.py --held-out first)"
        )
    questions = recipe_run / SPLITS["held_out"][1]
    qs = [str(json.loads(x)["id"]) for x in questions.read_text().splitlines() if x.strip()]
    todo = [(seed_dir(out, s) / "policy", out / "held_out" / f"seed_{s}") for s in seeds]
    sft = evaluate_once(recipe_run, todo, questions)
    warm = read_predictions(held / "warm")
    rl = [read_predictions(d) for d in rl_folders]
    short = [d.name for d, a in zip([held / "warm", *rl_folders], [warm, *rl]) if not set(qs) <= set(a)]
    if short:
        raise ValueError(f"{held}: evaluations that do not cover the {len(qs)} held-out questions: {', '.join(short)}")
    records = [json.loads((seed_dir(out, s) / "sft.json").read_text()) for s in seeds]
    rl_steps = int(cfg["run"]["steps"])
    example = eval_command(cfg, seed_dir(out, seeds[0]) / "policy", questions, "URL", out / "held_out" / "again")
    return [
        f"# RL against SFT at equal compute, from one warm start: held-out ({len(qs)} questions), evaluated once",
        "",
        *plan_lines(p, records, rl_steps),
        "",
        *comparison(
            qs,
            _em(warm, qs),
            [_em(a, qs) for a in rl],
            [_em(a, qs) for a in sft],
            rl_label=f"RL, {rl_steps} steps ({', '.join(d.name for d in rl_folders)})",
            sft_label=f"SFT continued, {p['steps']} steps (data-order seeds {', '.join(map(str, seeds))})",
            rl_format=[mean(_format(a, qs)) for a in rl],
            warm_format=_format(warm, qs),
            sft_format=[mean(_format(a, qs)) for a in sft],
        ),
        "",
        f"Every row is `pvpo eval` of a saved policy (warm start and RL: {held}/<label>; SFT: OUT/held_out/seed_<k>), "
        f"kept and never evaluated again; one SFT row again, against a server of {recipe_run / 'index'} at URL: "
        f"`{shlex.join(['pvpo', *example[3:]])}`.",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--recipe-run", type=Path, required=True, help="the finished recipe run whose warm start is continued"
    )
    ap.add_argument(
        "--match-wall-of",
        type=Path,
        nargs="+",
        help="the RL arm's finished seed runs from that warm start: their mean RL phase sets the SFT steps, and "
        "the report compares with their evaluations",
    )
    ap.add_argument("--seeds", default="0,1,2", help="the SFT arm's data-order seeds, comma-separated (default 0,1,2)")
    ap.add_argument("--out", type=Path, default=Path("runs/sft_arm"), help="plan.json, seed_<k>/, results.md")
    ap.add_argument("--report-only", action="store_true", help="train nothing: evaluate and report finished seeds")
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="then evaluate each seed's policy on the held-out questions once, into OUT/held_out.md (needs --rl-seeds-out)",
    )
    ap.add_argument("--rl-seeds-out", type=Path, help="bench/recipe/rl_seeds.py's --out, whose held_out/ it kept")
    ap.add_argument("--train-seed", type=int, help=argparse.SUPPRESS)  # the child process of one seed
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.train_seed is not None:
        try:
            train_seed(args.recipe_run, args.train_seed, args.steps, seed_dir(args.out, args.train_seed))
        except ValueError as e:
            ap.error(str(e))
        return 0
    if not args.match_wall_of:
        ap.error("--match-wall-of: name the RL arm's finished seed runs (e.g. the recipe run and rl_seeds' seed_<k>)")
    if args.held_out and args.rl_seeds_out is None:
        ap.error("--held-out needs --rl-seeds-out (bench/recipe/rl_seeds.py's --out, with its held_out/ evaluations)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds {args.seeds}: give each data-order seed once")
        recipe_config(args.recipe_run)
        args.out.mkdir(parents=True, exist_ok=True)
        p = fixed_plan(args.out, plan(args.recipe_run, args.match_wall_of))
        print(f"SFT arm: {p['steps']} steps (RL phase {p['rl_phase_mean_s']:.0f} s / {p['sft_step_s']:.1f} s a step)")
        if not args.report_only:
            run_seeds(args.recipe_run, seeds, p["steps"], args.out)
        unfinished = [str(seed_dir(args.out, s)) for s in seeds if not seed_finished(seed_dir(args.out, s))]
        if unfinished:
            raise ValueError(f"unfinished SFT seeds: {', '.join(unfinished)}; run without --report-only")
        head = [
            f"machine: {machine_line(('torch', 'transformers', 'vllm'))}",
            f"command: `{shlex.join(['python', 'bench/recipe/sft_arm.py', *(argv if argv is not None else sys.argv[1:])])}`",
            "",
        ]
        body = split_report(args.recipe_run, args.match_wall_of, seeds, args.out, p)
        text = "\n".join([body[0], "", *head, *body[2:]]) + "\n"
        (args.out / "results.md").write_text(text)
        print(text)
        if args.held_out:
            body = held_out_report(args.recipe_run, args.rl_seeds_out, seeds, args.out, p)
            text = "\n".join([body[0], "", *head, *body[2:]]) + "\n"
            (args.out / "held_out.md").write_text(text)
            print(text)
    except ValueError as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
