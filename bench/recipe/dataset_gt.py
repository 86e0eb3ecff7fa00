"""How many questions of a real multi-hop file get a `dataset` GT trajectory: the annotation's plan
written as agent turns, every search checked to retrieve its gold paragraph with the quoted sentences
inside the observation's character budget, replayed through the
env with MiniLM + FAISS over the questions' own paragraphs, and scored by the reward.

    python bench/recipe/dataset_gt.py --tokenizer DIR [--data ../shared/data] [--datasets a,b] [--topk 3] [--max-turns 5]
        [--max-obs-chars 2000] [--pooled] [--supporting-only] [--encoder-dtype bfloat16] [--index-dir DIR]

Prints the machine, the command and a table per dataset (written, dropped and why, reward 1,
response tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def questions_file(folder: Path) -> Path:
    """A dataset folder's questions: questions.json (the mini sets) or questions.jsonl."""
    found = [folder / name for name in ("questions.json", "questions.jsonl") if (folder / name).is_file()]
    if not found:
        raise SystemExit(f"error: {folder} holds neither questions.json nor questions.jsonl")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="folder holding the dataset folders (musique_mini/, hotpotqa_hard/, ...)",
    )
    ap.add_argument(
        "--datasets",
        default="musique_mini,hotpotqa_mini",
        help="comma-separated folders of --data, e.g. hotpotqa_mini,musique_mini,hotpotqa_hard,2wikimultihopqa,musique_dev",
    )
    ap.add_argument("--tokenizer", required=True, help="the policy's tokenizer folder (its chat template is used)")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--max-obs-chars", type=int, default=2000, help="character budget of one search result")
    ap.add_argument(
        "--pooled",
        action="store_true",
        help="one index over all the datasets' paragraphs, as the real-data recipe builds",
    )
    ap.add_argument("--index-dir", type=Path, help="keep the index here and reuse it on the next call")
    ap.add_argument(
        "--encoder-dtype", choices=("float32", "bfloat16"), default=None, help="the encoder's torch dtype (build)"
    )
    ap.add_argument(
        "--supporting-only",
        action="store_true",
        help="only questions whose paragraphs hold their supporting ones (data.require_supporting_paragraphs)",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoTokenizer

    from pvpo.envs.dataset_gt import has_supporting_paragraphs
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.loaders import load_dataset
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_dtype
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.reference.dataset_source import dataset_trajectories

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    chat = bool(getattr(tok, "chat_template", None))
    from bench.common.machine import machine_line

    print(f"machine: {machine_line(('transformers',))}")
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
    sets = {n: load_dataset(questions_file(args.data / n)) for n in names}
    if args.supporting_only:
        sets = {n: [q for q in qs if has_supporting_paragraphs(q)] for n, qs in sets.items()}
    set_default_dtype(args.encoder_dtype)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.index_dir or Path(tmp)
        for group in [names] if args.pooled else [[n] for n in names]:
            name = "+".join(group)
            questions = [q for n in group for q in sets[n]]
            index = root / name
            if not (index / "meta.json").exists():  # --index-dir keeps it for the next call
                paragraphs = list(dict.fromkeys((p.title, p.text) for q in questions for p in q.paragraphs))
                corpus = Path(tmp) / f"{name}.json"
                corpus.write_text(json.dumps([{"title": t, "text": x} for t, x in paragraphs]))
                build_index(corpus, index, show_progress=False)
            retriever = load_retriever(index, device="cpu")
            try:
                epcfg = EpisodeConfig(max_turns=args.max_turns, topk=args.topk, max_obs_chars=args.max_obs_chars)
                for n in group:  # one row a dataset, over the group's one index
                    trajs, c = dataset_trajectories(sets[n], tok, retriever, epcfg, chat_template=chat)
                    made = [t for t in trajs if t is not None]
                    lengths = [len(t.response_ids) for t in made] or [0]
                    print(
                        f"| {n} | {c['asked']} | {c['written']} | {c['no_plan']} | {c['too_many_hops']} | "
                        f"{c['search_missed_paragraph']} | {c['evidence_cut']} | {sum(t.reward >= 1.0 for t in made)} | "
                        f"{sum(lengths) / len(lengths):.0f} / {max(lengths)} |"
                    )
            finally:
                retriever.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
