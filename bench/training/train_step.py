"""Our policy-update step against a bare transformers forward/backward on the same batch.

Both sides train the same model (a randomly initialised Qwen2 built from a config dict, or with
`--model` a pretrained one: a catalog name such as `smollm2-135m-instruct`, or a folder) on the same
padded multi-turn batch (prompt + model turns + env turns, env tokens masked) with AdamW, in the same
micro-batches (the token budget: `--max-tokens-per-micro-batch`, else the trainer's default from the
model and the free memory), and report trained tokens per second (non-padding tokens of the batch /
step time) and the peak resident memory of the process during the step (CPU; GPU: peak allocated):

- `bare`: per micro-batch one `model(input_ids, attention_mask).logits`, masked mean of the response
  tokens' log-probs as the loss, `backward`; then `optimizer.step()`: the least any trainer must do;
- `ours (loss pass)`: `micro_batches` + `accumulate` over `micro_batch_loss` (clipped surrogate,
  entropy, KL to a reference's log-probs), grad clipping, `optimizer.step()`: the part of
  `policy_update` that a bare step also does;
- `ours (policy_update)`: the whole `update.policy_update` with the trainer's defaults (one epoch of
  one mini-batch, no KL term): the trainer's own log-probs of the sampled tokens before the update
  (mismatch statistics, the PPO denominator under importance correction) come from the loss pass's
  forwards, so it makes no forward a bare step does not;
- `ours (policy_update, KL)`: the same with `optim.kl_coef=0.001`, which adds one no-grad forward of
  the frozen reference model for the KL term (verl's `ref` pass).

Target: ours / bare >= 0.9. Prints one table.

    python bench/training/train_step.py                         # CPU, a small Qwen2 shape
    python bench/training/train_step.py --model smollm2-135m-instruct --rows 32 --prompt-len 256 --response-len 768 --repeats 1 --no-warmup
    python bench/training/train_step.py --model smollm2-135m-instruct --rows 4 --prompt-len 128 --response-len 384 --repeats 5 --interleave
    python bench/training/train_step.py --device cuda --dtype bfloat16 --shape qwen2.5-3b --rows 16 --gradient-checkpointing
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {
    # Qwen2.5-3B's published architecture (config.json of Qwen/Qwen2.5-3B), built with random weights
    "qwen2.5-3b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # small enough for a 2-core CPU, still a real decoder stack
    "small": dict(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


def build_model(shape: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape]))


def make_batch(rows: int, vocab: int, prompt_len: int, response_len: int, seed: int = 0):
    """Multi-turn trajectories of varied lengths: model turns (trained) and env turns (masked)."""
    from pvpo.trainer.rollout.trajectory import Trajectory, collate

    rng = random.Random(seed)
    trajs = []
    for i in range(rows):
        t = Trajectory(
            uid=f"q{i // 4}",
            prompt_ids=[rng.randrange(1, vocab) for _ in range(rng.randint(prompt_len // 2, prompt_len))],
        )
        budget = rng.randint(response_len // 2, response_len)
        while len(t.response_ids) < budget:
            k = rng.randint(16, 96)
            t.append_model([rng.randrange(1, vocab) for _ in range(k)], [-2.0] * k)
            t.append_env([rng.randrange(1, vocab) for _ in range(rng.randint(8, 64))])
        t.reward = rng.random()
        trajs.append(t)
    return collate(trajs, 0)


def bare_step(model, opt, batch, autocast, max_tokens) -> None:
    from pvpo.trainer.algorithms.losses import token_logprobs
    from pvpo.trainer.model.micro_batch import micro_batches

    opt.zero_grad(set_to_none=True)
    total = batch.loss_mask.sum()
    with autocast():
        for mb in micro_batches(batch, list(range(len(batch))), agg="token-mean", max_tokens=max_tokens):
            b = mb.batch
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, b.prompt_len - 1 : -1]
            lp = token_logprobs(logits, b.response_ids)
            (-(lp * b.loss_mask).sum() / total).backward()
    opt.step()


def loss_pass_step(model, opt, batch, adv, ref_lp, optim, autocast) -> None:
    from pvpo.trainer.model.micro_batch import accumulate, micro_batches
    from pvpo.trainer.model.update import loss_config, micro_batch_loss
    from pvpo.trainer.parallel.distributed import clip_grad_norm

    loss_cfg = loss_config(optim, norm_len=batch.loss_mask.shape[-1])
    opt.zero_grad(set_to_none=True)
    with autocast():
        micros = micro_batches(
            batch,
            list(range(len(batch))),
            agg=loss_cfg.agg,
            max_tokens=optim.max_tokens_per_micro_batch,
            parts=optim.grad_accum,
        )

        def run(mb):
            loss, stats, _ = micro_batch_loss(
                model, mb.batch, adv[mb.rows], loss_cfg, temperature=1.0, ref_logprobs=ref_lp[mb.rows, : mb.r]
            )
            return loss, stats

        accumulate(micros, run)
    clip_grad_norm(list(model.parameters()), optim.grad_clip)
    opt.step()


def precision_report(base: torch.nn.Module, batch, where) -> None:
    """Why float32 master weights: the log-prob gap of bf16 compute (autocast) and of bf16 weights
    against float32, and how much of the model one AdamW step at lr 1e-6 moves in each."""
    from pvpo.trainer.model.update import batch_logprobs

    fp32 = copy.deepcopy(base).to(where.device).eval()
    bf16_w = copy.deepcopy(base).to(where.device, torch.bfloat16).eval()
    m = batch.loss_mask > 0
    with torch.no_grad():
        ref = batch_logprobs(fp32, batch, 1.0)
        with torch.autocast(where.device.type, dtype=torch.bfloat16):
            auto = batch_logprobs(fp32, batch, 1.0)
        pure = batch_logprobs(bf16_w, batch, 1.0)
    print(
        f"log-prob gap vs float32 (max / mean |d| over {int(m.sum())} model tokens): "
        f"bf16 autocast {float((auto - ref)[m].abs().max()):.4f} / {float((auto - ref)[m].abs().mean()):.4f}, "
        f"bf16 weights {float((pure - ref)[m].abs().max()):.4f} / {float((pure - ref)[m].abs().mean()):.4f}"
    )
    for name, model in (("float32", fp32), ("bfloat16", bf16_w)):
        model.train()
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
        total = sum(b.numel() for b in before)
        print(f"one AdamW step at lr 1e-6, {name} weights: {moved / total:.1%} of {total} weights change")


def load_model(name: str) -> torch.nn.Module:
    """A pretrained causal LM: a catalog name (`pvpo models list`), a *.gguf file or a folder."""
    from pvpo.trainer.model.policy import load_policy

    return load_policy(name).model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--model", default=None, help="a catalog name (smollm2-135m-instruct), *.gguf file or HF folder")
    ap.add_argument(
        "--no-warmup", action="store_true", help="no untimed first round (one long step is its own warm-up)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=384)
    ap.add_argument("--max-tokens-per-micro-batch", type=int, default=None)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--variants",
        default="bare,loss,update,update-kl",
        help="which steps to run, comma-separated: bare, loss (ours, loss pass), update (ours, policy_update with "
        "the defaults), update-kl (the same with a KL term to the frozen reference); "
        "e.g. `update` alone for the peak memory of one long training step",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="with --model: keep every variant's model and AdamW state and interleave their rounds (a ratio that "
        "a shared machine's load changes hit alike; peak RSS is then the process's, not one variant's)",
    )
    ap.add_argument("--precision", action="store_true", help="print the float32 / bf16 comparison and exit")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.model.device import place_policy_model, place_reference_model, placement
    from pvpo.trainer.model.memory import default_max_tokens, peak_rss_gib, process_peak_rss_gib, reset_peak_rss
    from pvpo.trainer.model.update import batch_logprobs, policy_update

    where = placement(args.device, args.dtype, "sdpa", args.gradient_checkpointing)
    sync = (lambda: torch.cuda.synchronize(where.device)) if where.device.type == "cuda" else (lambda: None)
    if args.model:
        from pvpo.model_catalog import resolve_model_path

        path = resolve_model_path(args.model)  # converted once into the cache, before any timing

        def build() -> torch.nn.Module:
            return load_model(path)
    else:

        def build() -> torch.nn.Module:
            return build_model(args.shape)

    ref_base = build()
    vocab = int(ref_base.config.vocab_size)
    batch = make_batch(args.rows, vocab, args.prompt_len, args.response_len).to(where.device)
    tokens = int(batch.attention_mask.sum())
    if args.precision:
        precision_report(ref_base, batch, where)
        return
    ref = place_reference_model(ref_base, where).eval()
    max_tokens = args.max_tokens_per_micro_batch or default_max_tokens(
        ref, where.device, checkpointing=args.gradient_checkpointing, seq_len=batch.input_ids.shape[1]
    )
    overrides = [
        "optim.mini_batches=1",
        "optim.grad_clip=1.0",
        f"optim.max_tokens_per_micro_batch={max_tokens or 'null'}",
    ]
    cfg = load_config(None, [*overrides, "optim.kl_coef=0.001"])
    cfg_default = load_config(None, overrides)  # kl_coef 0: the default
    adv = torch.linspace(-1, 1, len(batch), device=where.device)
    with torch.no_grad(), where.autocast():
        ref_lp = batch_logprobs(ref, batch, 1.0, max_tokens=max_tokens)

    def make_step(name: str):
        model = place_policy_model(build(), where).train()  # sets activation checkpointing from `where`
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        if name == "bare":
            return lambda: bare_step(model, opt, batch, where.autocast, max_tokens)
        if name == "ours (loss pass)":
            return lambda: loss_pass_step(model, opt, batch, adv, ref_lp, cfg.optim, where.autocast)

        optim = cfg.optim if name.endswith("KL)") else cfg_default.optim

        def update() -> None:
            with where.autocast():
                policy_update(model, opt, batch, adv, optim, temperature=1.0, seed=0, ref_model=ref)

        return update

    known = {
        "bare": "bare",
        "loss": "ours (loss pass)",
        "update": "ours (policy_update)",
        "update-kl": "ours (policy_update, KL)",
    }
    asked = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not asked or any(v not in known for v in asked):
        sys.exit(f"--variants {args.variants!r}: choose from {', '.join(known)}")
    names = tuple(known[v] for v in known if v in asked)
    secs: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, float] = {}
    rss: dict[str, float] = {}

    def timed(name: str, fn, keep: bool) -> None:
        if where.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(where.device)
        reset_peak_rss()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if keep:
            secs[name].append(time.perf_counter() - t0)
        peaks[name] = (
            torch.cuda.max_memory_allocated(where.device) / 2**30 if where.device.type == "cuda" else float("nan")
        )
        rss[name] = max(rss.get(name, 0.0), peak_rss_gib() or float("nan"))

    first = 0 if args.no_warmup else 1  # round 0 warms up (allocator, kernels) unless --no-warmup
    if args.model and not args.interleave:
        # a pretrained model: one variant's model and AdamW state at a time (peak memory per variant)
        for name in names:
            fn = make_step(name)
            for r in range(first, args.repeats + 1):
                timed(name, fn, keep=r >= 1)
            del fn
            gc.collect()
    else:
        # rounds interleave the three steps, so a load change on a shared machine hits them alike
        steps = {name: make_step(name) for name in names}
        for r in range(first, args.repeats + 1):
            for name, fn in steps.items():
                timed(name, fn, keep=r >= 1)
    rows = [(name, statistics.median(secs[name]), peaks[name], rss[name]) for name in names]

    bare = dict((n, t) for n, t, _, _ in rows).get("bare", float("nan"))
    print(
        f"model={args.model or args.shape} device={where.device} dtype={args.dtype} rows={len(batch)} tokens={tokens} "
        f"padded={batch.input_ids.numel()} checkpointing={args.gradient_checkpointing} "
        f"max_tokens_per_micro_batch={max_tokens} threads={torch.get_num_threads()} loadavg={os.getloadavg()[0]:.2f}"
    )
    print(f"{'step':<28}{'median s':>10}{'tokens/s':>12}{'vs bare':>9}{'peak GiB':>10}{'peak RSS GiB':>14}")
    for name, s, peak, rss_gib in rows:
        print(f"{name:<28}{s:>10.3f}{tokens / s:>12.0f}{bare / s:>9.2f}{peak:>10.2f}{rss_gib:>14.2f}")
    whole = process_peak_rss_gib()
    if whole is not None:  # each variant resets the kernel's counter: /usr/bin/time sees only the last one's
        print(f"process peak RSS, model loading included: {whole:.2f} GiB")


if __name__ == "__main__":
    main()
