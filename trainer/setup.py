"""What a run builds before its first step, beside its data (`trainer/data.py`), in two parts.

Before the Trainer (`prepare_run`, returning a `RunStart`): the run's files (a resume's
checkpointed state, a sweep's shared anchor), the seeds, the policy at step 0 (built, or reloaded
from `<run>/initial_policy`), checked, placed, with its rollout engine (`trainer/policy_engine.py`),
and on a fresh policy the stages its config asks: the base evaluation (`run.eval_base`) and the SFT
warm start (`model.warm_start_steps`), after which it is saved as `<run>/initial_policy`. Inside the
Trainer (`build_model`, `estimator_state`): what it trains around the policy it is given: LoRA
adapters, the frozen reference, FSDP2 sharding, the estimator's own state.

The split is torchtune's: a recipe calls library pieces, and the Trainer is given a policy and
trains it; constructing one evaluates nothing and runs no SFT. The stages stay library pieces here,
not in `pvpo.recipes`, because three callers run them before building a Trainer: `pvpo demo` (a
recipe), `pvpo train` and the library's `pvpo.trainer.train()`, and no component may import the
recipes (tests/test_import_directions.py), so `train()` could not reach them there; moving `pvpo
train` into the recipes too would have left library users' `train()` without its warm start.
What the config asks that a run cannot do is refused before any of it (`config/preflight.py`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pvpo.atomic import atomic_write_dir, atomic_write_json
from pvpo.envs.data import QAExample
from pvpo.retriever.types import Searcher
from pvpo.trainer.algorithms.estimator_state import EstimatorContext, EstimatorState
from pvpo.trainer.algorithms.spec import EstimatorSpec
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.data import Data, agent_settings
from pvpo.trainer.heldout.scoring import evaluate_policy
from pvpo.trainer.model.device import (
    PhaseMemory,
    Placement,
    place_policy_model,
    place_reference_model,
    placement,
    resolve_device,
    with_resolved_dtype,
)
from pvpo.trainer.model.optimizer_spill import remove_stale_spill
from pvpo.trainer.model.policy import Policy
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.policy_engine import engine_factory, owns_weights, with_lora
from pvpo.trainer.reference.reuse import reuse_if_asked
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.checkpoint import latest_checkpoint, restore_state_files
from pvpo.trainer.state.resume import check_checkpoint_config
from pvpo.trainer.state.run_dir import RunDir

log = logging.getLogger(__name__)

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
    protocol = agent_settings(cfg).episode().tag_protocol
    tags = (protocol.think, protocol.search, protocol.result, protocol.answer)
    return policy_from_config(cfg.model, corpus_texts=data.texts, tags=tags, seed=cfg.run.seed), True


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


def check_policy(cfg: TrainConfig, policy: Policy) -> None:
    """What the config asks of the policy it names, refused (one line naming the key) before the
    base evaluation and the warm start run: a chat template its tokenizer has, LoRA's target modules
    among its modules (checked by peft only after the warm start, where adapters are added), the GT
    model's tokenizer equal to its own (the GT source loads that model at the first anchor)."""
    from pvpo.trainer.model.lora import check_target_modules

    m = cfg.model
    if m.chat_template and not getattr(policy.tokenizer, "chat_template", None):
        raise ValueError(
            f"model.chat_template is set but the tokenizer of {m.path or 'the tiny policy'} has no chat template: "
            "set model.chat_template=false, or give a chat model's folder as model.path"
        )
    if m.lora.enabled:
        check_target_modules(policy.model, m.lora.target_modules)
    alg = cfg.algorithm
    if alg.group_sampling.enabled and alg.gt.source == "model" and alg.gt.model.path:
        from pvpo.trainer.reference.gt_sources import check_same_tokenizer, gt_model_tokenizer

        path = alg.gt.model.path
        check_same_tokenizer(path, gt_model_tokenizer(path), policy.tokenizer)


@dataclass
class RunStart:
    """What a Trainer starts from (`prepare_run`): the policy at step 0 (placed `where`, with its
    rollout `engine` and the factory of more), whether it was built now (`fresh`) or reloaded from
    `<run>/initial_policy`, the checkpoint a resume continues from, the meter of each phase's peak
    memory, and how its base evaluation and warm start went (measured now, or on a resume read
    back from `<run>/warm_start.json`)."""

    policy: Policy
    engine: RolloutEngine
    where: Placement
    memory: PhaseMemory
    make_engine: Callable[[torch.nn.Module], RolloutEngine]
    fresh: bool
    resume: bool = False
    checkpoint: Path | None = None
    warm_start_losses: list[float] = field(default_factory=list)
    warm_start_seconds: float = 0.0
    eval_base: dict[str, float] = field(default_factory=dict)  # held-out metrics before the warm start
    eval_base_em: list[float] = field(default_factory=list)  # and each question's EM
    eval_base_scores: list[dict[str, float]] = field(default_factory=list)  # and all its scores

    @property
    def model(self) -> torch.nn.Module:
        """The policy's transformers model (trained in place by the warm start)."""
        return self.policy.model

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer."""
        return self.policy.tokenizer


# ---- before the Trainer: the run's files, the seeds, the policy at step 0 and its stages ----


def restore_run_files(cfg: TrainConfig, run_dir: Path, data: Data, *, resume: bool) -> Path | None:
    """The run's files before any model, so what they refuse (a hand-edited config, a reused anchor
    that misses an RL prompt) comes before the base evaluation and the warm start: on a resume, a
    killed run's optimizer spill removed, the latest checkpoint's config checked and its state
    files (anchor, partition, GT cache) restored; on a fresh run, a sweep's shared reference copied
    (`algorithm.anchor.reuse_from`). Returns the checkpoint a resume continues from."""
    files = RunDir(run_dir)
    if resume:  # a killed run's optimizer state, older than the checkpoint the Trainer loads
        remove_stale_spill(files.optimizer_spill)
    ckpt = latest_checkpoint(run_dir) if resume else None
    if ckpt is not None:  # a hand-edited config.yaml would continue another run from these weights
        check_checkpoint_config(ckpt, cfg)
    if ckpt is not None and ddp.is_main():  # the anchor, partition and GT cache as they were at the checkpoint
        restore_state_files(ckpt, files.state_files())
    elif ckpt is None and ddp.is_main():  # a sweep's arms may share one reference (anchor.reuse_from)
        reuse_if_asked(cfg.algorithm, files, data.train)
    ddp.barrier()  # under torchrun the other ranks read what rank 0 restored
    return ckpt


def policy_at_start(cfg: TrainConfig, run_dir: Path, data: Data) -> RunStart:
    """The run's seeds (`run.threads`, then `torch.manual_seed(run.seed)`: every draw after it,
    the policy's initialisation first, follows from it), then the policy at step 0
    (`initial_policy`), checked (`check_policy`), placed, with its rollout engine; a reloaded one
    with what `<run>/warm_start.json` recorded of its base evaluation and warm start."""
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    policy, fresh = initial_policy(cfg, data, run_dir)
    m = cfg.model
    check_policy(cfg, policy)  # before it is evaluated or warm-started
    where = placement(m.device, m.dtype, m.attn_implementation, m.gradient_checkpointing)
    where.sharded = ddp.is_distributed()
    place_policy_model(policy.model, where)
    make_engine = engine_factory(cfg, policy.tokenizer)
    start = RunStart(policy, make_engine(policy.model), where, PhaseMemory(where.device), make_engine, fresh)
    saved = RunDir(run_dir).warm_start
    if not fresh and saved.exists():
        record = json.loads(saved.read_text())
        start.warm_start_losses = record["losses"]
        start.eval_base, start.eval_base_em = record.get("eval_base", {}), record.get("eval_base_em", [])
        start.eval_base_scores = record.get("eval_base_scores", [])
    return start


def prepare_run(
    cfg: TrainConfig,
    run_dir: Path,
    data: Data,
    searcher: Searcher,
    *,
    resume: bool = False,
    show_progress: bool = True,
) -> RunStart:
    """What `pvpo train`, `pvpo demo` and the library's `train()` run before they build a Trainer,
    in order: `restore_run_files`, `policy_at_start`, and on a fresh policy the stages its config
    asks, the base evaluation (`run.eval_base`) and then the warm start (`model.warm_start_steps`),
    before it is saved as `<run>/initial_policy`. A resume reloads that policy and runs neither
    (one whose first attempt stopped before saving it starts it again)."""
    cfg = with_resolved_dtype(cfg, resolve_device(cfg.model.device))
    run_dir = Path(run_dir)
    checkpoint = restore_run_files(cfg, run_dir, data, resume=resume)
    start = policy_at_start(cfg, run_dir, data)
    start.resume, start.checkpoint = resume, checkpoint
    if not start.fresh:
        return start
    if cfg.model.warm_start_steps and (data.world is not None or data.warm_start):
        if cfg.run.eval_base and data.eval:
            with start.memory.phase("eval_base"):
                base_evaluation(cfg, data, start, searcher, show_progress=show_progress)
        # an engine with its own copy of the weights (vLLM) is shut while the SFT runs and built
        # again on the warm-started weights: its KV cache and weights are not resident beside
        # the SFT's optimizer state and activations (the multi-hop recipe's warm start: 8.6 GiB
        # with it resident and 2,048-token micro-batches, 6.9 shut and 1,024; rebuilt in seconds)
        shut = owns_weights(start.engine, start.model)
        if shut:
            start.engine.close()
        with start.memory.phase("warm_start"):  # mem/warm_start_peak_rss_gib, then its freed heap returned
            warm_start(cfg, data, start, searcher, RunDir(run_dir), show_progress=show_progress)
        if shut:
            start.engine = start.make_engine(start.model)
        else:
            start.engine.sync_weights(start.model)
    if ddp.is_main():
        from pvpo.trainer.model.policy import save_policy

        atomic_write_dir(RunDir(run_dir).initial_policy, lambda tmp: save_policy(start.policy, tmp))
    return start


def base_evaluation(
    cfg: TrainConfig, data: Data, start: RunStart, searcher: Searcher, *, show_progress: bool = True
) -> None:
    """Held-out metrics of the policy before its warm start (`run.eval_base`), into `start`."""
    start.eval_base = evaluate_policy(
        cfg,
        start.engine,
        start.tokenizer,
        start.where,
        data.eval,
        searcher,
        "base",
        start.eval_base_em,
        start.eval_base_scores,
        show_progress=show_progress,
    )


def warm_start_trajectories(
    cfg: TrainConfig, data: Data, tokenizer: Any, searcher: Searcher
) -> tuple[list[Trajectory], list[QAExample], dict[str, int]]:
    """The warm start's SFT trajectories for `data.warm_start` (the RL prompts themselves when the
    config names no separate set): the synthetic world's oracle, or for a QA file the dataset's own
    annotation (`dataset` GT source; questions whose plan cannot be written or whose searches miss
    their paragraphs are left out and counted in the returned report); with the questions that got
    one, in `data.warm_start`'s order."""
    from pvpo.trainer.rollout.replay import oracle_trajectories

    m, epcfg = cfg.model, agent_settings(cfg).episode()
    questions = list(data.warm_start)
    report: dict[str, int] = {}
    if data.world is not None:
        trajs = oracle_trajectories(
            questions,
            lambda ex: data.world.oracle_trajectory(ex, epcfg.tag_protocol),
            tokenizer,
            searcher,
            epcfg,
            chat_template=m.chat_template,
        )
        return trajs, questions, report
    from pvpo.trainer.reference.dataset_source import dataset_trajectories

    written, counts = dataset_trajectories(
        questions, tokenizer, searcher, epcfg, chat_template=m.chat_template, eos=True
    )
    trajs = [t for t in written if t is not None and t.reward >= cfg.algorithm.gt.min_reward - 1e-9]
    report = {**counts, "below_min_reward": sum(t is not None for t in written) - len(trajs)}
    if not trajs:
        raise ValueError(
            f"model.warm_start_steps: none of the {len(questions)} warm-start questions of {cfg.data.source} "
            f"has a dataset GT trajectory ({report}); use MuSiQue / HotpotQA-style annotated questions"
        )
    return trajs, [ex for ex in questions if any(t.uid == ex.uid for t in trajs)], report


def warm_start(
    cfg: TrainConfig, data: Data, start: RunStart, searcher: Searcher, files: RunDir, *, show_progress: bool = True
) -> None:
    """SFT on the warm start's trajectories (`warm_start_trajectories`). Losses, questions and the
    seconds of the SFT steps alone (`sft_seconds`, without writing the trajectories: what a
    compute-matched SFT arm's step count is derived from) go to `<run>/warm_start.json`."""
    from pvpo.trainer.model.warmstart import warm_start as sft

    m, t0 = cfg.model, time.perf_counter()
    trajs, questions, report = warm_start_trajectories(cfg, data, start.tokenizer, searcher)
    t_sft = time.perf_counter()
    with start.where.autocast():  # model.dtype, as for the update (bf16 on CPU: see the recipe's config)
        start.warm_start_losses = sft(
            start.model,
            trajs,
            start.tokenizer.pad_token_id,
            steps=m.warm_start_steps,
            lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size,
            seed=cfg.run.seed,
            max_tokens=cfg.optim.max_tokens_per_micro_batch,
            show_progress=show_progress,
        )
    start.warm_start_seconds = time.perf_counter() - t0
    atomic_write_json(
        files.warm_start,
        {
            "losses": start.warm_start_losses,
            "questions": [ex.uid for ex in questions],
            "dataset_gt": report,
            "sft_seconds": time.perf_counter() - t_sft,
            "eval_base": start.eval_base,
            "eval_base_em": start.eval_base_em,
            "eval_base_scores": start.eval_base_scores,
        },
    )


# ---- the Trainer's own: what it builds around the policy it is given ----------------------


@dataclass
class Model:
    """The trained policy and what samples from it: `model` (a transformers model, or peft's
    wrapper of one, possibly FSDP-sharded), its tokenizer, its rollout engine, the frozen
    reference (when kept), where it computes and the meter of each phase's peak memory."""

    model: torch.nn.Module
    tokenizer: Any
    engine: RolloutEngine
    ref_model: torch.nn.Module | None
    where: Placement
    memory: PhaseMemory
    make_engine: Callable[[torch.nn.Module], RolloutEngine]


def build_model(cfg: TrainConfig, start: RunStart, spec: EstimatorSpec) -> Model:
    """What the Trainer trains, around the policy it starts from (`prepare_run`): LoRA adapters,
    the frozen reference when `needs_reference_model`, FSDP2 sharding under torchrun."""
    out = Model(start.model, start.tokenizer, start.engine, None, start.where, start.memory, start.make_engine)
    m = cfg.model
    if m.lora.enabled:  # after the warm start and the saved initial policy: those are the base model
        out.model, out.engine = with_lora(out.model, out.engine, m.lora)
    if needs_reference_model(cfg, spec):
        from pvpo.trainer.model.policy import frozen_copy

        out.ref_model = place_reference_model(frozen_copy(out.model), out.where)
    if ddp.is_distributed():  # FSDP2: rank 0's weights, sharded; the engine's whole copy refreshed
        for mod in (out.model, out.ref_model):
            if mod is not None:
                ddp.broadcast_from_main(mod)
                ddp.shard(mod, compute_dtype=out.where.dtype)
        out.engine.sync_weights(out.model)
    return out


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
