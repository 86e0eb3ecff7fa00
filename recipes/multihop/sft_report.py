"""The compute-matched SFT arm's reports (`pvpo recipe sft-arm`): RL against SFT at equal compute
from one warm start, each arm minus the warm start and RL minus SFT, with standard errors counting
the seeds' spread (`pvpo.stats.seeds_difference`, `seeds_contrast`), overall and per dataset.

- OUT/results.md: `pvpo eval` of each SFT seed's policy on the questions the recipe run evaluated
  (`validation.jsonl` in validation mode), into OUT/seed_<k>/eval, against the RL runs' own
  evaluations of those questions (`pvpo eval` reproduces them answer for answer:
  `pvpo recipe seeds --reproduce`).
- OUT/held_out.md (once the setting is chosen on validation): `pvpo eval` of each SFT seed's policy
  on the recipe run's `held_out.jsonl`, kept under OUT/held_out/seed_<k> and never evaluated again,
  against the RL seeds' and the warm start's held-out evaluations that `pvpo recipe seeds
  --held-out` kept under its OUT/held_out."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pvpo.recipes.multihop.evaluate import eval_command, evaluate_once
from pvpo.recipes.multihop.runs import SPLITS, question_ids, read_predictions, recipe_config, split_of
from pvpo.recipes.multihop.sft_train import seed_dir
from pvpo.stats import mean, seeds_contrast, seeds_difference


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
    todo = [(f"sft seed_{s}", seed_dir(out, s) / "policy", seed_dir(out, s) / "eval") for s in seeds]
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
    as `pvpo recipe seeds --held-out` kept them (`rl_seeds_out`/held_out/{warm,seed_<k>})."""
    cfg = recipe_config(recipe_run)
    if split_of(cfg) != "validation":
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own evaluations are the held-out ones")
    held = rl_seeds_out / "held_out"
    rl_folders = sorted(d for d in held.glob("seed_*") if (d / "done").exists())
    if not (held / "warm" / "done").exists() or not rl_folders:
        raise ValueError(
            f"--rl-seeds-out {rl_seeds_out}: no held-out evaluations of the warm start and the RL seeds under "
            f"{held} (run pvpo recipe seeds --held-out first)"
        )
    questions = recipe_run / SPLITS["held_out"][1]
    qs = question_ids(questions)
    todo = [(f"sft seed_{s}", seed_dir(out, s) / "policy", out / "held_out" / f"seed_{s}") for s in seeds]
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
