"""How close the trainer's memory estimate of one training micro-batch comes to what it takes:
the peak resident memory of one forward + backward + AdamW step above the warm model and its
optimizer state, against `ModelShape.bytes_per_token` (activations) plus `step_fixed_bytes`
(gradients and autocast's weight copies). A Qwen2-architecture model with random weights and a
tied vocabulary of `--vocab` tokens (262,144: Gemma 3's), one row of about `--tokens` tokens.
CPU (Linux VmHWM); prints the machine, the command and one line a case.

    python bench/training/step_memory.py --vocab 262144 --tokens 256 1024 --dtype bf16 fp32 [--checkpointing]
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
from pathlib import Path

import torch

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def measure(vocab: int, tokens: int, dtype: str, checkpointing: bool) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.training.train_step import make_batch
    from pvpo.trainer.algorithms.losses import token_logprobs
    from pvpo.trainer.model.memory import (
        ModelShape,
        _status_kib,
        peak_rss_gib,
        release_freed_heap,
        reset_peak_rss,
        step_fixed_bytes,
    )
    from pvpo.trainer.rollout.trajectory import response_logits

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch = make_batch(1, vocab, tokens // 4, tokens - tokens // 4)
    cpu = torch.device("cpu")

    def autocast() -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast():
            lp = token_logprobs(response_logits(model, batch), batch.response_ids)
            (-(lp * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
        opt.step()

    step()  # AdamW's state exists from here on: the next step's peak above it is the step's own
    gc.collect()
    release_freed_heap()
    base = (_status_kib("VmRSS") or 0) / 2**20
    reset_peak_rss()
    step()
    took = (peak_rss_gib() or float("nan")) - base
    shape = ModelShape.of(model)
    assert shape is not None
    act = shape.bytes_per_token(checkpointing=checkpointing, seq_len=batch.input_ids.shape[1])
    act_gib = act * batch.input_ids.numel() / 2**30
    with autocast():
        fixed = step_fixed_bytes(model, cpu) / 2**30
    return (
        f"| {vocab} | {dtype} | {'yes' if checkpointing else 'no'} | {batch.input_ids.numel()} | {took:.2f} "
        f"| {act_gib:.2f} ({act_gib / took:.2f}x) | {act_gib + fixed:.2f} ({(act_gib + fixed) / took:.2f}x) |"
    )


def run_one(args: argparse.Namespace) -> int:
    """A child process: one case, one table line."""
    print(measure(args.vocab, args.tokens[0], args.dtype[0], args.checkpointing), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024], help="tokens of the row (about)")
    ap.add_argument("--dtype", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing on")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return run_one(args)
    from pvpo.machine import machine_line

    print(f"machine: {machine_line(('torch', 'transformers'))}")
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print()
    print(
        "| vocabulary | compute | checkpointing | padded tokens | measured GiB | activations estimated "
        "(/ measured) | with the step's fixed bytes (/ measured) |"
    )
    print("|---|---|---|---:|---:|---|---|")
    for dtype in args.dtype:  # each case in a fresh process: an earlier case's heap would blur the peak
        for tokens in args.tokens:
            cmd = [sys.executable, __file__, "--one", "--vocab", str(args.vocab), "--tokens", str(tokens)]
            cmd += ["--dtype", dtype] + (["--checkpointing"] if args.checkpointing else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
