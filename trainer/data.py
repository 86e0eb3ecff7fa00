"""The run's questions, corpus and retriever, and the rules its episodes run by: `load_data` (the
synthetic world from the config, or dataset files readable by `pvpo.envs.loaders`, split into RL,
held-out and warm-start questions), `retriever_session` (with no `retriever.url`, the corpus is
indexed under the run directory once and served on loopback for the life of the run). The
run's episode rules and loop limits (`agent_settings`) are made from the config here, by the one
translation that `pvpo eval`'s settings go through too (`trainer/rollout/agent_settings.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pvpo.atomic import atomic_write_jsonl
from pvpo.envs.data import QAExample
from pvpo.retriever.types import Searcher
from pvpo.secrets import has_masked_credentials
from pvpo.trainer.config.schema import QUESTIONS_CORPUS, TrainConfig
from pvpo.trainer.rollout.agent_settings import AgentSettings
from pvpo.trainer.state.run_dir import RunDir

log = logging.getLogger(__name__)


@dataclass
class Data:
    train: list[QAExample]
    eval: list[QAExample]
    corpus_path: Path | None
    texts: list[str] = field(default_factory=list)  # what a local tokenizer is trained on
    world: Any = None  # the SyntheticWorld, when the data is synthetic (oracle trajectories)
    warm_start: list[QAExample] = field(default_factory=list)  # SFT questions (oracle or dataset GT)
    # the validation split (data.validation_examples): evaluated every run.eval_every steps to watch learning and
    # keep the best checkpoint, whichever split `eval` is; empty without one (then `eval` is watched)
    validation: list[QAExample] = field(default_factory=list)


def agent_settings(cfg: TrainConfig, temperature: float | None = None) -> AgentSettings:
    """The run's episode rules and loop limits, sampling at `temperature` (default: the rollouts')."""
    r = cfg.rollout
    return AgentSettings(
        protocol=cfg.env.protocol,
        prompt_template=cfg.env.prompt_template,
        reward=cfg.algorithm.reward,
        reward_params=dict(cfg.algorithm.reward_params),
        max_turns=r.max_turns,
        topk=cfg.retriever.topk,
        max_obs_chars=cfg.env.max_obs_chars,
        max_question_chars=cfg.env.max_question_chars,
        temperature=r.temperature if temperature is None else temperature,
        top_p=r.top_p,
        max_new_tokens=r.max_new_tokens,
        max_response_tokens=r.max_response_tokens,
        chat_template=cfg.model.chat_template,
        max_concurrency=r.max_concurrency,
        search_timeout_s=r.search_timeout_s,
    )


def disjoint_splits(
    train: Sequence[QAExample],
    *,
    n_rl: int | None,
    n_sft: int | None,
    max_sft_hops: int | None = None,
    shuffle_seed: int | None = None,
) -> tuple[list[QAExample], list[QAExample]]:
    """(RL prompts, warm-start questions) from one train split, sharing no question.

    The split is shuffled with `shuffle_seed` (kept in order when None); the first `n_rl` are the
    RL prompts (all when None); the warm-start questions are the next `n_sft` of the rest with at
    most `max_sft_hops` hops (`metadata["hops"]`). With `n_sft` None there is no separate set and
    the warm start reuses the RL prompts."""
    items = list(train)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    rl = items[:n_rl] if n_rl else items
    if n_sft is None:
        return rl, list(rl)
    rest = [ex for ex in items[len(rl) :] if max_sft_hops is None or ex.metadata.get("hops", 1) <= max_sft_hops]
    if len(rest) < n_sft:
        raise ValueError(
            f"asked for {n_sft} warm-start questions disjoint from {len(rl)} RL prompts, only {len(rest)} left"
        )
    return rl, rest[:n_sft]


def dataset_of(example: QAExample) -> str:
    """The dataset a question comes from: its uid's prefix (the file's dataset name, `loaders`)."""
    return example.uid.split("/", 1)[0]


def held_out_split(
    items: Sequence[QAExample], n: int | Mapping[str, int], shuffle_seed: int | None, *, key: str = "held_out_examples"
) -> tuple[list[QAExample], list[QAExample]]:
    """(rest, set aside): `n` questions of `items` (shuffled with `shuffle_seed`, file order when
    None) set aside, or with a mapping {dataset: k}, k of each dataset named (a stratified split);
    the rest, in their original order. `key` names the setting in errors."""
    order = list(range(len(items)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    if isinstance(n, Mapping):
        have: dict[str, list[int]] = {}
        for i in order:
            have.setdefault(dataset_of(items[i]), []).append(i)
        unknown = sorted(set(n) - set(have))
        if unknown:
            raise ValueError(
                f"data.{key}: no question of dataset(s) {unknown} in data.source; its datasets: {sorted(have)}"
            )
        short = {k: len(have[k]) for k, v in n.items() if v > len(have[k])}
        if short:
            raise ValueError(f"data.{key}={dict(n)} asks for more questions than {short} hold")
        held = {i for k, v in n.items() for i in have[k][:v]}
        if len(held) == len(items):
            raise ValueError(f"data.{key}={dict(n)} leaves no other question of the {len(items)} in data.source")
    else:
        if n >= len(items):
            raise ValueError(f"data.{key}={n} leaves no other question of the {len(items)} in data.source")
        held = set(order[:n])
    return [ex for i, ex in enumerate(items) if i not in held], [items[i] for i in sorted(held)]


def load_data(cfg: TrainConfig, run_dir: Path) -> Data:
    """Train / eval questions, warm-start questions and the corpus to index (written under
    `run_dir` when synthetic). Splits follow `cfg.data`: shuffled with `shuffle_seed`, the first
    `max_train_examples` are the RL prompts, and `warm_start_examples` further questions (sharing
    none with the RL prompts) are the warm start's; without it `warm_start` is the RL prompts."""
    from pvpo.envs.loaders import bound_questions, load_dataset

    d = cfg.data
    validation: list[QAExample] = []
    if d.source == "synthetic":
        from pvpo.envs.synthetic import SyntheticWorld

        s = d.synthetic
        world = SyntheticWorld.generate(
            s.seed,
            s.n_entities,
            n_relations=s.n_relations,
            max_hops=s.max_hops,
            questions_per_hop=s.questions_per_hop,
            test_fraction=s.test_fraction,
        )
        train, evals = world.questions("train"), world.questions("test")
        corpus_path: Path | None = world.write_corpus(RunDir(run_dir).corpus)
        protocol = agent_settings(cfg).episode().tag_protocol
        texts = [p.contents for p in world.passages] + [protocol.instruction()]
        texts += [q.question for q in train] + ["".join(world.oracle_trajectory(q, protocol)) for q in train[:200]]
        rl, sft = disjoint_splits(
            train,
            n_rl=d.max_train_examples,
            n_sft=d.warm_start_examples,
            max_sft_hops=d.warm_start_max_hops,
            shuffle_seed=d.shuffle_seed,
        )
    else:
        world = None
        limit = cfg.env.max_question_chars
        files = [d.source] if isinstance(d.source, str) else list(d.source)
        train = [q for f in files for q in bound_questions(load_dataset(f), limit, f)]
        check_unique_uids(train, files)
        if d.require_supporting_paragraphs:
            train = with_supporting_paragraphs(train)
        evals = bound_questions(load_dataset(d.eval_source), limit, d.eval_source) if d.eval_source else []
        pool = [*train, *evals]  # every split's questions, before any is set aside: the one corpus they all search
        if d.held_out_examples and not d.eval_source:
            train, evals = held_out_split(train, d.held_out_examples, d.shuffle_seed)
        if d.validation_examples:  # for choosing settings: the held-out set is never evaluated then
            train, validation = held_out_split(
                train, d.validation_examples, _derived_seed(d.shuffle_seed), key="validation_examples"
            )
            if d.evaluate_on == "validation":  # the held-out set is recorded as a held-out run would evaluate it
                held = disjoint_splits(evals, n_rl=d.max_eval_examples, n_sft=None, shuffle_seed=d.shuffle_seed)[0]
                if held:
                    write_questions(held, RunDir(run_dir).held_out)
                evals = validation
            else:  # in the order a validation run evaluates them
                validation = disjoint_splits(validation, n_rl=None, n_sft=None, shuffle_seed=d.shuffle_seed)[0]
                write_questions(validation, RunDir(run_dir).validation)
        if d.corpus == QUESTIONS_CORPUS:
            corpus_path = questions_corpus(pool, RunDir(run_dir).corpus)
        else:
            corpus_path = Path(d.corpus) if d.corpus else None
        texts = [q.question for q in train]
        if d.warm_start_examples:  # SFT on the dataset's own GT (`dataset` GT source), disjoint from RL
            rl, sft = disjoint_splits(
                train, n_rl=d.max_train_examples, n_sft=d.warm_start_examples, shuffle_seed=d.shuffle_seed
            )
        else:
            rl, sft = disjoint_splits(train, n_rl=d.max_train_examples, n_sft=None, shuffle_seed=d.shuffle_seed)[0], []
    held_out = disjoint_splits(evals, n_rl=d.max_eval_examples, n_sft=None, shuffle_seed=d.shuffle_seed)[0]
    if world is None and held_out:  # `pvpo eval --dataset <run>/held_out.jsonl` reproduces the run's numbers
        run_files = RunDir(run_dir)
        write_questions(held_out, run_files.validation if d.evaluate_on == "validation" else run_files.held_out)
        by_dataset: dict[str, list[QAExample]] = {}
        for q in held_out:
            by_dataset.setdefault(dataset_of(q), []).append(q)
        if d.evaluate_on == "held_out" and len(by_dataset) > 1:  # one `pvpo eval --dataset` a column of the table
            for name, qs in by_dataset.items():
                write_questions(qs, run_files.held_out_dataset(name))
    if world is None and d.evaluate_on == "validation":  # the evaluations before and after are the validation ones
        validation = held_out
    return Data(rl, held_out, corpus_path, texts, world, sft, validation)


def _derived_seed(seed: int | None) -> int | None:
    """A second shuffle's seed from `shuffle_seed` (the validation split draws apart from the held-out)."""
    return None if seed is None else seed + 1


def with_supporting_paragraphs(questions: Sequence[QAExample]) -> list[QAExample]:
    """The questions whose own paragraphs hold their evidence (`has_supporting_paragraphs`); the
    others are counted by dataset in a warning."""
    from collections import Counter

    from pvpo.envs.dataset_gt import has_supporting_paragraphs

    kept = [q for q in questions if has_supporting_paragraphs(q)]
    dropped = Counter(dataset_of(q) for q in questions if not has_supporting_paragraphs(q))
    if dropped:
        log.warning(
            "data.require_supporting_paragraphs: dropped %d of %d questions whose paragraphs lack a supporting one (%s)",
            sum(dropped.values()),
            len(questions),
            ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())),
        )
    if not kept:
        raise ValueError(
            "data.require_supporting_paragraphs: no question of data.source ships its supporting paragraphs"
        )
    return kept


def check_unique_uids(questions: Sequence[QAExample], files: Sequence[str]) -> None:
    """Refuse a question pool in which two questions share a uid (the same file given twice, or two
    files whose dataset names and ids collide)."""
    seen: set[str] = set()
    for q in questions:
        if q.uid in seen:
            raise ValueError(
                f"data.source {list(files)}: uid {q.uid!r} occurs twice; give each file once, in folders named after "
                "their dataset (uids are prefixed with it)"
            )
        seen.add(q.uid)


def questions_corpus(questions: Sequence[QAExample], path: Path) -> Path:
    """Write the paragraphs `questions` ship with (each once) as the retriever corpus at `path`."""
    from pvpo.envs.corpus import corpus_from_examples, write_corpus

    passages = corpus_from_examples(questions)
    if not passages:
        raise ValueError(
            "data.corpus=questions: the questions ship no paragraphs (HotpotQA's context, MuSiQue's paragraphs); "
            "give data.corpus a corpus file instead"
        )
    write_corpus(passages, path)
    return path


def write_questions(questions: Sequence[QAExample], path: Path) -> None:
    """`questions` as FlashRAG jsonl (`id`, `question`, `golden_answers`), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_jsonl(
        path, ({"id": q.uid, "question": q.question, "golden_answers": list(q.golden_answers)} for q in questions)
    )


_INDEX_DIR = "retriever.index_dir"


@contextlib.contextmanager
def retriever_session(cfg: TrainConfig, run_dir: Path, corpus_path: Path | None) -> Iterator[Searcher]:
    """A Searcher for the run: a client of `retriever.url`, or of a loopback server over an index
    of `corpus_path` built (or reused) under `retriever.index_dir` / `<run>/index`."""
    from pvpo.retriever.client import RetrieverClient

    r = cfg.retriever
    if r.url:
        if any(has_masked_credentials(u) for u in ([r.url] if isinstance(r.url, str) else r.url)):
            raise ValueError(
                "retriever.url: its credentials are not in the run's config.yaml (written as ***): "
                "give retriever.url=... again on --resume, or keep the secret in PVPO_RETRIEVER_TOKEN"
            )
        token = r.token or os.environ.get("PVPO_RETRIEVER_TOKEN") or None
        client = RetrieverClient(
            r.url, topk=r.topk, timeout=r.timeout, retries=r.retries, max_backoff=r.max_backoff, token=token
        )
        try:
            yield client
        finally:
            client.close()
        return
    from pvpo.locks import folder_lock
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_backend, set_default_dtype
    from pvpo.retriever.outdir import build_into
    from pvpo.retriever.server import BackgroundServer

    index_dir = Path(cfg.retriever.index_dir) if cfg.retriever.index_dir else RunDir(run_dir).index
    set_default_backend(r.encoder_backend)  # the loopback server's encoders live in this process
    set_default_dtype(r.encoder_dtype)
    try:
        if not (index_dir / "meta.json").exists():
            if corpus_path is None:
                raise ValueError("no retriever.url, no retriever.index_dir and no corpus to index: set one of them")
            # through the owned-folder rule `pvpo retriever build` follows: a user's folder is never written
            # (the run's own <run>/index is under the run dir's lock; a lock file beside it would be a stray entry)
            lock = folder_lock(index_dir, "pvpo train") if r.index_dir else contextlib.nullcontext()
            with lock, build_into(index_dir, overwrite=False, source=corpus_path, what=_INDEX_DIR) as target:
                build_index(corpus_path, target, model=cfg.retriever.encoder)
        with BackgroundServer(str(index_dir)) as server:
            client = RetrieverClient(
                server.url, topk=r.topk, timeout=r.timeout, retries=r.retries, max_backoff=r.max_backoff
            )
            try:
                yield client
            finally:
                client.close()
    finally:
        set_default_backend(None)
        set_default_dtype(None)


def step_examples(train: Sequence[QAExample], step: int, k: int, seed: int) -> list[QAExample]:
    """The `k` prompts of `step` (1-based): consecutive slices of a per-epoch permutation."""
    n = len(train)
    k = min(k, n)
    per_epoch = n // k
    epoch, pos = divmod(step - 1, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return [train[int(i)] for i in perm[pos * k : (pos + 1) * k]]
