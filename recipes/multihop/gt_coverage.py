"""`pvpo recipe gt-coverage`: how many questions of the real multi-hop files get a `dataset` GT
trajectory (what the recipe's warm start trains on): the annotation's plan written as agent turns,
every search checked to retrieve its gold paragraph with the quoted sentences inside the
observation's character budget, replayed through the env with MiniLM + FAISS over the questions' own
paragraphs, and scored by the reward. Prints the machine, the command and one table row per dataset
as it finishes (written, dropped and why, reward 1, response tokens)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pvpo.machine import machine_line


def questions_file(folder: Path) -> Path:
    """A dataset folder's questions: questions.json (the mini sets) or questions.jsonl."""
    found = [folder / name for name in ("questions.json", "questions.jsonl") if (folder / name).is_file()]
    if not found:
        raise ValueError(f"{folder} holds neither questions.json nor questions.jsonl: check --data and --datasets")
    return found[0]


def gt_coverage(
    *,
    tokenizer: str,
    data: Path,
    datasets: Sequence[str],
    topk: int,
    max_turns: int,
    max_obs_chars: int,
    pooled: bool,
    index_dir: Path | None,
    encoder_dtype: str | None,
    supporting_only: bool,
    command: str,
) -> None:
    """Build the index (one over all `datasets` when `pooled`, else one a dataset; kept in
    `index_dir` and reused when given), write each dataset's GT trajectories and print its row."""
    files = {n: questions_file(data / n) for n in datasets}  # every folder checked before any work

    from transformers import AutoTokenizer

    from pvpo.envs.dataset_gt import has_supporting_paragraphs
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.loaders import load_dataset
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_dtype
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.reference.dataset_source import dataset_trajectories

    tok = AutoTokenizer.from_pretrained(tokenizer)
    chat = bool(getattr(tok, "chat_template", None))
    print(f"machine: {machine_line(('transformers',))}")
    print(f"command: {command}")
    print(
        f"tokenizer {tokenizer} (chat template: {chat}), top-{topk}, max_turns {max_turns}, "
        f"{max_obs_chars} characters a search result, {'one index' if pooled else 'an index a dataset'}\n"
    )
    print(
        "| dataset | questions | written | no annotation | too many hops | search missed | evidence cut | reward 1 "
        "| tokens mean / max |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    sets = {n: load_dataset(path) for n, path in files.items()}
    if supporting_only:
        sets = {n: [q for q in qs if has_supporting_paragraphs(q)] for n, qs in sets.items()}
    set_default_dtype(encoder_dtype)
    with tempfile.TemporaryDirectory() as tmp:
        root = index_dir or Path(tmp)
        for group in [list(datasets)] if pooled else [[n] for n in datasets]:
            name = "+".join(group)
            questions = [q for n in group for q in sets[n]]
            index = root / name
            if not (index / "meta.json").exists():  # --index-dir keeps it for the next call
                paragraphs = list(dict.fromkeys((p.title, p.text) for q in questions for p in q.paragraphs))
                corpus = Path(tmp) / f"{name}.json"
                corpus.write_text(json.dumps([{"title": t, "text": x} for t, x in paragraphs]))
                build_index(corpus, index, show_progress=True)
            retriever = load_retriever(index, device="cpu")
            try:
                epcfg = EpisodeConfig(max_turns=max_turns, topk=topk, max_obs_chars=max_obs_chars)
                for n in group:  # one row a dataset, over the group's one index
                    trajs, c = dataset_trajectories(sets[n], tok, retriever, epcfg, chat_template=chat)
                    made = [t for t in trajs if t is not None]
                    lengths = [len(t.response_ids) for t in made] or [0]
                    print(
                        f"| {n} | {c['asked']} | {c['written']} | {c['no_plan']} | {c['too_many_hops']} | "
                        f"{c['search_missed_paragraph']} | {c['evidence_cut']} | {sum(t.reward >= 1.0 for t in made)} | "
                        f"{sum(lengths) / len(lengths):.0f} / {max(lengths)} |",
                        flush=True,
                    )
            finally:
                retriever.close()
