"""Benchmark of the search environment on real MuSiQue questions, through the real retriever.

A scripted agent searches each sub-question of MuSiQue's `question_decomposition` (with "#k"
replaced by hop k's answer) and we count how often the hop's supporting paragraph came back in
the observation. Also measured: the env's own time per step with retrieval excluded, and the
wall time of one-call-per-step batching (SearchVectorEnv) against one call per search (SearchEnv).

    python bench/training/env.py [--questions PATH] [--topk 3] [--max-obs-chars 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from pvpo.envs import QAExample, SearchEnv, SearchVectorEnv, corpus_from_examples, load_dataset, write_corpus
from pvpo.retriever.types import TimedSearcher

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "musique_mini" / "questions.json"


def hop_queries(ex: QAExample) -> list[tuple[str, int]]:
    """(query, supporting paragraph position) per hop, earlier answers filled in for '#k'."""
    steps = ex.metadata["question_decomposition"]
    answers = [s["answer"] for s in steps]
    return [(re.sub(r"#(\d+)", lambda m: answers[int(m.group(1)) - 1], s["question"]), s["paragraph"]) for s in steps]


def support_shown(obs: str, ex: QAExample, position: int) -> bool:
    p = ex.paragraphs[position]
    return f"(Title: {p.title}) {p.text[:60].strip()}" in obs


def scripted_turns(ex: QAExample) -> list[str]:
    turns = [f"<think>Next sub-question.</think>\n<search>{q}</search>" for q, _ in hop_queries(ex)]
    return turns + [f"<think>Done.</think>\n<answer>{ex.metadata['question_decomposition'][-1]['answer']}</answer>"]


def run_single(examples: list[QAExample], searcher: TimedSearcher, args) -> dict:
    env = SearchEnv(examples, retriever=searcher, topk=args.topk, max_obs_chars=args.max_obs_chars, max_turns=8)
    found: dict[tuple[int, int], list[bool]] = defaultdict(list)  # (n_hops, hop) -> hits
    steps, t0 = 0, time.perf_counter()
    for ex in examples:
        env.reset(options={"question": ex})
        hops = hop_queries(ex)
        for h, turn in enumerate(scripted_turns(ex)):
            obs = env.step(turn)[0]
            steps += 1
            if h < len(hops):
                found[(len(hops), h + 1)].append(support_shown(obs, ex, hops[h][1]))
    return {"found": found, "steps": steps, "wall": time.perf_counter() - t0}


def run_vector(examples: list[QAExample], searcher: TimedSearcher, args) -> dict:
    env = SearchVectorEnv(
        len(examples), None, retriever=searcher, topk=args.topk, max_obs_chars=args.max_obs_chars, max_turns=8
    )
    env.reset(options={"questions": examples})
    plans = [scripted_turns(ex) for ex in examples]
    steps, t0 = 0, time.perf_counter()
    for t in range(max(map(len, plans))):
        env.step(tuple(p[t] if t < len(p) else "" for p in plans))
        steps += sum(t < len(p) for p in plans)
    return {"steps": steps, "wall": time.perf_counter() - t0, "batch_steps": max(map(len, plans))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--max-obs-chars", type=int, default=2000)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.build import build_index
    from pvpo.retriever.client import RetrieverClient
    from pvpo.retriever.server import BackgroundServer

    examples = [e for e in load_dataset(args.questions) if e.metadata.get("question_decomposition")]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        n_passages = write_corpus(corpus_from_examples(examples), corpus)
        t0 = time.perf_counter()
        index_dir = build_index(corpus, Path(tmp) / "index", show_progress=False)
        build_s = time.perf_counter() - t0
        with BackgroundServer(index_dir) as server:
            client = RetrieverClient(server.url, topk=args.topk)
            client.search(["warm up"])
            single = TimedSearcher(client)
            s = run_single(examples, single, args)
            vector = TimedSearcher(client)
            v = run_vector(examples, vector, args)
            client.close()

    from pvpo.machine import machine_line

    print(f"# pvpo.envs benchmark - {machine_line(('gymnasium', 'faiss-cpu', 'onnxruntime'))}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"# data: {args.questions} ({len(examples)} questions), corpus = their {n_passages} paragraphs, "
        f"MiniLM-L6 + FAISS Flat over HTTP loopback (index built in {build_s:.1f} s), topk={args.topk}, "
        f"max_obs_chars={args.max_obs_chars}\n"
    )
    print("Supporting paragraph of the hop shown in the observation (scripted decomposition agent):\n")
    print("| question hops | hop | searches | support shown |")
    print("|---|---|---|---|")
    for key in sorted(s["found"]):
        hits = s["found"][key]
        print(f"| {key[0]} | {key[1]} | {len(hits)} | {np.mean(hits):.1%} |")
    all_hits = [h for hits in s["found"].values() for h in hits]
    print(f"| all | all | {len(all_hits)} | {np.mean(all_hits):.1%} |\n")
    print("Stepping cost (same run, same server):\n")
    print("| mode | env steps | retriever calls | wall s | retrieval s | env overhead per step (excl. retrieval) |")
    print("|---|---|---|---|---|---|")
    for name, r, t in (
        ("SearchEnv, one call per search", s, single),
        ("SearchVectorEnv, one call per step", v, vector),
    ):
        overhead_ms = (r["wall"] - t.seconds) / r["steps"] * 1e3
        print(f"| {name} | {r['steps']} | {t.calls} | {r['wall']:.2f} | {t.seconds:.2f} | {overhead_ms:.3f} ms |")
    print(f"\nBatched vs one-by-one wall time: {s['wall'] / v['wall']:.1f}x faster")


if __name__ == "__main__":
    main()
