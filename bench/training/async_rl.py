"""Rollouts beside the update (`rollout.max_staleness: eta`), measured.

`pipeline`: one config (the demo, or the multi-hop recipe's RL phase) trained at each eta from the
same start: the first run warm-starts the policy and builds the anchor, Group Sampling's partition
and the GT cache; the others load that initial policy and reuse that reference state
(`algorithm.anchor.reuse_from`), so the runs differ in eta alone. Per eta: the RL steps' wall time
(`Trainer.run` but its held-out evaluations and the reference built before step 1: steps, logging
and checkpoints, during which rollouts beside the update go on), the policy's own rollouts per
second of it (anchor and GT generation excluded), the engine's idle share and the update's wait
(means over the steps), the tokens' staleness, the clamp's share, and held-out EM after RL with
its paired difference to the first eta's of the same seed (same questions, in s.e.). With `--seeds`
each eta is trained once per `run.seed`, all from the first run's start, and a second table gives
each eta's mean over seeds and its difference to the first eta with a standard error that counts
both etas' seed spreads (`pvpo.stats.seeds_contrast`): one seed's paired s.e. counts the questions,
not how far another seed's training would land.

`trl`: our step beside TRL's `GRPOTrainer` on the same model (our run's initial policy, warm-started
here or taken from a `pipeline` run with `--from-run`), the same prompts (the config's RL prompts),
group size, per-turn and per-episode token limits, temperature, learning rate, KL weight and CPU
threads, in one process: single-turn (`--turns 1`: TRL's own generation, ended at EOS and at the
protocol's stop tags as ours ends a turn, as EOS ids where each tag is one token, else as
transformers' stop strings; our reward function on the completion) or multi-turn through our TRL
adapter (`pvpo.integrations.trl.SearchRollout`: the same episode driver and retriever). Our side runs
at eta = 0 and 1, RL steps only (no evaluation). Rollouts and model tokens per second over the steps
after the first (the anchor's build, TRL's warm-up), model tokens per rollout (both sides should
end turns alike) and the share of rows the update ran (ours skips a row whose loss is zero).

`pairs` (bench/training/async_rl_pairs.py): the fair comparison, in interleaved, repeated pairs of runs from
one shared start: eta 0 at `run.threads: 2` against eta 1 and 2 at one thread a phase, or
(`--ablation`) the decoupled objective against naive PPO (`rollout.decoupled=false`) at one eta;
per run samples and tokens per second, engine idle, the staleness histogram and EM after RL, per
arm the pairs' speed ratios; OUT/record.json keeps every row.

Each prints the machine, the command and one table; `--out` keeps the runs. `pipeline` trains each
run in a process of its own and keeps its row in its folder (bench_row.json): a rerun keeps the runs
that finished with the same settings and trains the rest.

    python bench/training/async_rl.py pipeline --config demo --etas 0 1 2 --out runs/bench-async-demo
    python bench/training/async_rl.py pipeline --config demo --etas 0 1 2 --seeds 0 1 2 --out runs/bench-async-seeds
    python bench/training/async_rl.py pipeline --config real_smollm2_multihop --etas 0 1 2 \\
        --out runs/bench-async-multihop 'data.source=[DATA/hotpotqa/..., ...]'
    python bench/training/async_rl.py pipeline --config RUN/config.yaml --from-run RUN --etas 0 1 2 --steps 8 \\
        --out runs/bench-async-multihop-speed   # the recipe's RL phase from a finished recipe run's start
    python bench/training/async_rl.py pairs --config demo --etas 1 2 --repeats 3 --out runs/bench-async-pairs-demo
    python bench/training/async_rl.py pairs --config demo --ablation --etas 2 --repeats 3 --out runs/bench-async-ablation
    python bench/training/async_rl.py trl --config demo --turns 1 --steps 8 --from-run runs/bench-async-demo/eta0
    python bench/training/async_rl.py trl --config demo --turns 3 --steps 8 --from-run runs/bench-async-demo/eta0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: the repo root, for `bench.*` (bench/README.md)
    sys.path.insert(0, str(REPO))
from pvpo.machine import machine_line  # noqa: E402


class Timed:
    """Wraps a `Trainer`'s `train_step` (each step's wall time, its own rollouts and their model
    tokens) and `evaluate` (the evaluations' wall time)."""

    def __init__(self) -> None:
        self.evaluations = 0.0
        self.walls: list[float] = []
        self.rollouts: list[float] = []
        self.tokens: list[float] = []
        self.skipped: list[float] = []  # the share of rows whose forward and backward the update skipped
        self._last: dict[str, float] = {}

    def wrap(self, trainer: Any) -> None:
        step = trainer.train_step

        def timed(k: int) -> dict[str, float]:
            t0 = time.perf_counter()
            metrics = step(k)
            self.walls.append(time.perf_counter() - t0)
            keys = ("cost/cum_rollouts", "cost/cum_anchor_rollouts", "cost/cum_gt_rollouts")
            now = {key: metrics.get(key, 0.0) for key in keys}
            own = (now[keys[0]] - self._last.get(keys[0], 0.0)) - sum(
                now[key] - self._last.get(key, 0.0) for key in keys[1:]
            )
            self.rollouts.append(own)
            self.tokens.append(own * metrics.get("model_tokens", 0.0))
            self.skipped.append(metrics.get("update/skipped_rows_frac", 0.0))
            self._last = now
            return metrics

        trainer.train_step = timed
        evaluate = trainer.evaluate

        def timed_evaluation(*args: Any, **kwargs: Any) -> dict[str, float]:
            t0 = time.perf_counter()
            try:
                return evaluate(*args, **kwargs)
            finally:
                self.evaluations += time.perf_counter() - t0

        trainer.evaluate = timed_evaluation

    def per_second(self, skip: int = 0) -> float:
        """The policy's own rollouts per second of step wall time, the first `skip` steps left out."""
        wall = sum(self.walls[skip:])
        return sum(self.rollouts[skip:]) / wall if wall > 0 else float("nan")

    def tokens_per_second(self, skip: int = 0) -> float:
        """Their model tokens per second, likewise."""
        wall = sum(self.walls[skip:])
        return sum(self.tokens[skip:]) / wall if wall > 0 else float("nan")


@contextlib.contextmanager
def trainer_for(cfg: Any, run_dir: Path, searcher: Any | None = None) -> Iterator[tuple[Any, Any]]:
    """A `Trainer` over `cfg` in `run_dir` (created; files already there, e.g. an initial policy,
    are kept) with its retriever (`searcher`, or the config's: a loopback index built in the run
    dir), and that searcher."""
    from pvpo.trainer.data import load_data, retriever_session
    from pvpo.trainer.loop import Trainer
    from pvpo.trainer.setup import prepare_run

    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg, run_dir)
    session = (
        contextlib.nullcontext(searcher) if searcher is not None else retriever_session(cfg, run_dir, data.corpus_path)
    )
    with session as s, Trainer(cfg, run_dir, data, s, prepare_run(cfg, run_dir, data, s)) as trainer:
        yield trainer, s


def share_start(first: Path, run_dir: Path) -> None:
    """Copy the first run's initial policy and warm-start record into `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("initial_policy",):
        if (first / name).is_dir() and not (run_dir / name).exists():
            shutil.copytree(first / name, run_dir / name)
    if (first / "warm_start.json").exists():
        shutil.copyfile(first / "warm_start.json", run_dir / "warm_start.json")


def share_start_overrides(first: Path) -> list[str]:
    """The overrides that reuse the first run's anchor, partition and GT cache, and its index (the
    multi-hop recipe's 12,680 passages take minutes to encode)."""
    index = [f"retriever.index_dir={first / 'index'}"] if (first / "index" / "meta.json").exists() else []
    return [f"algorithm.anchor.reuse_from={first}", *index]


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def lag_histogram(steps: Sequence[dict[str, float]], eta: int) -> dict[str, float]:
    """Each step's `stale/lag_<j>` (j <= eta) and `stale/lag_over_eta`, averaged over the steps
    (every step trains one batch of about the same size); at eta = 0 (no such keys) all at lag 0."""
    keys = [f"stale/lag_{j}" for j in range(eta + 1)] + ["stale/lag_over_eta"]
    if not any(key in m for m in steps for key in keys):
        return {"lag_0": 1.0} if steps else {}
    return {key.removeprefix("stale/"): mean([m.get(key, 0.0) for m in steps]) for key in keys}


ROW = "bench_row.json"  # a finished run's row, kept in its folder: a rerun of the bench keeps the run


def run_one(config: str, overrides: list[str], run_dir: str) -> dict[str, Any]:
    """One run of `config` with `overrides` in `run_dir`, timed as the module docstring says; its row
    (also written to `run_dir`/bench_row.json). Called in a process of its own: a run's memory is not
    all returned before the next would start in the same process (three recipe runs in one process
    peaked at 12.4 GiB, one alone at 6.4 GiB)."""
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(resolve_config(config), overrides)
    timer = Timed()
    started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getloadavg()[0]
    with trainer_for(cfg, Path(run_dir)) as (trainer, _):
        trainer.ensure_reference(0)  # the anchor and GT set (the first run's; reused after): not timed
        timer.wrap(trainer)
        t0 = time.perf_counter()
        result = trainer.run()
        # the run's wall but its evaluations: rollouts beside the update also run while a step
        # logs and checkpoints, and pause while the policy is evaluated
        rl_wall = time.perf_counter() - t0 - timer.evaluations
    steps = result.metrics
    row = {
        "config": config,
        "overrides": overrides,
        "eta": cfg.rollout.max_staleness,
        "seed": cfg.run.seed,
        "steps": len(steps),
        "rl_wall_s": rl_wall,
        "samples_per_s": sum(timer.rollouts) / rl_wall,
        "idle": mean([m.get("time/engine_idle_frac", float("nan")) for m in steps]),
        "wait_s": mean([m.get("time/update_wait_s", float("nan")) for m in steps]),
        "stale": mean([m.get("stale/mean", 0.0) for m in steps]),
        "clamp": mean([m.get("mismatch/truncated_frac", 0.0) for m in steps]),
        "em": result.eval_after.get("eval/accuracy", float("nan")),
        "em_se": result.eval_after.get("eval/accuracy_se", float("nan")),
        "em_by_step": [m["eval/accuracy"] for m in steps if "eval/accuracy" in m],
        "per_question": result.eval_em.get("after", []),
        "threads": cfg.run.threads,
        "decoupled": cfg.rollout.decoupled,
        "tokens_per_s": sum(timer.tokens) / rl_wall,
        # the share of the trained model tokens at each lag (versions behind the update), over all
        # steps; stale/lag_over_eta: a straggler's first turns, eta + 1 behind (trainer/steps/pipelined.py)
        "lag": lag_histogram(steps, cfg.rollout.max_staleness),
        "late": mean([m.get("stale/late_frac", 0.0) for m in steps]),
        "stale_max": max([m.get("stale/max", 0.0) for m in steps], default=0.0),
        "kl_max": max([m.get("approx_kl", float("nan")) for m in steps], default=float("nan")),
        "peak_rss_gib": max([m.get("mem/process_peak_rss_gib", float("nan")) for m in steps], default=float("nan")),
        "started": started,
        "load_at_start": load,
    }
    (Path(run_dir) / ROW).write_text(json.dumps(row, indent=1) + "\n")
    return row


def kept_row(run_dir: Path, config: str, overrides: list[str]) -> dict[str, Any] | None:
    """The row of a run finished earlier in `run_dir` with the same config and overrides, else None."""
    try:
        row = json.loads((run_dir / ROW).read_text())
    except (OSError, ValueError):
        return None
    return row if (row.get("config"), row.get("overrides")) == (config, overrides) else None


def in_fresh_process(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn(*args)` in a process of its own ("spawn": nothing of the last run's memory or threads
    carried over)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def pipeline(args: argparse.Namespace) -> None:
    from pvpo.stats import paired_difference, seeds_contrast

    out = Path(args.out)
    seeds: list[int | None] = list(args.seeds) if args.seeds else [None]
    rows: list[dict[str, Any]] = []
    # the start every eta shares: a given run's (--from-run), else the first eta's own warm start
    first: Path | None = Path(args.from_run) if args.from_run else None
    for seed in seeds:
        for eta in args.etas:
            run_dir = out / (f"eta{eta}" if seed is None else f"eta{eta}_seed{seed}")
            extra = [] if first is None else share_start_overrides(first)
            overrides = [*args.overrides, *extra, f"rollout.max_staleness={eta}"]
            overrides += [f"run.seed={seed}"] if seed is not None else []
            if args.steps:
                overrides.append(f"run.steps={args.steps}")
            if first is not None and run_dir.resolve() == first.resolve():
                raise SystemExit(f"--from-run {first} is this bench's own run folder {run_dir}: give another --out")
            row = kept_row(run_dir, args.config, overrides)
            if row is not None:
                print(f"[{run_dir.name}] finished earlier with the same settings, kept", flush=True)
            else:
                if run_dir.exists():  # a run stopped part-way, or one of other settings: this bench's own folder
                    shutil.rmtree(run_dir)
                if first is not None:
                    share_start(first, run_dir)
                print(f"[{run_dir.name}] training", flush=True)
                row = in_fresh_process(run_one, (args.config, overrides, str(run_dir)))
            first = first or run_dir
            rows.append(row)
    print(
        "| eta | seed | steps | RL wall (s) | rollouts/s | engine idle | update wait (s) | staleness | clamp | "
        "EM after (the run's evaluated split) | by eval step | vs first eta, same seed (paired) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref = next(x for x in rows if x["seed"] == r["seed"])
        same = ref["per_question"] and len(ref["per_question"]) == len(r["per_question"])
        diff, se = paired_difference(ref["per_question"], r["per_question"]) if same else (float("nan"),) * 2
        versus = f"{diff:+.3f} ({diff / se:+.1f} s.e.)" if se else f"{diff:+.3f}"
        curve = " / ".join(f"{v:.3f}" for v in r["em_by_step"])
        print(
            f"| {r['eta']} | {r['seed']} | {r['steps']} | {r['rl_wall_s']:.0f} | {r['samples_per_s']:.3g} | "
            f"{r['idle']:.2f} | {r['wait_s']:.1f} | {r['stale']:.2f} | {r['clamp']:.3f} | "
            f"{r['em']:.3f} +- {r['em_se']:.3f} | {curve} | {versus} |"
        )
    if len(seeds) < 2:
        return
    print()
    print(
        f"| eta | seeds | rollouts/s, mean | EM after, mean (sd over seeds) | vs eta {args.etas[0]} (s.e. with seeds) |"
    )
    print("|---|---|---|---|---|")
    by_eta = {eta: [r for r in rows if r["eta"] == eta] for eta in args.etas}
    base = [r["per_question"] for r in by_eta[args.etas[0]]]
    for eta, rs in by_eta.items():
        c = seeds_contrast([r["per_question"] for r in rs], base)  # its sd_a: the spread of this eta's seeds
        versus = f"{c['mean']:+.3f} ({c['se']:.3f}, {c['mean'] / c['se']:+.1f} s.e.)" if c["se"] else "+0.000"
        print(
            f"| {eta} | {len(rs)} | {mean([r['samples_per_s'] for r in rs]):.3g} | "
            f"{mean([r['em'] for r in rs]):.3f} ({c['sd_a']:.3f}) | "
            f"{versus} |"
        )
    print(
        "\ns.e. with seeds: sqrt(se_q^2 + sd_a^2 / S_a + sd_b^2 / S_b), se_q the paired s.e. over questions of the "
        "seed-averaged EMs, sd the spread of each eta's per-seed means (pvpo.stats.seeds_contrast)"
    )


# ---- our step beside TRL's GRPOTrainer --------------------------------------------------------------
def trl_side(
    args: argparse.Namespace, cfg: Any, trainer: Any, searcher: Any, model_dir: Path, out: Path
) -> tuple[float, float]:
    """TRL's GRPOTrainer on the same model, prompts, limits and retriever: (rollouts, completion
    tokens) per second over the steps after the first."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from pvpo.integrations.trl import SearchRollout, search_reward
    from pvpo.reward import get_protocol, get_reward

    r, protocol = cfg.rollout, get_protocol(cfg.env.protocol)
    examples = trainer.data.train
    batch = cfg.data.prompts_per_step * r.n
    walls: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            walls.append(time.perf_counter() - self.t0)

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # single-turn: a turn ends at the protocol's stop strings, as ours: as EOS ids where each is one
    # token; otherwise as transformers' stop strings, which need the tokenizer that TRL's `generate`
    # call does not pass (bound here), with a stopped row padded by EOS, where TRL's mask ends it (a
    # turn is then ours plus that one EOS; without it TRL ran every turn to the token limit)
    stops = [tok.convert_tokens_to_ids(s) for s in protocol.stop_strings]
    generation: dict[str, Any] | None = None
    if args.turns == 1 and all(isinstance(t, int) and t != tok.unk_token_id for t in stops):
        generation = {"eos_token_id": [tok.eos_token_id, *stops]}
    elif args.turns == 1:
        generation = {"stop_strings": list(protocol.stop_strings), "pad_token_id": tok.eos_token_id}
        model.generate = functools.partial(model.generate, tokenizer=tok)
    config = trl.GRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=args.steps,
        per_device_train_batch_size=batch,
        num_generations=r.n,
        max_completion_length=r.max_response_tokens if args.turns > 1 else r.max_new_tokens,
        temperature=r.temperature,
        learning_rate=cfg.optim.lr,
        beta=cfg.optim.kl_coef,
        num_iterations=cfg.optim.epochs,
        generation_kwargs=generation,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=cfg.run.seed,
    )
    if args.turns > 1:
        rollout = SearchRollout(
            examples,
            retriever=searcher,
            reward=cfg.algorithm.reward,
            protocol=cfg.env.protocol,
            max_turns=args.turns,
            topk=cfg.retriever.topk,
            max_obs_chars=cfg.env.max_obs_chars,
            max_turn_tokens=r.max_new_tokens,
        )
        kwargs: dict[str, Any] = {
            "reward_funcs": search_reward,
            "train_dataset": rollout.dataset(),
            "rollout_func": rollout,
        }
    else:
        reward = get_reward(cfg.algorithm.reward)
        golds = {trainer.epcfg.prompt(ex): list(ex.golden_answers) for ex in examples}

        def our_reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
            return [reward(c, golds[p], protocol).total for p, c in zip(prompts, completions, strict=True)]

        data = Dataset.from_list([{"prompt": trainer.epcfg.prompt(ex)} for ex in examples])
        kwargs = {"reward_funcs": our_reward, "train_dataset": data}
    grpo = trl.GRPOTrainer(model=model, processing_class=tok, args=config, callbacks=[StepTimer()], **kwargs)
    grpo.train()
    lengths = [e["completions/mean_length"] for e in grpo.state.log_history if "completions/mean_length" in e]
    wall = sum(walls[1:])
    if wall <= 0:
        return float("nan"), float("nan")
    return batch * len(walls[1:]) / wall, batch * sum(lengths[1 : len(walls)]) / wall


def trl(args: argparse.Namespace) -> None:
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    out = Path(args.out)
    for own in ("ours_eta0", "ours_eta1", "trl"):  # this bench's folders only: --out may hold other things
        shutil.rmtree(out / own, ignore_errors=True)
    # RL steps only: no evaluation, one optimizer step a batch (TRL's default), the anchor built once
    limits = [
        f"rollout.max_turns={args.turns}",
        f"run.steps={args.steps}",
        "run.eval_every=0",
        "optim.mini_batches=1",
        "algorithm.anchor.refresh_every=0",
    ]
    rows: list[tuple[str, float, float, str]] = []
    start = Path(args.from_run) if args.from_run else None
    for eta in (0, 1):
        run_dir = out / f"ours_eta{eta}"
        extra = []
        if start is not None:
            share_start(start, run_dir)
            extra = share_start_overrides(start)
        cfg = load_config(
            resolve_config(args.config), [*args.overrides, *limits, *extra, f"rollout.max_staleness={eta}"]
        )
        timer = Timed()
        with trainer_for(cfg, run_dir) as (trainer, searcher):
            trainer.ensure_reference(0)  # the anchor and GT set: not timed
            timer.wrap(trainer)
            for k in range(1, args.steps + 1):  # the steps alone: no held-out evaluation
                trainer.train_step(k)
            updated = f"{1 - mean(timer.skipped[1:]):.0%}"
            rows.append((f"ours, eta = {eta}", timer.per_second(skip=1), timer.tokens_per_second(skip=1), updated))
            if eta == 1:  # TRL on the same model, prompts, limits and retriever, in this process
                name = "TRL GRPOTrainer" + (" + our SearchRollout" if args.turns > 1 else "")
                rows.append((name, *trl_side(args, cfg, trainer, searcher, run_dir / "initial_policy", out), "100%"))
        start = start or run_dir
    turns = f"{args.turns} turn{'s' if args.turns > 1 else ''}"
    # model tokens per rollout says whether both ended their turns alike (a side run to the token limit
    # has fewer, longer rollouts per second); rows updated, whether both did the same update: ours
    # skips the forward and backward of a row whose loss is zero (advantage 0, no KL term), TRL runs
    # every row, so where few rows carry a signal ours is faster for doing less
    print(
        f"| trainer ({turns}) | rollouts/s (steps 2-{args.steps}) | model tokens/s | model tokens/rollout "
        "| rows updated |"
    )
    print("|---|---|---|---|---|")
    for name, rate, tokens, updated in rows:
        print(f"| {name} | {rate:.2f} | {tokens:.0f} | {tokens / rate:.1f} | {updated} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pipeline", help="one config at several eta")
    p.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="run.steps (default: the config's)")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="run.seed values: each eta trained once per seed, all from the first run's start (default: the config's seed)",
    )
    t = sub.add_parser("trl", help="our step beside TRL's GRPOTrainer")
    t.add_argument("--turns", type=int, default=1, help="1: single-turn; more: multi-turn through our TRL adapter")
    t.add_argument("--steps", type=int, default=8)
    a = sub.add_parser("pairs", help="interleaved, repeated pairs: eta 0 at 2 threads against eta > 0, or the ablation")
    a.add_argument("--etas", type=int, nargs="+", default=None, help="the arms' eta (default: 1 2; --ablation: 2)")
    a.add_argument("--repeats", type=int, default=3, help="pairs per arm, one RL seed each (at least 3 for a figure)")
    a.add_argument("--seeds", type=int, nargs="+", default=None, help="the repeats' run.seed (default: 0, 1, ...)")
    a.add_argument("--steps", type=int, default=None, help="run.steps (default: the config's)")
    a.add_argument("--base-threads", type=int, default=2, help="run.threads of the eta-0 base arm")
    a.add_argument("--threads", type=int, default=1, help="run.threads of the eta > 0 arms (a phase each core)")
    a.add_argument(
        "--ablation",
        action="store_true",
        help="decoupled (base) against naive PPO (rollout.decoupled=false) at one eta",
    )
    for q in (p, t, a):
        q.add_argument(
            "--from-run",
            default=None,
            help="a finished run (a `pipeline` run, or the recipe's own) whose initial policy and reference state "
            "(anchor, Group Sampling's partition, GT cache) every run starts from, instead of warm-starting here",
        )
        q.add_argument("--config", default="demo", help="a preset or YAML file")
        q.add_argument("--out", default="runs/bench-async")
        q.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    print(f"machine: {machine_line(('torch', 'transformers', 'trl', 'vllm'))}")
    print("$ " + " ".join(["python", *sys.argv]))
    if args.what == "pairs":
        from bench.training.async_rl_pairs import pairs

        args.etas = args.etas or ([2] if args.ablation else [1, 2])
        pairs(args, in_fresh_process)
    else:
        (pipeline if args.what == "pipeline" else trl)(args)


if __name__ == "__main__":
    main()
