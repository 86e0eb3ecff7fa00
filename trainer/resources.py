"""What a run needs before its first step: questions, a corpus, a retriever, and the policy.

The synthetic world is generated from the config; a real dataset comes from a file readable by
`pvpo.envs.loaders`. With no `retriever.url`, the corpus is indexed under the run directory (once;
a resumed run reuses the index) and served on loopback for the life of the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.retriever.types import Searcher
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.model.policy import Policy


@dataclass
class Data:
    train: list[QAExample]
    eval: list[QAExample]
    corpus_path: Path | None
    texts: list[str] = field(default_factory=list)  # what a local tokenizer is trained on
    world: Any = None  # the SyntheticWorld, when the data is synthetic (oracle trajectories)
    warm_start: list[QAExample] = field(default_factory=list)  # oracle SFT questions (synthetic only)


def episode_config(cfg: TrainConfig) -> EpisodeConfig:
    """The environment's rules for this run."""
    return EpisodeConfig(
        protocol=cfg.env.protocol, reward=cfg.algorithm.reward, reward_params=dict(cfg.algorithm.reward_params),
        max_turns=cfg.rollout.max_turns, topk=cfg.retriever.topk, max_obs_chars=cfg.env.max_obs_chars,
        prompt_template=cfg.env.prompt_template,
    )  # fmt: skip


def load_data(cfg: TrainConfig, run_dir: Path) -> Data:
    """Train / eval questions, warm-start questions and the corpus to index (written under
    `run_dir` when synthetic). Splits follow `cfg.data`: shuffled with `shuffle_seed`, the first
    `max_train_examples` are the RL prompts, and `warm_start_examples` further questions (sharing
    none with the RL prompts) are the warm start's; without it `warm_start` is the RL prompts."""
    from pvpo.envs.loaders import load_dataset
    from pvpo.trainer.model.warmstart import disjoint_splits

    d = cfg.data
    if d.source == "synthetic":
        from pvpo.envs.synthetic import SyntheticWorld

        s = d.synthetic
        world = SyntheticWorld.generate(s.seed, s.n_entities, n_relations=s.n_relations, max_hops=s.max_hops,
                                        questions_per_hop=s.questions_per_hop, test_fraction=s.test_fraction)  # fmt: skip
        train, evals = world.questions("train"), world.questions("test")
        corpus_path: Path | None = world.write_corpus(run_dir / "corpus.jsonl")
        protocol = episode_config(cfg).tag_protocol
        texts = [p.contents for p in world.passages] + [protocol.instruction()]
        texts += [q.question for q in train] + ["".join(world.oracle_trajectory(q, protocol)) for q in train[:200]]
        rl, sft = disjoint_splits(train, n_rl=d.max_train_examples, n_sft=d.warm_start_examples,
                                  max_sft_hops=d.warm_start_max_hops, shuffle_seed=d.shuffle_seed)  # fmt: skip
    else:
        world = None
        train = load_dataset(d.source)
        evals = load_dataset(d.eval_source) if d.eval_source else []
        corpus_path = Path(d.corpus) if d.corpus else None
        texts = [q.question for q in train]
        rl, sft = disjoint_splits(train, n_rl=d.max_train_examples, n_sft=None, shuffle_seed=d.shuffle_seed)[0], []
    held_out = disjoint_splits(evals, n_rl=d.max_eval_examples, n_sft=None, shuffle_seed=d.shuffle_seed)[0]
    return Data(rl, held_out, corpus_path, texts, world, sft)


@contextlib.contextmanager
def retriever_session(cfg: TrainConfig, run_dir: Path, corpus_path: Path | None) -> Iterator[Searcher]:
    """A Searcher for the run: a client of `retriever.url`, or of a loopback server over an index
    of `corpus_path` built (or reused) under `retriever.index_dir` / `<run>/index`."""
    from pvpo.retriever.client import RetrieverClient

    r = cfg.retriever
    if r.url:
        client = RetrieverClient(r.url, topk=r.topk, timeout=r.timeout, retries=r.retries, max_backoff=r.max_backoff,
                                 token=r.token or os.environ.get("PVPO_RETRIEVER_TOKEN") or None)  # fmt: skip
        try:
            yield client
        finally:
            client.close()
        return
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_backend
    from pvpo.retriever.server import BackgroundServer

    index_dir = Path(cfg.retriever.index_dir) if cfg.retriever.index_dir else run_dir / "index"
    set_default_backend(r.encoder_backend)  # the loopback server's encoders live in this process
    try:
        if not (index_dir / "meta.json").exists() and not any(index_dir.glob("*.faiss")):
            if corpus_path is None:
                raise ValueError("no retriever.url, no retriever.index_dir and no corpus to index: set one of them")
            build_index(corpus_path, index_dir, model=cfg.retriever.encoder)
        with BackgroundServer(str(index_dir)) as server:
            client = RetrieverClient(server.url, topk=r.topk, timeout=r.timeout, retries=r.retries,
                                     max_backoff=r.max_backoff)  # fmt: skip
            try:
                yield client
            finally:
                client.close()
    finally:
        set_default_backend(None)


def initial_policy(cfg: TrainConfig, data: Data, run_dir: Path) -> tuple[Policy, bool]:
    """The policy at step 0, and whether it was just created (not reloaded).

    It is saved to `<run>/initial_policy` once built (and warm-started), so a resumed run and the
    frozen reference both reload the same weights and tokenizer."""
    from pvpo.trainer.model.policy import load_policy, policy_from_config

    saved = run_dir / "initial_policy"
    if (saved / "config.json").exists():
        return load_policy(saved, dtype=cfg.model.dtype), False
    protocol = episode_config(cfg).tag_protocol
    tags = (protocol.think, protocol.search, protocol.result, protocol.answer)
    return policy_from_config(cfg.model, corpus_texts=data.texts, tags=tags, seed=cfg.run.seed), True
