"""`bench/training/async_rl.py pairs`: rollouts beside the update against the synchronous loop at its best,
measured in interleaved, repeated pairs.

One run against another run of another setting on 2 shared cores says little: the machine's load
drifts between runs, and the synchronous loop at `run.threads: 1` leaves a core idle while it
updates (the demo's 1.52x was against that). So every comparison here is a **pair** of runs trained
back to back from one start, the arm under test against a base arm, with the order inside the pair
alternating from one pair to the next, repeated over `--repeats` pairs (one RL seed a repeat, both
runs of a pair on the same seed); each pair gives one ratio, and the table reports every run and,
per arm, the ratios' mean and range and in how many pairs the arm was faster.

- speed (the default): base = eta 0 at `run.threads` `--base-threads` (2: every phase on both
  cores), against eta k (`--etas`, default 1 2) at `--threads` (1: the rollout thread and the
  update one core each).
- `--ablation`: at eta `--etas` (one, default 2), AReaL's decoupled objective (base) against naive
  PPO (`rollout.decoupled=false`), both at `--threads`; what the correction buys is the validation
  EM difference over the seeds (`pvpo.stats.seeds_contrast`).

Per run: samples (the policy's own rollouts) and model tokens per second of RL wall time, the
engine's idle share (`time/engine_idle_frac`: at eta 0 the update's share of a step, at eta > 0 the
step's time with no episode in flight), the update's wait, the staleness histogram (the share of
trained model tokens 0, 1, ... eta and more than eta versions behind, `stale/lag_*`) and the share
of late episodes, EM after RL on the run's evaluated split (with `data.evaluate_on=validation`, the
validation questions), the largest step KL, the process's peak RSS and the load average when the run
started. The start every run shares: `--from-run` (a finished run, e.g. the recipe's own: its
`initial_policy`, anchor, partition, GT cache and index), else one built here in OUT/start with the
base arm's settings (warm start, anchor; no RL step), so no measured run is also the one that
built the start. Each run trains in a process of its own; a rerun keeps the runs that finished with
the same settings. The record (OUT/record.json: the machine, the command, the plan, every row and
the summary) is rewritten after each run.

    python bench/training/async_rl.py pairs --config demo --out runs/bench-async-pairs-demo
    python bench/training/async_rl.py pairs --config demo --ablation --out runs/bench-async-ablation
    python bench/training/async_rl.py pairs --config RUN/config.yaml --from-run RUN --steps 4 \\
        --out runs/bench-async-pairs-recipe data.max_eval_examples=16 run.eval_base=false
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pvpo.machine import machine_line, machine_record

RECORD = "record.json"
START = "bench_start.json"  # the start folder's settings, once its warm start and reference are built
PACKAGES = ("torch", "transformers", "trl", "vllm")


@dataclass(frozen=True)
class Arm:
    """One setting: its name in the table, a short key (folder names) and its overrides."""

    name: str
    key: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Planned:
    """One run of the plan: the `pair` it belongs to (its `repeat`), its place in the pair (`slot`
    0 or 1), its `arm` and RL `seed`, and its folder name."""

    pair: int
    repeat: int
    slot: int
    seed: int
    arm: Arm
    base: bool

    @property
    def folder(self) -> str:
        return f"pair{self.pair}_{self.slot}_{self.arm.key}"


def threads_of(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def speed_arms(etas: Sequence[int], base_threads: int, threads: int) -> tuple[Arm, list[Arm]]:
    """eta 0 at `base_threads` against each eta in `etas` at `threads`."""
    base = Arm(
        f"eta 0, {threads_of(base_threads)}",
        f"eta0_t{base_threads}",
        ("rollout.max_staleness=0", f"run.threads={base_threads}"),
    )
    others = [
        Arm(
            f"eta {k}, {threads_of(threads)}",
            f"eta{k}_t{threads}",
            (f"rollout.max_staleness={k}", f"run.threads={threads}"),
        )
        for k in etas
    ]
    if any(k < 1 for k in etas):
        raise ValueError(f"--etas {' '.join(map(str, etas))}: the arms against eta 0 need eta >= 1")
    return base, others


def ablation_arms(eta: int, threads: int) -> tuple[Arm, list[Arm]]:
    """At `eta`: the decoupled objective (base) against naive PPO."""
    if eta < 1:
        raise ValueError(f"--etas {eta}: the ablation needs eta >= 1 (at eta 0 the two objectives are one)")
    common = (f"rollout.max_staleness={eta}", f"run.threads={threads}")
    return (
        Arm(f"eta {eta}, decoupled", f"eta{eta}_decoupled", (*common, "rollout.decoupled=true")),
        [Arm(f"eta {eta}, naive PPO", f"eta{eta}_naive", (*common, "rollout.decoupled=false"))],
    )


def plan(base: Arm, others: Sequence[Arm], seeds: Sequence[int]) -> list[Planned]:
    """The runs in the order they train: for each repeat (one seed each), one pair per arm of
    `others`, each pair its base run and its arm's run back to back; the base goes first where
    repeat + the arm's index is even, second otherwise, so each arm's pairs alternate the order and
    neither slot is always the first run after another arm's."""
    runs: list[Planned] = []
    for repeat, seed in enumerate(seeds):
        for j, arm in enumerate(others):
            pair = repeat * len(others) + j
            order = [(base, True), (arm, False)] if (repeat + j) % 2 == 0 else [(arm, False), (base, True)]
            runs += [Planned(pair, repeat, slot, seed, a, is_base) for slot, (a, is_base) in enumerate(order)]
    return runs


def run_overrides(p: Planned, common: Sequence[str], start: Sequence[str], steps: int | None) -> list[str]:
    """A planned run's overrides: the command's, the shared start's, its arm's, its seed and steps."""
    return [*common, *start, *p.arm.overrides, f"run.seed={p.seed}", *([f"run.steps={steps}"] if steps else [])]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summary(runs: Sequence[Planned], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm against the base: each pair's samples/s and tokens/s ratios (arm / base), their mean
    and range, the pairs in which the arm was faster, the engine's idle share of each side, and the
    EM difference (arm - base) over the pairs' seeds with the s.e. counting the seeds' spread."""
    from pvpo.stats import seeds_contrast

    by_pair: dict[int, dict[bool, dict[str, Any]]] = {}
    arms: dict[int, Arm] = {}
    for p, row in zip(runs, rows, strict=False):
        by_pair.setdefault(p.pair, {})[p.base] = row
        if not p.base:
            arms[p.pair] = p.arm
    out = []
    for arm in dict.fromkeys(arms.values()):
        pairs = [by_pair[k] for k, a in arms.items() if a == arm and len(by_pair[k]) == 2]
        if not pairs:
            continue
        speed = [d[False]["samples_per_s"] / d[True]["samples_per_s"] for d in pairs]
        tokens = [d[False]["tokens_per_s"] / d[True]["tokens_per_s"] for d in pairs]
        mine, theirs = [d[False]["per_question"] for d in pairs], [d[True]["per_question"] for d in pairs]
        em: dict[str, float] = {}
        if all(mine) and all(theirs) and len({len(x) for x in (*mine, *theirs)}) == 1:
            em = seeds_contrast(mine, theirs)
        out.append(
            {
                "arm": arm.name,
                "pairs": len(pairs),
                "samples_ratio": speed,
                "tokens_ratio": tokens,
                "faster_in": sum(r > 1 for r in speed),
                "idle_arm": _mean([d[False]["idle"] for d in pairs]),
                "idle_base": _mean([d[True]["idle"] for d in pairs]),
                "em_arm": _mean([d[False]["em"] for d in pairs]),
                "em_base": _mean([d[True]["em"] for d in pairs]),
                "em_diff": em.get("mean", float("nan")),
                "em_se": em.get("se", float("nan")),
            }
        )
    return out


def lags(row: dict[str, Any]) -> str:
    """The staleness histogram as 'lag 0 / 1 / ... / over eta' shares."""
    hist = row.get("lag", {})
    keys = sorted((k for k in hist if k != "lag_over_eta"), key=lambda k: int(k.removeprefix("lag_")))
    shares = [f"{hist[k]:.2f}" for k in keys]
    return " / ".join(shares + ([f"{hist['lag_over_eta']:.2f}"] if "lag_over_eta" in hist else []))


def table(runs: Sequence[Planned], rows: Sequence[dict[str, Any]], base: Arm) -> list[str]:
    """The per-run table (in training order) and the per-arm summary against `base`, as markdown."""
    lines = [
        "| pair | slot | arm | seed | steps | RL wall (s) | samples/s | tokens/s | engine idle | update wait (s) "
        "| lag 0 / 1 / ... / over eta | late | EM after | max step KL | peak RSS (GiB) | load at start |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, r in zip(runs, rows, strict=False):
        lines.append(
            f"| {p.pair} | {p.slot} | {p.arm.name} | {p.seed} | {r['steps']} | {r['rl_wall_s']:.0f} | "
            f"{r['samples_per_s']:.3g} | {r['tokens_per_s']:.4g} | {r['idle']:.2f} | {r['wait_s']:.1f} | {lags(r)} | "
            f"{r.get('late', 0.0):.2f} | {r['em']:.3f} +- {r['em_se']:.3f} | {r.get('kl_max', float('nan')):.3f} | "
            f"{r.get('peak_rss_gib', float('nan')):.2f} | {r.get('load_at_start', float('nan')):.2f} |"
        )
    lines += [
        "",
        f"| arm, against {base.name} | pairs | samples/s ratio, mean (range) | tokens/s ratio, mean (range) | faster in "
        "| engine idle, arm / base | EM after, arm / base (means) | EM arm - base (s.e. with seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary(runs, rows):
        sr, tr = s["samples_ratio"], s["tokens_ratio"]
        em = f"{s['em_diff']:+.3f} ({s['em_se']:.3f}" + (
            f", {s['em_diff'] / s['em_se']:+.1f} s.e.)" if s["em_se"] else ")"
        )
        em = "n/a" if s["em_se"] != s["em_se"] else em  # no per-question EM on the same questions
        lines.append(
            f"| {s['arm']} | {s['pairs']} | {_mean(sr):.2f}x ({min(sr):.2f}-{max(sr):.2f}) | "
            f"{_mean(tr):.2f}x ({min(tr):.2f}-{max(tr):.2f}) | {s['faster_in']} of {s['pairs']} | "
            f"{s['idle_arm']:.2f} / {s['idle_base']:.2f} | {s['em_arm']:.3f} / {s['em_base']:.3f} | {em} |"
        )
    return lines


def write_record(path: Path, record: dict[str, Any]) -> None:
    """`record` as JSON at `path`, whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def build_start(config: str, overrides: list[str], run_dir: str) -> None:
    """The start every run shares, in `run_dir`: the warm-started initial policy, the index and the
    reference state (anchor, Group Sampling's partition, GT cache), no RL step. In a process of its
    own, as each run."""
    from bench.training.async_rl import trainer_for
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(resolve_config(config), overrides)
    with trainer_for(cfg, Path(run_dir)) as (trainer, _):
        trainer.ensure_reference(0)
    (Path(run_dir) / START).write_text(json.dumps({"config": config, "overrides": overrides}) + "\n")


Train = Callable[[Callable[..., Any], tuple[Any, ...]], Any]  # runs a function in a fresh process


def pairs(args: argparse.Namespace, train: Train) -> dict[str, Any]:
    """The `pairs` subcommand (module doc): trains the plan (`train(fn, args)` runs one run's
    function in a process of its own), prints the tables and returns the record it wrote."""
    import shutil

    from bench.training.async_rl import kept_row, run_one, share_start, share_start_overrides

    out = Path(args.out)
    if args.ablation:
        if len(args.etas) != 1:
            raise SystemExit(f"--ablation --etas {' '.join(map(str, args.etas))}: give one eta")
        base, others = ablation_arms(args.etas[0], args.threads)
    else:
        base, others = speed_arms(args.etas, args.base_threads, args.threads)
    seeds = list(args.seeds) if args.seeds else list(range(args.repeats))
    if len(seeds) < args.repeats:
        raise SystemExit(f"--seeds {' '.join(map(str, seeds))}: one seed per repeat, {args.repeats} repeats")
    runs = plan(base, others, seeds[: args.repeats])
    out.mkdir(parents=True, exist_ok=True)
    if args.from_run:
        start = Path(args.from_run)
        if start.resolve().is_relative_to(out.resolve()):
            raise SystemExit(f"--from-run {start} is inside this bench's folder {out}: give another --out")
    else:  # built once with the base arm's settings; kept while they are the same
        start = out / "start"
        settings = {"config": args.config, "overrides": [*args.overrides, *base.overrides]}
        try:
            same = json.loads((start / START).read_text()) == settings
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(start, ignore_errors=True)
            print("[start] warm start and reference state", flush=True)
            train(build_start, (args.config, settings["overrides"], str(start)))
    shared = share_start_overrides(start)
    machine = machine_record(PACKAGES)
    header = {
        "machine_line": machine_line(PACKAGES, record=machine),
        "machine": machine,
        "command": ["python", *sys.argv],
        "start": str(start),
        "base": asdict(base),
        "plan": [{**asdict(p), "folder": p.folder} for p in runs],
    }
    rows: list[dict[str, Any]] = []
    for p in runs:
        run_dir = out / p.folder
        overrides = run_overrides(p, args.overrides, shared, args.steps)
        row = kept_row(run_dir, args.config, overrides)
        if row is not None:
            print(f"[{p.folder}] finished earlier with the same settings, kept", flush=True)
        else:
            if run_dir.exists():  # a run stopped part-way, or one of other settings: this bench's own folder
                shutil.rmtree(run_dir)
            share_start(start, run_dir)
            print(f"[{p.folder}] training {p.arm.name}, seed {p.seed}", flush=True)
            row = train(run_one, (args.config, overrides, str(run_dir)))
        rows.append(row)
        write_record(out / RECORD, {**header, "rows": rows, "summary": summary(runs, rows)})
    for line in table(runs, rows, base):
        print(line)
    if args.repeats < 3:
        print(f"\n{args.repeats} pair(s) an arm: a smoke check, not a figure (at least 3 pairs, --repeats)")
    return {**header, "rows": rows, "summary": summary(runs, rows)}
