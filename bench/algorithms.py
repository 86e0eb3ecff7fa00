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
  the verdict on the Fig. 4 question with its power (`algorithms_report.py`); `em_vs_cost.png`.
Algorithms are estimator names (`pvpo`, `grpo`, `dr_grpo`, `rloo`, `gdpo`, `v05`, `v05_value`,
`ppo`); a `+gs` suffix turns on Group Sampling with GT trajectories; `all` is every registered
estimator plus `pvpo+gs`. A finished run is kept (an interrupted benchmark resumes), and
`--report-only` writes the report from the finished runs.

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

    python bench/algorithms.py [--algorithms pvpo+gs,pvpo,grpo,dr_grpo,rloo | all] [--n 2,5]
        [--seeds 0,1,2,3,4,5] [--sweep-seeds 100] [--lr-grid 3e-5,1e-4,3e-4,1e-3] [--steps 60]
        [--evals 4] [--jobs 2] [--amortise-epochs 10] [--warm-steps 362,360,...] [--warm-band 0.3,0.6]
        [--out runs/bench_algorithms] [--report-only] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the sibling modules (script or test import)
    sys.path.insert(0, str(HERE))

from algorithms_report import Key, pick_lr, report  # noqa: E402
from algorithms_runs import (  # noqa: E402
    Job,
    Settings,
    algorithm_overrides,
    build_testbed,
    check_settings,
    run_one,
    warm_phase,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = HERE.parent
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
    has picked a learning rate."""

    algs: tuple[str, ...]
    ns: tuple[int, ...]
    grid: tuple[float, ...]
    sweep: tuple[Job, ...]
    seeds: tuple[int, ...]

    def ready_finals(self, out: Path) -> list[Job]:
        """The final runs of every (algorithm, N) whose sweep has finished."""
        return final_jobs(picks_from(self.algs, self.ns, self.grid, self.sweep, finished(out, self.sweep)), self.seeds)


def run_plan(
    settings: Settings, testbed: Any, warm: dict[str, Any], plan: Plan, searcher: Any, url: str, n_jobs: int
) -> None:
    """Run every unfinished run of `plan`, `n_jobs` processes at a time (one torch thread each),
    the largest N first; an (algorithm, N)'s final runs are queued as soon as its sweep is done, so
    no process waits for the whole sweep. One line per finished run."""
    out, t0, k = settings.out, time.perf_counter(), 0

    def todo(jobs: Sequence[Job]) -> list[Job]:
        return sorted((j for j in jobs if not (j.run_dir(out) / "result.json").exists()), key=lambda j: -j.n)

    def line(j: Job, r: dict[str, Any]) -> None:
        nonlocal k
        k += 1
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
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    from algorithms_runs import init_worker, work

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


def machine() -> str:
    import torch

    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}, "
        f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f} at the start"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--algorithms", default=HEADLINE_ALGORITHMS, help="comma list, or 'all'")
    ap.add_argument("--n", default="2,5", help="rollouts per prompt, comma-separated")
    ap.add_argument("--seeds", default="0,1,2,3,4,5", help="RL seeds of the final (test) runs")
    ap.add_argument("--sweep-seeds", default="100", help="RL seeds of the lr sweep (validation)")
    ap.add_argument("--lr-grid", default=DEFAULT_LR_GRID, help="learning rates swept per (algorithm, N)")
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
    ap.add_argument("--out", type=Path, default=Path("runs/bench_algorithms"))
    ap.add_argument("--report-only", action="store_true", help="write the report from the finished runs only")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config, for every run")
    args = ap.parse_args(argv)
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
    check_settings(settings)
    t_start = time.perf_counter()
    header = f"machine: {machine()}\ncommand: python bench/algorithms.py {shlex.join(argv if argv is not None else sys.argv[1:])}\n"
    print(header, file=sys.stderr)
    sweep = sweep_jobs(algs, ns, grid, sweep_seeds)
    if not args.report_only:
        import torch

        from pvpo.retriever.build import build_index
        from pvpo.retriever.client import RetrieverClient
        from pvpo.retriever.server import BackgroundServer

        torch.set_num_threads(1)  # the loopback retriever's query encoder: one thread beside the runs
        testbed = build_testbed(settings, args.out)
        index = args.out / "index"
        if not (index / "meta.json").exists():
            from algorithms_runs import config

            build_index(testbed.data.corpus_path, index, model=config(settings, []).retriever.encoder)
        topk = _topk(settings)
        with BackgroundServer(str(index)) as server, RetrieverClient(server.url, topk=topk) as searcher:
            warm = warm_phase(settings, testbed, searcher)
            plan = Plan(tuple(algs), tuple(ns), tuple(grid), tuple(sweep), tuple(seeds))
            run_plan(settings, testbed, warm, plan, searcher, server.url, args.jobs)
    warm_path = args.out / "warm" / "summary.json"
    if not warm_path.exists():
        raise SystemExit(f"{args.out}: no finished warm start ({warm_path}); run without --report-only first")
    warm = json.loads(warm_path.read_text())
    done_sweep = finished(args.out, sweep)
    picks = picks_from(algs, ns, grid, sweep, done_sweep)
    for a, n in ((a, n) for n in ns for a in algs):
        if (a, n) not in picks:
            print(f"sweep not finished, left out: {a} N={n}", file=sys.stderr)
    done_final = finished(args.out, final_jobs(picks, seeds))
    final: dict[Key, list[dict[str, Any]]] = {}
    for j, r in done_final.items():
        final.setdefault((j.alg, j.n), []).append(r)
    wall = time.perf_counter() - t_start
    run_s = sum(r["wall_s"] for r in [*done_sweep.values(), *done_final.values()])
    header += (
        f"settings: {args.steps} RL steps per run, {args.evals} test evaluations per final run, lr grid "
        f"{', '.join(f'{x:g}' for x in grid)} on sweep seeds {sweep_seeds}, final seeds {seeds}, {args.jobs} runs at once "
        f"(one torch thread each); this invocation {wall:.0f} s, the runs' own wall time {run_s:.0f} s "
        f"({len(done_sweep)} sweep + {len(done_final)} final runs) plus the warm phase {warm['wall_s']:.0f} s\n"
    )
    text = report(
        header=header,
        warm=warm,
        sweep=sweep_scores(sweep, done_sweep),
        grid=grid,
        final=final,
        epochs=args.amortise_epochs,
        out=args.out,
    )
    print(text)
    print(f"wrote {args.out / 'results.md'}" + (f" and {args.out / 'em_vs_cost.png'}" if final else ""))


def _topk(settings: Settings) -> int:
    from algorithms_runs import config

    return int(config(settings, []).retriever.topk)


if __name__ == "__main__":
    main()
