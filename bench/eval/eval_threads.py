"""Decoding speed against torch's CPU threads: greedy tokens/s of a catalog model through the
transformers engine with each thread count in turn (alternated over rounds, so load that changes
during the run reaches every count), beside whatever else the machine runs. What `pvpo eval
--threads` and its default (`pvpo.hardware.threads_for`) are chosen from.

    python bench/eval/eval_threads.py --model smollm2-135m-instruct --threads 1 2 --tokens 48 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens a measurement")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    import torch

    from pvpo.evaluation.policies import token_policy
    from pvpo.trainer.rollout.engine import SamplingConfig

    policy = token_policy(a.model, "hf")
    tok = policy.tokenizer
    prompt = tok.encode("Answer the question. Question: who wrote the novel the film Blade Runner is based on?")
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=a.tokens)
    speeds: dict[int, list[float]] = {n: [] for n in a.threads}
    for _ in range(a.rounds):
        for n in a.threads:
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            out = policy.engine.generate([prompt], sampling)[0]
            speeds[n].append(len(out.token_ids) / (time.perf_counter() - t0))
    load = os.getloadavg()
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end"
    )
    for n, s in speeds.items():
        print(f"threads {n}: " + ", ".join(f"{x:.1f}" for x in s) + " tokens/s")


if __name__ == "__main__":
    main()
