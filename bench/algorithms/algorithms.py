"""Advantage estimators from one shared warm start, each at its own learning rate, on the demo's
synthetic world (not run in CI).

Design:
- one warm start shared by every run (`--warm-steps` SFT steps, seed `--warm-seed`), so only the RL
  seed varies between seeds; the PVPO anchor, Group Sampling's partition and the GT trajectories
  are built once from it (`algorithms_runs.py` says why that changes no number);
- questions: RL prompts, warm-start questions, validation and test, no question in two sets;
- per (algorithm, N): a learning-rate sweep over `--lr-grid` on `--sweep-seeds`, judged by
  validation EM at the end of the run; then `--seeds` at the picked lr, evaluated on test only;
- every run trains `--steps` steps (the same for every algorithm and N, as the paper's Fig. 4
  compares N=2 and N=5), with `--evals` test evaluations;
- `results.md`: the sweep, a table per (algorithm, N) with the three cost measures (the paper's,
  amortised over `--amortise-epochs`, all-in), paired comparisons on the same test questions, and
  the verdict on the Fig. 4 question with its power (`algorithms_report.py`); the plot (`--plot`).
- every finished run's results go to `--results` (`algorithms_results.py`: small JSON, shipped in
  the repository), and the report is computed from them alone: `--report-only` recomputes it, the
  documentation's block (`--readme docs/benchmarks/algorithms.md` rewrites it) and the plot, byte for
  byte, without the runs' folders (`--out`, which only holds the runs themselves and results.md).
- `--lr-from DIR`: no sweep; each (algorithm, N) at the lr another benchmark's sweep picked (its
  `--results`), e.g. to run the same arms longer.
Algorithms are estimator names (`pvpo`, `grpo`, `dr_grpo`, `rloo`, `gdpo`, `v05`, `v05_value`,
`ppo`); a `+gs` suffix turns on Group Sampling with GT trajectories; `all` is every registered
estimator plus `pvpo+gs`. A finished run is kept (an interrupted benchmark resumes).

Learning-rate grid: 3e-5, 1e-4, 3e-4, 1e-3, the same for every estimator (none gets a finer
search). AdamW's step is invariant to the loss's scale, so GRPO's division by the group's std or
Dr.GRPO's constant-length normaliser does not shift an estimator's good lr by their factor. The grid
reaches down to 3e-5 because trial runs (one seed each, test EM from 0.538 after 60 steps) had
GRPO at N=5 collapse at the demo's 3e-4 (0.013) and gain at 1e-4 (0.609) and 3e-5 (0.641), while
PVPO+GS at N=2 gained at 3e-4 (0.737); 1e-3 brackets PVPO+GS from above. One sweep seed: lrs
whose validation EM differs by less than a seed's spread (about 0.1 EM for GRPO) are not told
apart, and results.md flags a pick at the grid's edge.

Warm start: the demo's SFT (128 oracle questions, lr 3e-3, batch 16) from seed 0. Validation EM
against its length, on this machine: 360 steps 0.161, 362 0.510, 365 0.090, 370 0.697, 380 0.768,
400 0.826, 480 0.852: the policy learns two-hop questions between 360 and 370 steps, where the EM
is not monotone in the length and another CPU's float kernels may move it. So `--warm-steps` is a
list tried in order until one lands in `--warm-band` (validation EM 0.3-0.6; the closest to its
centre when none does): 362 steps here, validation 0.510, test 0.538 (1-hop 0.69, 2-hop 0.50),
room to gain and to lose.

Sizing, for <= 90 minutes on 2 cores. Measured on this 2-core AMD EPYC VM under `nice -n 19` beside
another engineer's experiment (load average 2.6-3.0; each run got a whole core, its retriever
queries included), so upper bounds: the warm phase 113 s (SFT 82 s; anchor 339 prompts x M=4 =
1,356 rollouts 25 s; 128 GT replays; 155 + 156 greedy evaluations, 3 s each); one run of 60 steps
x 8 prompts with 4 test evaluations: N=5 95-106 s, N=2 36-49 s. The headline benchmark has 5
algorithms x 2 N = 10 (algorithm, N): the sweep 4 lrs x 1 seed = 40 runs, the final 6 seeds = 60
runs; 50 runs at N=5 x 105 s + 50 at N=2 x 50 s = 7,750 core-seconds, over --jobs 2 (two processes
of one torch thread; the loopback retriever in the parent) 3,875 s = 65 min, plus the warm phase:
about 67 min, leaving a quarter of the 90 for load and the last run's tail. Each extra final seed
adds about 6.5 minutes. Trial runs' seed spread (3 seeds): PVPO+GS N=2 at 3e-4 EM 0.737 / 0.731 /
0.827, GRPO N=5 at 1e-4 0.609 / 0.814 / 0.635: the headline difference's s.e. is 0.019 over
questions (paired) and 0.072 over seeds at 3 seeds, about 0.054 together extrapolated to 6 seeds
(8 would reach 0.048): the seeds, not the questions, set the power.

    python bench/algorithms/algorithms.py [--algorithms pvpo+gs,pvpo,grpo,dr_grpo,rloo | all] [--n 2,5]
        [--seeds 0,1,2,3,4,5] [--sweep-seeds 100] [--lr-grid 3e-5,1e-4,3e-4,1e-3 | --lr-from DIR]
        [--steps 60] [--evals 4] [--jobs 2] [--amortise-epochs 10] [--warm-steps 362,360,...]
        [--warm-band 0.3,0.6] [--out runs/bench_algorithms] [--results bench/results/algorithms]
        [--plot PNG] [--readme docs/benchmarks/algorithms.md] [key=value ...]
    python bench/algorithms/algorithms.py --report-only [--results DIR] [--out DIR] [--readme docs/benchmarks/algorithms.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.algorithms.algorithms_report import Key, pick_lr, readme_block, report  # noqa: E402
from bench.algorithms.algorithms_results import (  # noqa: E402
    check_results,
    export,
    invocation_record,
    load_warm,
    read_bench,
    save_bench,
    settings_record,
    stored_runs,
)
from bench.algorithms.algorithms_runs import (  # noqa: E402
    Job,
    Settings,
    algorithm_overrides,
    build_testbed,
    check_settings,
    run_one,
    warm_phase,
)
from pvpo.machine import machine_record  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
HEADLINE_ALGORITHMS = "pvpo+gs,pvpo,grpo,dr_grpo,rloo"
DEFAULT_LR_GRID = "3e-5,1e-4,3e-4,1e-3"
DEFAULT_WARM_STEPS = "362,360,364,366,368,370"


def parse_algorithms(spec: str) -> list[str]:
    """Algorithm names from a comma list (`all`: pvpo+gs and every registered estimator), each checked."""
    from pvpo.trainer.algorithms.spec import available_estimators

    names = ["pvpo+gs", *available_estimators()] if spec == "all" else [a for a in spec.split(",") if a]
    if not names:
        raise SystemExit("--algorithms: give at least one algorithm")
    for a in names:
        algorithm_overrides(a)
    return list(dict.fromkeys(names))


def parse_numbers(spec: str, what: str, kind: Callable[[str], Any]) -> list[Any]:
    """A comma list of numbers (`kind`), refusing an empty or malformed one in one line."""
    try:
        values = [kind(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{what}: expected a comma-separated list of numbers, got {spec!r}") from None
    if not values:
        raise SystemExit(f"{what}: give at least one value")
    return list(dict.fromkeys(values))


def sweep_jobs(algs: Sequence[str], ns: Sequence[int], grid: Sequence[float], seeds: Sequence[int]) -> list[Job]:
    """The sweep's runs (none for a grid of one value: there is nothing to pick)."""
    if len(grid) < 2:
        return []
    return [Job("sweep", a, n, lr, s) for n in ns for a in algs for lr in grid for s in seeds]


def final_jobs(picks: dict[Key, float], seeds: Sequence[int]) -> list[Job]:
    """The final (test) runs: every seed of each (algorithm, N) at its picked lr."""
    return [Job("final", a, n, lr, s) for (a, n), lr in picks.items() for s in seeds]


def finished(out: Path, jobs: Sequence[Job]) -> dict[Job, dict[str, Any]]:
    """The jobs whose run has finished, with their summaries."""
    done = {}
    for j in jobs:
        path = j.run_dir(out) / "result.json"
        if path.exists():
            done[j] = json.loads(path.read_text())
    return done


def sweep_scores(jobs: Sequence[Job], done: dict[Job, dict[str, Any]]) -> dict[Key, dict[float, list[float]]]:
    """(algorithm, N) -> lr -> validation EM per finished sweep seed."""
    out: dict[Key, dict[float, list[float]]] = {}
    for j in jobs:
        if j in done:
            out.setdefault((j.alg, j.n), {}).setdefault(j.lr, []).append(done[j]["em"])
    return out


def picks_from(
    algs: Sequence[str], ns: Sequence[int], grid: Sequence[float], sweep: Sequence[Job], done: dict[Job, dict[str, Any]]
) -> dict[Key, float]:
    """The lr of each (algorithm, N) whose sweep has finished (the grid's only value without a sweep)."""
    if len(grid) == 1:
        return {(a, n): grid[0] for n in ns for a in algs}
    scores = sweep_scores(sweep, done)
    need = {(j.alg, j.n): 0 for j in sweep}
    for j in sweep:
        need[(j.alg, j.n)] += 1
    return {k: pick_lr(scores[k]) for k in need if sum(len(v) for v in scores.get(k, {}).values()) == need[k]}


@dataclass(frozen=True)
class Plan:
    """The benchmark's runs: the sweep's, and the final seeds of each (algorithm, N) once its sweep
    has picked a learning rate (or at the `fixed` learning rates, without a sweep)."""

    algs: tuple[str, ...]
    ns: tuple[int, ...]
    grid: tuple[float, ...]
    sweep: tuple[Job, ...]
    seeds: tuple[int, ...]
    fixed: dict[Key, float] | None = None

    def picks(self, out: Path) -> dict[Key, float]:
        if self.fixed is not None:
            return dict(self.fixed)
        return picks_from(self.algs, self.ns, self.grid, self.sweep, finished(out, self.sweep))

    def ready_finals(self, out: Path) -> list[Job]:
        """The final runs of every (algorithm, N) whose learning rate is known."""
        return final_jobs(self.picks(out), self.seeds)


def picks_of(results: Path, algs: Sequence[str], ns: Sequence[int]) -> dict[Key, float]:
    """The learning rates another benchmark's sweep picked (its results directory), for `algs` x `ns`."""
    plan = read_bench(results)["plan"]
    need = len(plan["lr_grid"]) * len(plan["sweep_seeds"])
    scores: dict[Key, dict[float, list[float]]] = {}
    for r in stored_runs(results, "sweep"):
        scores.setdefault((r["alg"], r["n"]), {}).setdefault(r["lr"], []).append(r["em"])
    missing = [f"{a} N={n}" for n in ns for a in algs if sum(map(len, scores.get((a, n), {}).values())) < need]
    if missing:
        raise SystemExit(f"--lr-from {results}: the sweep of {', '.join(missing)} has not finished there")
    return {(a, n): pick_lr(scores[(a, n)]) for n in ns for a in algs}


def run_plan(
    settings: Settings,
    testbed: Any,
    warm: dict[str, Any],
    plan: Plan,
    searcher: Any,
    url: str,
    n_jobs: int,
    on_done: Callable[[Job, dict[str, Any]], None] | None = None,
) -> int:
    """Run every unfinished run of `plan`, `n_jobs` processes at a time (one torch thread each),
    the largest N first; an (algorithm, N)'s final runs are queued as soon as its sweep is done, so
    no process waits for the whole sweep. One line per finished run, and `on_done(job, summary)`;
    returns how many ran."""
    out, t0, k = settings.out, time.perf_counter(), 0

    def todo(jobs: Sequence[Job]) -> list[Job]:
        return sorted((j for j in jobs if not (j.run_dir(out) / "result.json").exists()), key=lambda j: -j.n)

    def line(j: Job, r: dict[str, Any]) -> None:
        nonlocal k
        k += 1
        if on_done is not None:
            on_done(j, r)
        print(
            f"[{k}] {j.stage} {j.alg} N={j.n} lr={j.lr:g} seed={j.seed}: {r['split']} EM {r['em']:.3f}, "
            f"{r['wall_s']:.0f} s ({time.perf_counter() - t0:.0f} s so far)",
            file=sys.stderr,
            flush=True,
        )

    if n_jobs <= 1:
        for j in todo(plan.sweep):
            line(j, run_one(settings, testbed, warm, j, searcher))
        for j in todo(plan.ready_finals(out)):
            line(j, run_one(settings, testbed, warm, j, searcher))
        return k
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    from bench.algorithms.algorithms_runs import init_worker, work

    with ProcessPoolExecutor(
        max_workers=n_jobs,
        mp_context=mp.get_context("spawn"),
        initializer=init_worker,
        initargs=(settings, testbed, warm, url),
    ) as pool:
        running: dict[Future[dict[str, Any]], Job] = {}
        queued: set[Job] = set()

        def submit(jobs: Sequence[Job]) -> None:
            for j in todo(jobs):
                if j not in queued:
                    queued.add(j)
                    running[pool.submit(work, j)] = j

        try:
            submit(plan.sweep)
            submit(plan.ready_finals(out))
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    line(running.pop(f), f.result())
                submit(plan.ready_finals(out))
        except BaseException:  # a failed run or ^C: stop queueing (the finished runs are kept)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return k


def report_from(results: Path, out: Path, readme: Path | None = None, plot: Path | None = None) -> str:
    """The report of the results directory `results` alone (`algorithms_results`): `results.md`
    in `out`, the plot at `plot` (default: where its plan says), and with `readme` that page's
    block of `results` rewritten in place. Returns results.md's text followed by the block."""
    doc = read_bench(results)
    plan, settings = doc["plan"], doc["settings"]
    warm = load_warm(results / "warm.json")
    sweep_runs, final_runs = stored_runs(results, "sweep"), stored_runs(results, "final")
    sweep: dict[Key, dict[float, list[float]]] = {}
    for r in sweep_runs:
        sweep.setdefault((r["alg"], r["n"]), {}).setdefault(r["lr"], []).append(r["em"])
    final: dict[Key, list[dict[str, Any]]] = {}
    for r in final_runs:
        final.setdefault((r["alg"], r["n"]), []).append(r)
    for (a, n), runs in final.items():
        if len({r["lr"] for r in runs}) > 1:
            raise SystemExit(f"{results}: the final runs of {a} N={n} have several learning rates")
    lrs = (
        f"learning rates picked by the sweep of {plan['lr_from']}"
        if plan.get("lr_from")
        else f"lr grid {', '.join(f'{x:g}' for x in plan['lr_grid'])} on sweep seeds {plan['sweep_seeds']}"
    )
    lines = [
        f"results: {_rel(results)} ({len(sweep_runs)} sweep + {len(final_runs)} final runs)",
        f"settings: {settings['steps']} RL steps per run, {settings['evals']} test evaluations per final run, config "
        f"{settings['config']} (sha256 {settings['config_sha256'][:12]}), overrides {settings['overrides']}; {lrs}, "
        f"final seeds {plan['seeds']}",
    ]
    for inv in doc["invocations"]:
        m = inv["machine"]
        lines.append(
            f"ran: {inv['command']} ({inv['runs_trained']} runs, {inv['wall_s']} s wall, finished {inv['finished_utc']} "
            f"UTC) on {m['cpu']}, {m['cores']} cores ({', '.join(m['flags'])}), Python {m['python']}, torch {m['torch']}, "
            f"transformers {m['transformers']}, commit {m['commit']}; niceness {inv['niceness']}, load average "
            f"{inv['load_average'][0]} at its start, {inv['load_average'][1]} at its end"
        )
    run_s = sum(r["wall_s"] for r in [*sweep_runs, *final_runs])
    lines.append(f"the runs' own wall time {run_s:.0f} s plus the warm phase {warm['wall_s']:.0f} s")
    text = report(
        header="\n".join(lines) + "\n",
        warm=warm,
        sweep=sweep,
        grid=plan["lr_grid"],
        final=final,
        epochs=plan["amortise_epochs"],
        out=out,
        plot=plot if plot is not None else REPO / plan["plot"],
    )
    block = readme_block(
        final, warm, sweep, plan["lr_grid"], plan["amortise_epochs"], plan.get("lr_from"), record=lines
    )
    if readme is not None and final:
        replace_readme_block(readme, _rel(results), block)
    return text + "\n" + block


def _rel(path: Path) -> str:
    """`path` relative to the repository when inside it (as the results record paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def readme_markers(source: str) -> tuple[str, str]:
    """The lines around the documentation block of the results directory `source`."""
    return (
        f"<!-- generated by `python bench/algorithms/algorithms.py --report-only --results {source}`: do not edit -->",
        f"<!-- end of the block generated from {source} -->",
    )


def readme_block_of(text: str, source: str) -> str | None:
    """The block of `source` in a page's `text` (between its markers), or None."""
    begin, end = readme_markers(source)
    if begin not in text or end not in text:
        return None
    return text.split(begin + "\n", 1)[1].split(end, 1)[0]


def replace_readme_block(readme: Path, source: str, block: str) -> None:
    """Rewrite the block of `source` in `readme` (its markers must be there already)."""
    text = readme.read_text(encoding="utf-8")
    old = readme_block_of(text, source)
    begin, end = readme_markers(source)
    if old is None:
        raise SystemExit(f"--readme {readme}: no block for {source}; put the lines\n{begin}\n{end}\nwhere it goes")
    readme.write_text(text.replace(begin + "\n" + old + end, begin + "\n" + block + end, 1), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--algorithms", default=HEADLINE_ALGORITHMS, help="comma list, or 'all'")
    ap.add_argument("--n", default="2,5", help="rollouts per prompt, comma-separated")
    ap.add_argument("--seeds", default="0,1,2,3,4,5", help="RL seeds of the final (test) runs")
    ap.add_argument("--sweep-seeds", default="100", help="RL seeds of the lr sweep (validation)")
    ap.add_argument("--lr-grid", default=DEFAULT_LR_GRID, help="learning rates swept per (algorithm, N)")
    ap.add_argument(
        "--lr-from", type=Path, default=None, help="no sweep: the lrs another benchmark's sweep picked (its --results)"
    )
    ap.add_argument("--steps", type=int, default=60, help="RL steps per run")
    ap.add_argument("--evals", type=int, default=4, help="test evaluations per final run (the last at its end)")
    ap.add_argument(
        "--warm-steps",
        default=DEFAULT_WARM_STEPS,
        help="SFT lengths of the shared warm start, tried in order (see --warm-band)",
    )
    ap.add_argument("--warm-band", default="0.3,0.6", help="validation EM the shared warm start should have: lo,hi")
    ap.add_argument("--warm-seed", type=int, default=0)
    ap.add_argument("--amortise-epochs", type=float, default=10.0, help="E of the amortised cost measure")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one torch thread each")
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_algorithms"), help="the runs' folders, results.md")
    ap.add_argument(
        "--results", type=Path, default=REPO / "bench" / "results" / "algorithms", help="the per-run results (shipped)"
    )
    ap.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="the plot's path (default: <results>/em_vs_cost.png, or as recorded there)",
    )
    ap.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="rewrite the block of --results in this page (docs/benchmarks/algorithms.md, between its markers)",
    )
    ap.add_argument(
        "--report-only", action="store_true", help="recompute the report from --results alone (trains nothing)"
    )
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config, for every run")
    args = ap.parse_args(argv)
    if args.report_only:
        print(report_from(args.results, args.out, args.readme, args.plot))
        print(f"wrote {args.out / 'results.md'}", file=sys.stderr)
        return
    for flag, v in (("--steps", args.steps), ("--evals", args.evals), ("--jobs", args.jobs)):
        if v < 1:
            raise SystemExit(f"{flag} must be >= 1, got {v}")
    if args.evals > args.steps:
        raise SystemExit(f"--evals {args.evals} is more than --steps {args.steps}")
    if args.amortise_epochs <= 0:
        raise SystemExit(f"--amortise-epochs must be > 0, got {args.amortise_epochs}")
    algs = parse_algorithms(args.algorithms)
    ns = parse_numbers(args.n, "--n", int)
    seeds = parse_numbers(args.seeds, "--seeds", int)
    sweep_seeds = parse_numbers(args.sweep_seeds, "--sweep-seeds", int)
    grid = sorted(parse_numbers(args.lr_grid, "--lr-grid", float))
    if any(n < 1 for n in ns) or any(lr <= 0 for lr in grid):
        raise SystemExit("--n must be >= 1 and every --lr-grid value > 0")
    warm_steps = parse_numbers(args.warm_steps, "--warm-steps", int)
    band = parse_numbers(args.warm_band, "--warm-band", float)
    if any(k < 1 for k in warm_steps) or len(band) != 2 or not 0 <= band[0] <= band[1] <= 1:
        raise SystemExit("--warm-steps must be >= 1 and --warm-band two EMs lo,hi with 0 <= lo <= hi <= 1")
    settings = Settings(
        args.config,
        tuple(args.overrides),
        args.out,
        args.steps,
        args.evals,
        tuple(warm_steps),
        args.warm_seed,
        (band[0], band[1]),
    )
    if not args.config.exists():
        raise SystemExit(f"--config {args.config}: no such file")
    fixed = picks_of(args.lr_from, algs, ns) if args.lr_from is not None else None
    check_settings(settings)
    doc = check_results(args.results, settings_record(settings))
    t_start, load_start, machine = time.perf_counter(), os.getloadavg()[0], machine_record()
    command = f"python bench/algorithms/algorithms.py {shlex.join(argv if argv is not None else sys.argv[1:])}"
    print(f"command: {command}\n", file=sys.stderr)
    sweep = [] if fixed is not None else sweep_jobs(algs, ns, grid, sweep_seeds)
    plan = Plan(tuple(algs), tuple(ns), tuple(grid), tuple(sweep), tuple(seeds), fixed)
    import torch

    from pvpo.retriever.build import build_index
    from pvpo.retriever.client import RetrieverClient
    from pvpo.retriever.server import BackgroundServer

    torch.set_num_threads(1)  # the loopback retriever's query encoder: one thread beside the runs
    testbed = build_testbed(settings, args.out)
    index = args.out / "index"
    if not (index / "meta.json").exists():
        from bench.algorithms.algorithms_runs import config

        build_index(testbed.data.corpus_path, index, model=config(settings, []).retriever.encoder)
    topk = _topk(settings)
    # the plan of every invocation into these results together (e.g. two invocations for two sets of arms)
    old = doc["plan"]
    doc["plan"] = {
        "algorithms": _union(old.get("algorithms", []), algs),
        "n": _union(old.get("n", []), ns),
        "seeds": _union(old.get("seeds", []), seeds),
        "sweep_seeds": _union(old.get("sweep_seeds", []), [] if fixed is not None else sweep_seeds),
        "lr_grid": sorted(_union(old.get("lr_grid", []), grid if fixed is None else sorted(set(fixed.values())))),
        "lr_from": _rel(args.lr_from) if args.lr_from is not None else None,
        "amortise_epochs": args.amortise_epochs,
        "plot": _rel(args.plot) if args.plot is not None else old.get("plot", _rel(args.results / "em_vs_cost.png")),
    }
    # this invocation's record, rewritten after each run it trains: an interrupted one keeps its share
    doc["invocations"].append(invocation_record(command, machine, t_start, load_start, 0))
    save_bench(args.results, doc)

    def on_done(job: Job, result: dict[str, Any]) -> None:
        export(args.results, None, {(job.stage, job.name): result})
        doc["invocations"][-1] = invocation_record(
            command, machine, t_start, load_start, doc["invocations"][-1]["runs_trained"] + 1
        )
        save_bench(args.results, doc)

    with BackgroundServer(str(index)) as server, RetrieverClient(server.url, topk=topk) as searcher:
        warm = warm_phase(settings, testbed, searcher)
        export(args.results, warm, {})
        run_plan(settings, testbed, warm, plan, searcher, server.url, args.jobs, on_done)
    if not doc["invocations"][-1]["runs_trained"]:
        doc["invocations"].pop()
    done = {**finished(args.out, sweep), **finished(args.out, plan.ready_finals(args.out))}
    export(args.results, warm, {(j.stage, j.name): r for j, r in done.items()})  # those of earlier invocations too
    save_bench(args.results, doc)
    print(report_from(args.results, args.out, args.readme))
    print(f"wrote {args.results} and {args.out / 'results.md'}", file=sys.stderr)


def _union(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys([*a, *b]))


def _topk(settings: Settings) -> int:
    from bench.algorithms.algorithms_runs import config

    return int(config(settings, []).retriever.topk)


if __name__ == "__main__":
    main()
