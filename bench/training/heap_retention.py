"""How much of a CPU training process's resident memory is freed heap that glibc keeps.

A lead for the real-data recipe's rising per-phase memory peaks (docs/benchmarks/real-recipe.md): after each
bare forward/backward/AdamW step of a catalog model (bf16 autocast, as `model.dtype: auto` runs on
an AVX512-BF16 CPU), print the resident set (VmRSS), glibc's heap arena, the free bytes inside it,
and mmapped chunks (`mallinfo2`); after update `--trim-after`, call `malloc_trim(0)` and print them
again. Linux with glibc only.

    python bench/training/heap_retention.py --model smollm2-135m-instruct --rows 8 --tokens 1024 --updates 4
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys
import time
from pathlib import Path

import torch

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _rss_gib() -> float:
    with open("/proc/self/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 2**20 if m else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="catalog name or folder")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens a row")
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--trim-after", type=int, default=3, help="call malloc_trim(0) after this update (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        print("needs Linux with glibc >= 2.33 (mallinfo2)", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM

    from pvpo.machine import machine_line
    from pvpo.model_catalog import resolve_model_path

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    print(f"# {machine_line(('torch', 'transformers'))}, {torch.get_num_threads()} torch threads")
    print("# " + " ".join(sys.argv))
    print("| after | VmRSS (GiB) | heap arena (GiB) | free in heap (GiB) | mmapped (GiB) | s |")
    print("|---|---|---|---|---|---|")

    def row(tag: str, seconds: float) -> None:
        m = libc.mallinfo2()
        cells = [_rss_gib(), m.arena / 2**30, m.fordblks / 2**30, m.hblkhd / 2**30]
        print(f"| {tag} | " + " | ".join(f"{x:.2f}" for x in cells) + f" | {seconds:.1f} |", flush=True)

    row("load", 0.0)
    g = torch.Generator().manual_seed(args.seed)
    for i in range(1, args.updates + 1):
        t0 = time.perf_counter()
        ids = torch.randint(0, vocab, (args.rows, args.tokens), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
            loss = -torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, loss
        row(f"update {i}", time.perf_counter() - t0)
        if i == args.trim_after:
            t0 = time.perf_counter()
            libc.malloc_trim(0)
            row("malloc_trim(0)", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
