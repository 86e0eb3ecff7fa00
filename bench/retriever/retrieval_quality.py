"""Retrieval quality on the real samples: recall@k of the supporting passages for dense (MiniLM,
FAISS Flat), BM25 (bm25s) and hybrid (the two fused by weighted reciprocal rank fusion) on
musique_mini (1,890 paragraphs, 2-4 supporting each) and hotpotqa_mini (994 articles, 2
supporting each), 100 questions each. Prints one markdown table.

    .venv/bin/python bench/retriever/retrieval_quality.py [--k 5] [--weights 1,1 --weights 1,0.5 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = Path(os.environ.get("PVPO_SHARED_DATA", REPO.parent / "shared" / "data"))
DATASETS = ("musique_mini", "hotpotqa_mini")


def gold_sets(data: Path, name: str) -> tuple[Path, list[str], list[set[str]]]:
    """(corpus file, questions, ids of each question's supporting passages) of a sample; ids are
    the ones an index built from the corpus file gives its passages."""
    from pvpo.retriever.corpus import iter_corpus
    from pvpo.retriever.types import split_contents

    corpus = data / name / "corpus.json"
    questions = json.loads((data / name / "questions.json").read_text())
    if name == "musique_mini":
        by_passage = {split_contents(contents): pid for pid, contents in iter_corpus(corpus)}
        gold = [
            {by_passage[(p["title"], p["paragraph_text"])] for p in q["paragraphs"] if p["is_supporting"]}
            for q in questions
        ]
    elif name == "hotpotqa_mini":  # one passage per article; its id is the title
        gold = [{title for title, _ in q["supporting_facts"]} for q in questions]
    else:
        raise ValueError(f"unknown sample {name!r}; options: {', '.join(DATASETS)}")
    return corpus, [q["question"] for q in questions], gold


def recall_at_k(results: Sequence[Sequence[object]], gold: Sequence[set[str]]) -> float:
    """Mean over questions of the fraction of their supporting passages among the results."""
    return float(np.mean([len(g & {p.id for p in r}) / len(g) for r, g in zip(results, gold)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pvpo" / "bench-quality")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument(
        "--weights",
        action="append",
        default=None,
        help="hybrid dense,bm25 weights (repeat for several rows; default 1,1)",
    )
    ap.add_argument("--encoder-backend", default="torch")
    args = ap.parse_args()
    if not (args.data / DATASETS[0]).exists():
        sys.exit(
            f"bench/retriever/retrieval_quality.py needs the samples under {args.data} (../shared/data beside the "
            "checkout, or set PVPO_SHARED_DATA); they are not on this machine."
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.encoder import set_default_backend
    from pvpo.retriever.hybrid import build_hybrid
    from pvpo.retriever.index import load_retriever

    set_default_backend(args.encoder_backend)
    weights = [tuple(float(x) for x in w.split(",")) for w in (args.weights or ["1,1"])]
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    table: dict[str, dict[str, str]] = {}
    for name in DATASETS:
        corpus, questions, gold = gold_sets(args.data, name)
        t0 = time.perf_counter()
        out = build_hybrid(corpus, args.work_dir / name, show_progress=False)  # reuses a cached build
        print(f"{name}: hybrid dir {out} ready in {time.perf_counter() - t0:.1f} s", flush=True)
        col = table.setdefault(name, {})
        h = load_retriever(out, device="cpu")
        col["dense (MiniLM, Flat)"] = f"{recall_at_k(h.dense.search(questions, topk=args.k), gold):.3f}"
        col["BM25 (bm25s)"] = f"{recall_at_k(h.lexical.search(questions, topk=args.k), gold):.3f}"
        h.close()
        for w in weights:
            hw = load_retriever(out, device="cpu", weights=list(w))
            col[f"hybrid RRF k=60, weights dense {w[0]:g} / bm25 {w[1]:g}"] = (
                f"{recall_at_k(hw.search(questions, topk=args.k), gold):.3f}"
            )
            hw.close()
    rows = list(next(iter(table.values())))
    width = max(len(r) for r in rows)
    print(f"\n| {f'recall@{args.k}, 100 questions each'.ljust(width)} | " + " | ".join(DATASETS) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * (len(d) + 2) for d in DATASETS) + "|")
    for r in rows:
        print(f"| {r.ljust(width)} | " + " | ".join(table[d][r].ljust(len(d)) for d in DATASETS) + " |")


if __name__ == "__main__":
    main()
