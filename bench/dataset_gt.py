"""How many questions of a real multi-hop file get a `dataset` GT trajectory: the annotation's plan
written as agent turns, every search checked to retrieve its gold paragraph with the quoted sentences
inside the observation's character budget, replayed through the
env with MiniLM + FAISS over the questions' own paragraphs, and scored by the reward.

    python bench/dataset_gt.py --tokenizer DIR [--data ../shared/data] [--topk 3] [--max-turns 5] [--max-obs-chars 2000] [--pooled]

Prints the machine, the command and a table per dataset (written, dropped and why, reward 1,
response tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding musique_mini/ and hotpotqa_mini/")
    ap.add_argument("--datasets", default="musique_mini,hotpotqa_mini")
    ap.add_argument("--tokenizer", required=True, help="the policy's tokenizer folder (its chat template is used)")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--max-obs-chars", type=int, default=2000, help="character budget of one search result")
    ap.add_argument(
        "--pooled",
        action="store_true",
        help="one index over all the datasets' paragraphs, as the real-data recipe builds",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoTokenizer

    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.loaders import load_dataset
    from pvpo.retriever.build import build_index
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.reference.dataset_source import dataset_trajectories

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    chat = bool(getattr(tok, "chat_template", None))
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print(
        f"tokenizer {args.tokenizer} (chat template: {chat}), top-{args.topk}, max_turns {args.max_turns}, "
        f"{args.max_obs_chars} characters a search result, {'one index' if args.pooled else 'an index a dataset'}\n"
    )
    print(
        "| dataset | questions | written | no annotation | too many hops | search missed | evidence cut | reward 1 "
        "| tokens mean / max |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    names = args.datasets.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for group in [names] if args.pooled else [[n] for n in names]:
            name = "+".join(group)
            questions = [q for n in group for q in load_dataset(args.data / n / "questions.json")]
            paragraphs = list(dict.fromkeys((p.title, p.text) for q in questions for p in q.paragraphs))
            corpus = Path(tmp) / f"{name}.json"
            corpus.write_text(json.dumps([{"title": t, "text": x} for t, x in paragraphs]))
            retriever = load_retriever(build_index(corpus, Path(tmp) / name, show_progress=False), device="cpu")
            try:
                epcfg = EpisodeConfig(max_turns=args.max_turns, topk=args.topk, max_obs_chars=args.max_obs_chars)
                trajs, c = dataset_trajectories(questions, tok, retriever, epcfg, chat_template=chat)
            finally:
                retriever.close()
            made = [t for t in trajs if t is not None]
            lengths = [len(t.response_ids) for t in made] or [0]
            print(
                f"| {name} | {c['asked']} | {c['written']} | {c['no_plan']} | {c['too_many_hops']} | "
                f"{c['search_missed_paragraph']} | {c['evidence_cut']} | {sum(t.reward >= 1.0 for t in made)} | "
                f"{sum(lengths) / len(lengths):.0f} / {max(lengths)} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
