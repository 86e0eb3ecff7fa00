"""The RL seeds' report (`pvpo recipe seeds`: OUT/results.md, OUT/held_out.md): per seed RL minus
the warm start with its paired standard error, the mean over the seeds with a standard error that
counts their spread (`pvpo.stats.seeds_difference`: sqrt(se_q^2 + sd_s^2 / S)), per dataset too,
beside base model -> RL and the format rate; and the validation EM by RL step of each seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pvpo.stats import mean, paired_difference, seeds_difference


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
