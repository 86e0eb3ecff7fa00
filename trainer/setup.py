"""What a run builds before its first step: questions, a corpus, a retriever, the episode rules,
the policy (placed, warm-started, with LoRA, sharded), the frozen reference, the rollout engine,
the optimizer, and the estimator's own state; and what a resume restores.

The synthetic world is generated from the config; a real dataset comes from a file readable by
`pvpo.envs.loaders`. With no `retriever.url`, the corpus is indexed under the run directory (once;
a resumed run reuses the index) and served on loopback for the life of the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pvpo.atomic import atomic_write_dir, atomic_write_json, atomic_write_jsonl
from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.retriever.types import Searcher
from pvpo.trainer.algorithms.spec import EstimatorSpec, available_estimators, get_spec
from pvpo.trainer.algorithms.state import EstimatorContext, EstimatorState
from pvpo.trainer.config.schema import QUESTIONS_CORPUS, TrainConfig
from pvpo.trainer.model.device import PhaseMemory, Placement, place_policy_model, place_reference_model, placement
from pvpo.trainer.model.policy import Policy
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.rollout.agent_loop import LoopConfig
from pvpo.trainer.rollout.engine import RolloutEngine, build_engine
from pvpo.trainer.state.run_dir import RunDir

log = logging.getLogger(__name__)

# ---- data and the retriever ----------------------------------------------------------------


@dataclass
class Data:
    train: list[QAExample]
    eval: list[QAExample]
    corpus_path: Path | None
    texts: list[str] = field(default_factory=list)  # what a local tokenizer is trained on
    world: Any = None  # the SyntheticWorld, when the data is synthetic (oracle trajectories)
    warm_start: list[QAExample] = field(default_factory=list)  # SFT questions (oracle or dataset GT)


def episode_config(cfg: TrainConfig) -> EpisodeConfig:
    """The environment's rules for this run."""
    return EpisodeConfig(
        protocol=cfg.env.protocol,
        reward=cfg.algorithm.reward,
        reward_params=dict(cfg.algorithm.reward_params),
        max_turns=cfg.rollout.max_turns,
        topk=cfg.retriever.topk,
        max_obs_chars=cfg.env.max_obs_chars,
        prompt_template=cfg.env.prompt_template,
        max_question_chars=cfg.env.max_question_chars,
    )


def loop_config(cfg: TrainConfig, temperature: float | None = None) -> LoopConfig:
    """The agent loop's limits for this run's rollouts, at `temperature` (default the rollouts')."""
    r = cfg.rollout
    return LoopConfig(
        temperature=r.temperature if temperature is None else temperature,
        top_p=r.top_p,
        max_turns=r.max_turns,
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
        protocol = episode_config(cfg).tag_protocol
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
            else:
                write_questions(validation, RunDir(run_dir).validation)
        if d.corpus == QUESTIONS_CORPUS:
            corpus_path = questions_corpus([*train, *evals], RunDir(run_dir).corpus)
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
    return Data(rl, held_out, corpus_path, texts, world, sft)


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


@contextlib.contextmanager
def retriever_session(cfg: TrainConfig, run_dir: Path, corpus_path: Path | None) -> Iterator[Searcher]:
    """A Searcher for the run: a client of `retriever.url`, or of a loopback server over an index
    of `corpus_path` built (or reused) under `retriever.index_dir` / `<run>/index`."""
    from pvpo.retriever.client import RetrieverClient

    r = cfg.retriever
    if r.url:
        token = r.token or os.environ.get("PVPO_RETRIEVER_TOKEN") or None
        client = RetrieverClient(
            r.url, topk=r.topk, timeout=r.timeout, retries=r.retries, max_backoff=r.max_backoff, token=token
        )
        try:
            yield client
        finally:
            client.close()
        return
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_backend, set_default_dtype
    from pvpo.retriever.server import BackgroundServer

    index_dir = Path(cfg.retriever.index_dir) if cfg.retriever.index_dir else RunDir(run_dir).index
    set_default_backend(r.encoder_backend)  # the loopback server's encoders live in this process
    set_default_dtype(r.encoder_dtype)
    try:
        if not (index_dir / "meta.json").exists() and not any(index_dir.glob("*.faiss")):
            if corpus_path is None:
                raise ValueError("no retriever.url, no retriever.index_dir and no corpus to index: set one of them")
            build_index(corpus_path, index_dir, model=cfg.retriever.encoder)
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


# ---- the policy, its engine and the reference -------------------------------------------------


def initial_policy(cfg: TrainConfig, data: Data, run_dir: Path) -> tuple[Policy, bool]:
    """The policy at step 0, and whether it was just created (not reloaded).

    It is saved to `<run>/initial_policy` once built (and warm-started), so a resumed run and the
    frozen reference both reload the same weights and tokenizer; in float32, the master weights'
    dtype (`policy_from_config`)."""
    from pvpo.trainer.model.policy import load_policy, policy_from_config

    saved = RunDir(run_dir).initial_policy
    if (saved / "config.json").exists():
        return load_policy(saved, dtype="float32"), False
    protocol = episode_config(cfg).tag_protocol
    tags = (protocol.think, protocol.search, protocol.result, protocol.answer)
    return policy_from_config(cfg.model, corpus_texts=data.texts, tags=tags, seed=cfg.run.seed), True


def check_supported(cfg: TrainConfig, spec: EstimatorSpec) -> None:
    """Refuse, naming the key, an estimator registered as not running under torchrun (every
    shipped one runs: `trainer.parallel.shared_state`); a single process runs them all."""
    if not ddp.is_distributed() or spec.sharded:
        return
    sharded = ", ".join(n for n in available_estimators() if get_spec(n).sharded)
    raise ValueError(
        f"algorithm.estimator={spec.name} does not run under torchrun (its state is learned by one "
        f"process): run it without torchrun (--nproc 1), or under torchrun one of {sharded}"
    )


def uses_anchor(cfg: TrainConfig, spec: EstimatorSpec) -> bool:
    """Whether the run computes reference anchors: the estimator needs them, or Group Sampling
    reads the reference accuracy from them."""
    return spec.needs_anchors or cfg.algorithm.group_sampling.enabled


def needs_reference_model(cfg: TrainConfig, spec: EstimatorSpec) -> bool:
    """Whether the run keeps a frozen copy of the initial policy: for the KL penalty, for anchor
    refreshes that resample the reference, or for GT trajectories scored by the reference."""
    alg = cfg.algorithm
    a, gs = alg.anchor, alg.group_sampling
    refresh_reference = uses_anchor(cfg, spec) and a.refresh_every > 0 and a.refresh_from == "reference"
    return cfg.optim.kl_coef > 0 or refresh_reference or (gs.enabled and alg.gt.logprobs == "reference")


@dataclass
class Model:
    """The trained policy and what samples from it: `model` (a transformers model, or peft's
    wrapper of one, possibly FSDP-sharded), its tokenizer, its rollout engine, the frozen
    reference (when kept), where it computes, and how its warm start went."""

    model: torch.nn.Module
    tokenizer: Any
    engine: RolloutEngine
    ref_model: torch.nn.Module | None
    where: Placement
    memory: PhaseMemory
    make_engine: Callable[[torch.nn.Module], RolloutEngine]
    warm_start_losses: list[float] = field(default_factory=list)
    warm_start_seconds: float = 0.0
    eval_base: dict[str, float] = field(default_factory=dict)  # held-out metrics before the warm start
    eval_base_em: list[float] = field(default_factory=list)  # and each question's EM
    eval_base_scores: list[dict[str, float]] = field(default_factory=list)  # and all its scores


def engine_factory(cfg: TrainConfig, tokenizer: Any) -> Callable[[torch.nn.Module], RolloutEngine]:
    """`make(model)`: the configured rollout engine over `model`, with its `rollout.<engine>`
    options (under torchrun: over this rank's whole copy of the weights, `distributed.engine_for`)."""
    r = cfg.rollout

    def make(model: torch.nn.Module) -> RolloutEngine:
        return ddp.engine_for(
            lambda **kw: build_engine(r.engine, tokenizer=tokenizer, **kw),
            model,
            engine=r.engine,
            dtype=cfg.model.dtype,
            options=r.engine_options(),
        )

    return make


def build_model(
    cfg: TrainConfig,
    data: Data,
    run_dir: Path,
    searcher: Searcher,
    spec: EstimatorSpec,
    *,
    show_progress: bool = True,
) -> Model:
    """The policy at step 0 (built, placed, warm-started on a fresh run and saved as the initial
    policy), LoRA adapters, the frozen reference when `needs_reference_model`, FSDP2 sharding under
    torchrun, and the rollout engine over it."""
    files = RunDir(run_dir)
    policy, fresh = initial_policy(cfg, data, run_dir)
    m = cfg.model
    where = placement(m.device, m.dtype, m.attn_implementation, m.gradient_checkpointing)
    where.sharded = ddp.is_distributed()
    place_policy_model(policy.model, where)
    make_engine = engine_factory(cfg, policy.tokenizer)
    out = Model(
        policy.model, policy.tokenizer, make_engine(policy.model), None, where, PhaseMemory(where.device), make_engine
    )
    if fresh:
        if m.warm_start_steps and (data.world is not None or data.warm_start):
            if cfg.run.eval_base and data.eval:
                with out.memory.phase("eval_base"):
                    base_evaluation(cfg, data, out, searcher, show_progress=show_progress)
            with out.memory.phase("warm_start"):  # mem/warm_start_peak_rss_gib, then its freed heap returned
                warm_start(cfg, data, out, searcher, files, show_progress=show_progress)
        if ddp.is_main():
            from pvpo.trainer.model.policy import save_policy

            atomic_write_dir(files.initial_policy, lambda tmp: save_policy(policy, tmp))
    elif files.warm_start.exists():
        saved = json.loads(files.warm_start.read_text())
        out.warm_start_losses = saved["losses"]
        out.eval_base, out.eval_base_em = saved.get("eval_base", {}), saved.get("eval_base_em", [])
        out.eval_base_scores = saved.get("eval_base_scores", [])
    if m.lora.enabled:  # after the warm start and the saved initial policy: those are the base model
        from pvpo.trainer.model.lora import apply_lora

        out.model, out.engine = apply_lora(out.model, out.engine, m.lora)
    if needs_reference_model(cfg, spec):
        from pvpo.trainer.model.policy import frozen_copy

        out.ref_model = place_reference_model(frozen_copy(out.model), where)
    if ddp.is_distributed():  # FSDP2: rank 0's weights, sharded; the engine's whole copy refreshed
        for mod in (out.model, out.ref_model):
            if mod is not None:
                ddp.broadcast_from_main(mod)
                ddp.shard(mod, compute_dtype=where.dtype)
        out.engine.sync_weights(out.model)
    return out


def evaluate_policy(
    cfg: TrainConfig,
    engine: RolloutEngine,
    tokenizer: Any,
    where: Placement,
    examples: Sequence[QAExample],
    searcher: Searcher,
    tag: str,
    per_question: list[float] | None = None,
    scores: list[dict[str, float]] | None = None,
    show_progress: bool = False,
) -> dict[str, float]:
    """Held-out metrics (`eval/*`) of the policy behind `engine` on `examples`, one rollout each at
    the run's evaluation temperature, seeded by `tag`; `per_question` receives each one's EM,
    `scores` each one's scores (`heldout.question_scores`); `show_progress`: a meter while it runs."""
    from pvpo.trainer.heldout import eval_seed, evaluate

    with where.autocast():
        return evaluate(
            engine,
            tokenizer,
            examples,
            searcher,
            episode_config(cfg),
            loop_config(cfg),
            temperature=cfg.run.eval_temperature,
            top_p=cfg.run.eval_top_p,
            seed=eval_seed(tag),
            batch_size=cfg.rollout.batch_size,
            per_question=per_question,
            scores=scores,
            show_progress=show_progress,
            desc=f"{cfg.data.evaluate_on.replace('_', '-')} evaluation ({tag})",
        )


def base_evaluation(
    cfg: TrainConfig, data: Data, model: Model, searcher: Searcher, *, show_progress: bool = True
) -> None:
    """Held-out metrics of the policy before its warm start (`run.eval_base`), into `model`."""
    model.eval_base = evaluate_policy(
        cfg,
        model.engine,
        model.tokenizer,
        model.where,
        data.eval,
        searcher,
        "base",
        model.eval_base_em,
        model.eval_base_scores,
        show_progress=show_progress,
    )


def warm_start(
    cfg: TrainConfig, data: Data, model: Model, searcher: Searcher, files: RunDir, *, show_progress: bool = True
) -> None:
    """SFT on the GT trajectories of `data.warm_start` (the RL prompts themselves when the config
    names no separate set): the synthetic world's oracle, or for a QA file the dataset's own
    annotation (`dataset` GT source; questions whose plan cannot be written or whose searches miss
    their paragraphs are left out and counted). Losses and questions go to `<run>/warm_start.json`."""
    from pvpo.trainer.model.warmstart import warm_start as sft
    from pvpo.trainer.rollout.replay import oracle_trajectories

    m, t0, epcfg = cfg.model, time.perf_counter(), episode_config(cfg)
    questions = data.warm_start
    report: dict[str, int] = {}
    if data.world is not None:
        trajs = oracle_trajectories(
            questions,
            lambda ex: data.world.oracle_trajectory(ex, epcfg.tag_protocol),
            model.tokenizer,
            searcher,
            epcfg,
            chat_template=m.chat_template,
        )
    else:
        from pvpo.trainer.reference.dataset_source import dataset_trajectories

        written, counts = dataset_trajectories(
            questions, model.tokenizer, searcher, epcfg, chat_template=m.chat_template, eos=True
        )
        trajs = [t for t in written if t is not None and t.reward >= cfg.algorithm.gt.min_reward - 1e-9]
        report = {**counts, "below_min_reward": sum(t is not None for t in written) - len(trajs)}
        if not trajs:
            raise ValueError(
                f"model.warm_start_steps: none of the {len(questions)} warm-start questions of {cfg.data.source} "
                f"has a dataset GT trajectory ({report}); use MuSiQue / HotpotQA-style annotated questions"
            )
        questions = [ex for ex in questions if any(t.uid == ex.uid for t in trajs)]
    with model.where.autocast():  # model.dtype, as for the update (bf16 on CPU: see the recipe's config)
        model.warm_start_losses = sft(
            model.model,
            trajs,
            model.tokenizer.pad_token_id,
            steps=m.warm_start_steps,
            lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size,
            seed=cfg.run.seed,
            max_tokens=cfg.optim.max_tokens_per_micro_batch,
            show_progress=show_progress,
        )
    model.engine.sync_weights(model.model)
    model.warm_start_seconds = time.perf_counter() - t0
    atomic_write_json(
        files.warm_start,
        {
            "losses": model.warm_start_losses,
            "questions": [ex.uid for ex in questions],
            "dataset_gt": report,
            "eval_base": model.eval_base,
            "eval_base_em": model.eval_base_em,
            "eval_base_scores": model.eval_base_scores,
        },
    )


def estimator_state(cfg: TrainConfig, spec: EstimatorSpec, model: Model, run_dir: Path) -> EstimatorState:
    """This run's state of the estimator (`spec.state`): a critic, V0.5's priors and budget, ..."""
    from pvpo.trainer.model.embed import minilm_embed
    from pvpo.trainer.parallel.shared_state import data_parallel

    context = EstimatorContext(
        algorithm=cfg.algorithm,
        rollout_n=cfg.rollout.n,
        model=model.model,
        device=model.where.device,
        value_model_path=RunDir(run_dir).value_model,
        embed=minilm_embed,
        parallel=data_parallel(model.where.dtype),
    )
    return spec.make_state(context)
