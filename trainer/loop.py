"""The training loop: rollouts -> rewards -> advantages -> policy update -> log -> checkpoint.

Everything random is a pure function of `(run.seed, step)` (data order, sampling, mini-batch
order), and the optimizer / RNG / anchor store are checkpointed, so `resume=True` continues
exactly where the last checkpoint left off: no step lost or repeated in `metrics.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pvpo.envs.data import QAExample
from pvpo.progress import Progress
from pvpo.retriever.types import Searcher
from pvpo.trainer.algorithms.advantage_inputs import VALUE_MODEL_FILE, AdvantageInputs
from pvpo.trainer.algorithms.advantages import advantage_stats, get_estimator
from pvpo.trainer.config.schema import TrainConfig, dump_config
from pvpo.trainer.heldout import evaluate
from pvpo.trainer.model.device import PhaseMemory, place_policy_model, place_reference_model, placement
from pvpo.trainer.model.lora import apply_lora, checkpoint_view, is_lora, load_lora_weights
from pvpo.trainer.model.policy import frozen_copy, save_policy
from pvpo.trainer.model.update import batch_logprobs, policy_update
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.parallel.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from pvpo.trainer.reference.anchor import AnchorStore, build_anchor, needs_refresh
from pvpo.trainer.reference.group_sampling import Partition, load_partition, partition, save_partition, savings
from pvpo.trainer.reference.gt import GTCache, GTContext, build_gt_source, fetch_gt
from pvpo.trainer.resources import Data, episode_config, initial_policy, load_data, retriever_session
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.engine import RolloutEngine, build_engine
from pvpo.trainer.rollout.trajectory import Trajectory, collate, summarize
from pvpo.trainer.state.checkpoint import (
    atomic_write_dir,
    latest_checkpoint,
    load_trainer_state,
    load_weights,
    read_jsonl,
    restore_state_files,
    save_checkpoint,
    set_rng_state,
)
from pvpo.trainer.state.cost import CostCounter
from pvpo.trainer.state.metrics_log import MetricsLogger
from pvpo.trainer.state.run_dir import check_resume_config, prepare_fresh

log = logging.getLogger(__name__)

WARM_START_FILE = "warm_start.json"  # the warm start's losses and questions, for reports and resumes
ANCHOR_FILE, PARTITION_FILE, GT_FILE = "anchor.json", "group_sampling.json", "gt_cache.json"
STATE_FILES = (
    ANCHOR_FILE,
    PARTITION_FILE,
    GT_FILE,
    VALUE_MODEL_FILE,
)  # checkpointed with the weights: a resume sees them as they were


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    warm_start_losses: list[float] = field(default_factory=list)
    warm_start_seconds: float = 0.0
    eval_em: dict[str, list[float]] = field(default_factory=dict)  # evaluation tag -> each question's EM (one process)


def step_examples(train: Sequence[QAExample], step: int, k: int, seed: int) -> list[QAExample]:
    """The `k` prompts of `step` (1-based): consecutive slices of a per-epoch permutation."""
    n = len(train)
    k = min(k, n)
    per_epoch = n // k
    epoch, pos = divmod(step - 1, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return [train[int(i)] for i in perm[pos * k : (pos + 1) * k]]


def _seed(*parts: int | str) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def loop_config(cfg: TrainConfig, temperature: float | None = None) -> LoopConfig:
    r = cfg.rollout
    return LoopConfig(temperature=r.temperature if temperature is None else temperature, top_p=r.top_p,
                      max_turns=r.max_turns, max_new_tokens=r.max_new_tokens, max_response_tokens=r.max_response_tokens,
                      chat_template=cfg.model.chat_template)  # fmt: skip


class Trainer:
    """Holds the run's policy, engine, optimizer and anchor; `run()` trains to `run.steps`."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        data: Data,
        searcher: Searcher,
        *,
        resume: bool = False,
        show_progress: bool = True,
    ) -> None:
        self.cfg, self.run_dir, self.data, self.searcher = cfg, run_dir, data, searcher
        self.show_progress = show_progress
        self.epcfg = episode_config(cfg)
        self.result = TrainResult(run_dir, 0)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        policy, fresh = initial_policy(cfg, data, run_dir)
        m = cfg.model
        self.where = placement(m.device, m.dtype, m.attn_implementation, m.gradient_checkpointing)
        self.where.sharded = ddp.is_distributed()
        ddp.check_supported(cfg)
        self.memory = PhaseMemory(self.where.device)
        place_policy_model(policy.model, self.where)
        self.model: torch.nn.Module = policy.model  # a transformers model, or peft's wrapper of one
        self.tokenizer = policy.tokenizer
        self.engine: RolloutEngine = self._build_engine(self.model)
        if fresh:
            if cfg.model.warm_start_steps and data.world is not None:
                self._warm_start()
            if ddp.is_main():
                atomic_write_dir(run_dir / "initial_policy", lambda tmp: save_policy(policy, tmp))
        elif (run_dir / WARM_START_FILE).exists():
            self.result.warm_start_losses = json.loads((run_dir / WARM_START_FILE).read_text())["losses"]
        if m.lora.enabled:  # after the warm start and the saved initial policy: those are the base model
            self.model, self.engine = apply_lora(self.model, self.engine, m.lora)
        alg = cfg.algorithm
        a, gs = alg.anchor, alg.group_sampling
        need_ref = (cfg.optim.kl_coef > 0 or (alg.uses_anchor and a.refresh_every > 0 and a.refresh_from == "reference")
                    or (gs.enabled and alg.gt.logprobs == "reference"))  # fmt: skip
        self.ref_model = place_reference_model(frozen_copy(self.model), self.where) if need_ref else None
        if ddp.is_distributed():  # FSDP2: rank 0's weights, sharded; the engine's whole copy refreshed
            for mod in (self.model, self.ref_model):
                if mod is not None:
                    ddp.broadcast_from_main(mod)
                    ddp.shard(mod, compute_dtype=self.where.dtype)
            self.engine.sync_weights(self.model)
        self._ref_engine: RolloutEngine | None = None  # built on first use: only anchor refreshes sample from it
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.estimator = get_estimator(alg.estimator)
        self.start_step = 0
        self.cost = CostCounter()
        self._report: dict[str, float] = {}  # anchor / Group Sampling figures, logged with the next step
        self._anchor_s_per_rollout: float | None = None
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None and ddp.is_main():  # the anchor, partition and GT cache as they were at the checkpoint
            restore_state_files(ckpt, [run_dir / f for f in STATE_FILES])
        ddp.barrier()  # under torchrun the other ranks read what rank 0 restored
        self.anchor = AnchorStore(run_dir / ANCHOR_FILE, source="reference") if alg.uses_anchor else None
        self.partition: Partition | None = load_partition(run_dir / PARTITION_FILE) if gs.enabled else None
        self.gt_cache = GTCache(run_dir / GT_FILE) if gs.enabled else None
        # gdpo's components, v05's prior and budget, ppo's critic (trainer/advantage_inputs.py)
        self.adv_inputs = AdvantageInputs(cfg, self.model, device=self.where.device, run_dir=run_dir)
        if ckpt is not None and ddp.is_distributed():
            state = load_sharded_checkpoint(ckpt, model=self.model, optimizer=self.optimizer)
            self.engine.sync_weights(self.model)
            self.start_step = int(state["step"])
            if "cost" in state.get("extra", {}):
                self.cost.load_state_dict(state["extra"]["cost"])
        elif ckpt is not None:
            load_lora_weights(self.model, ckpt) if is_lora(self.model) else load_weights(self.model, ckpt)
            self.engine.sync_weights(self.model)
            state = load_trainer_state(ckpt)
            self.optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"])
            self.start_step = int(state["step"])
            if "cost" in state.get("extra", {}):
                self.cost.load_state_dict(state["extra"]["cost"])
            self.adv_inputs.load_state_dict(state.get("extra", {}))
        if ddp.is_main():
            dump_config(cfg, run_dir / "config.yaml")
        # every rank logs the reduced metrics; rank 0's are the run's, the others' go under ranks/
        log_dir = run_dir if ddp.is_main() else run_dir / "ranks" / f"rank_{ddp.rank()}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logger = MetricsLogger(
            log_dir, resume_step=self.start_step, tensorboard=cfg.run.tensorboard and ddp.is_main()
        )

    def close(self) -> None:
        """Shut the rollout engines down (vLLM: its engine process and its temporary copy of the
        model); `with Trainer(...) as trainer:` does it on leaving."""
        for engine in (self.engine, self._ref_engine):
            if engine is not None:
                engine.close()
        self._ref_engine = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- pieces ----------------------------------------------------------------------------
    def _build_engine(self, model: torch.nn.Module) -> RolloutEngine:
        """The configured rollout engine over `model`, with its `rollout.<engine>` options (under
        torchrun: over this rank's whole copy of the weights, see `distributed.engine_for`)."""
        r = self.cfg.rollout
        return ddp.engine_for(lambda **kw: build_engine(r.engine, tokenizer=self.tokenizer, **kw), model, engine=r.engine,
                              dtype=self.cfg.model.dtype, options=r.engine_options())  # fmt: skip

    @property
    def ref_engine(self) -> RolloutEngine | None:
        """An engine sampling from the frozen reference policy (None when no reference is kept)."""
        if self._ref_engine is None and self.ref_model is not None:
            self._ref_engine = self._build_engine(self.ref_model)
        return self._ref_engine

    def _warm_start(self) -> None:
        """SFT on the oracle trajectories of `data.warm_start` (the RL prompts themselves when the
        config names no separate set); the losses and questions go to `<run>/warm_start.json`."""
        from pvpo.trainer.model.warmstart import oracle_trajectories, warm_start

        m, t0 = self.cfg.model, time.perf_counter()
        questions = self.data.warm_start
        trajs = oracle_trajectories(questions, lambda ex: self.data.world.oracle_trajectory(ex, self.epcfg.tag_protocol),
                                    self.tokenizer, self.searcher, self.epcfg, chat_template=m.chat_template)  # fmt: skip
        self.result.warm_start_losses = warm_start(
            self.model, trajs, self.tokenizer.pad_token_id, steps=m.warm_start_steps, lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size, seed=self.cfg.run.seed, show_progress=self.show_progress,
        )  # fmt: skip
        self.engine.sync_weights(self.model)
        self.result.warm_start_seconds = time.perf_counter() - t0
        record = {"losses": self.result.warm_start_losses, "questions": [ex.uid for ex in questions]}
        (self.run_dir / WARM_START_FILE).write_text(json.dumps(record))

    def rollout(
        self,
        examples: Sequence[QAExample],
        *,
        seed: int,
        engine: RolloutEngine | None = None,
        temperature: float | None = None,
        kind: str = "train",
        offset: int = 0,
    ) -> list[Trajectory]:
        """Trajectories for `examples`, `rollout.batch_size` at a time, counted as `kind` cost.
        `offset`: the position of `examples[0]` in the step's whole list (a rank's share), so the
        batches' seeds are those of a single process rolling out the whole list."""
        bs, out = self.cfg.rollout.batch_size, []
        for s in range(0, len(examples), bs):
            with self.where.autocast():
                out += run_agent_loop(engine or self.engine, self.tokenizer, examples[s : s + bs], self.searcher, self.epcfg,
                                      loop_config(self.cfg, temperature), seed=_seed(seed, offset + s))  # fmt: skip
        self.cost.add(kind, out)
        return out

    def ensure_anchor(self, step: int) -> None:
        """Build the anchor before step 1, refresh it when due, finish an interrupted build."""
        if self.anchor is None:
            return
        a = self.cfg.algorithm.anchor
        last = self.anchor.computed_at_step
        incomplete = any(not self.anchor.is_complete(ex.uid, a.num_rollouts) for ex in self.data.train)
        if not (incomplete or needs_refresh(step, a.refresh_every, last)):
            return
        at = last if incomplete else step
        current = at > 0 and a.refresh_from == "current"
        # before this run's first update (and not resumed) the policy is the reference: no second engine
        is_reference = self.start_step == 0 and self.result.steps_done == 0
        ref_engine = None if current or is_reference else self.ref_engine
        engine = ref_engine if ref_engine is not None else self.engine
        source = "current" if current else "reference"

        def rollout_fn(exs: list[QAExample]) -> list[tuple[str, float, float]]:
            seed = _seed("anchor", at, *[e.uid for e in exs[:4]], len(exs))
            trajs = self.rollout(exs, seed=seed, engine=engine, temperature=a.temperature, kind="anchor")
            return [(t.uid, t.reward, t.accuracy) for t in trajs]

        engine.wake_up()
        t0, before = time.perf_counter(), self.cost.pending["anchor"]["rollouts"]
        try:
            ddp.build_anchor_shared(build_anchor, self.data.train, rollout_fn, num_rollouts=a.num_rollouts,
                                    batch_size=max(1, self.cfg.rollout.batch_size // a.num_rollouts), store=self.anchor,
                                    step=at, source=source, show_progress=self.show_progress and ddp.is_main())  # fmt: skip
        finally:
            if engine is not self.engine:
                engine.sleep()  # the reference engine holds no memory until the next refresh
        made = self.cost.pending["anchor"]["rollouts"] - before  # this rank's, as the cost counter saw them
        if made:
            self._anchor_s_per_rollout = (time.perf_counter() - t0) / made
            self._report["time/anchor_s"] = time.perf_counter() - t0

    # ---- Group Sampling ----------------------------------------------------------------------
    def ensure_group_sampling(self) -> None:
        """Partition the train prompts by the current anchor's reference accuracy (once per anchor)
        and fetch GT trajectories for the never-solved ones (cached; a resume fetches nothing)."""
        if self.gt_cache is None or self.anchor is None:
            return
        at = self.anchor.computed_at_step
        if self.partition is not None and self.partition.computed_at_step == at:
            return
        alg = self.cfg.algorithm
        gs, t0 = alg.group_sampling, time.perf_counter()
        part = partition([ex.uid for ex in self.data.train], self.anchor.stats(), drop_threshold=gs.drop_threshold,
                         gt_threshold=gs.gt_threshold, computed_at_step=at)  # fmt: skip
        part.report.update(part.fractions())
        if self._anchor_s_per_rollout is not None:
            part.report.update(
                savings(part, rollouts_per_prompt=self.cfg.rollout.n, seconds_per_rollout=self._anchor_s_per_rollout)
            )
        wanted = set(part.gt)
        ctx = GTContext(self.tokenizer, self.searcher, self.epcfg, loop_config(self.cfg), self.data.world)
        source = build_gt_source(alg.gt.source, alg.gt, ctx)
        try:
            counts = fetch_gt([ex for ex in self.data.train if ex.uid in wanted], source, self.gt_cache,
                              attempts=alg.gt.attempts, min_reward=alg.gt.min_reward,
                              on_generated=lambda ts: self.cost.add("gt", ts, policy_tokens=False),
                              set_logprobs=self._reference_logprobs if alg.gt.logprobs == "reference" else None)  # fmt: skip
        finally:
            source.close()
        part.report.update(counts)
        part.report["time/group_sampling_s"] = time.perf_counter() - t0
        save_partition(part, self.run_dir / PARTITION_FILE)
        self.partition = part
        self._report.update(part.report)

    def _reference_logprobs(self, trajs: list[Trajectory]) -> None:
        """Set each trajectory's `old_logprobs` (pi_gt) to the frozen reference policy's, at the
        rollout temperature, 0 on env tokens."""
        assert self.ref_model is not None  # built whenever gt.logprobs == "reference"
        batch = collate(trajs, self.tokenizer.pad_token_id)
        lp = batch_logprobs(self.ref_model, batch, self.cfg.rollout.temperature)
        for i, t in enumerate(trajs):
            n = len(t.response_ids)
            t.old_logprobs = [float(x) if m else 0.0 for x, m in zip(lp[i, :n].tolist(), t.loss_mask, strict=True)]

    def pool(self) -> list[QAExample]:
        """The training prompts: all of them, or those Group Sampling keeps (all of them again if
        it would keep none, with the reason in the log)."""
        if self.partition is None:
            return self.data.train
        keep = self.partition.pool
        kept = [ex for ex in self.data.train if ex.uid in keep]
        if not kept:
            log.warning(
                "group sampling dropped every training prompt (the reference solves them all); training on all of them"
            )
            return self.data.train
        return kept

    def step_group(self, prompts: Sequence[QAExample]) -> tuple[list[QAExample], list[Trajectory]]:
        """The examples to roll out for `prompts` (N each) and the GT trajectories that replace
        `gt.replace_per_group` of them (at most N - 1) for Group Sampling's GT prompts."""
        n, gt = self.cfg.rollout.n, self.cfg.algorithm.gt
        todo: list[QAExample] = []
        injected: list[Trajectory] = []
        gt_uids = set(self.partition.gt) if self.partition is not None else set()
        for ex in prompts:
            record = self.gt_cache.records.get(ex.uid) if self.gt_cache is not None and ex.uid in gt_uids else None
            # at least one rollout of every group stays the policy's own: a group of GT copies alone
            # is supervised learning for free (cached GT costs no rollout), not PVPO's replacement
            r = min(gt.replace_per_group, n - 1) if record is not None else 0
            todo += [ex] * (n - r)
            injected += [record.trajectory(ex.uid) for _ in range(r)] if record is not None else []
        return todo, injected

    def evaluate(self, tag: str) -> dict[str, float]:
        if not self.data.eval:
            return {}
        r = self.cfg.run
        share = ddp.rank_share(self.data.eval)  # each rank evaluates its share; metrics weighted by share size
        per_question: list[float] = []
        with self.where.autocast():
            metrics = evaluate(self.engine, self.tokenizer, share, self.searcher, self.epcfg, loop_config(self.cfg),
                               temperature=r.eval_temperature, top_p=r.eval_top_p, seed=_seed("eval", tag),
                               batch_size=self.cfg.rollout.batch_size, per_question=per_question) if share else {}  # fmt: skip
        if not ddp.is_distributed():
            self.result.eval_em[tag] = per_question
        return ddp.reduce_metrics(metrics, len(share))

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        self.ensure_anchor(step - 1)
        self.ensure_group_sampling()
        prompts = step_examples(self.pool(), step, cfg.data.prompts_per_step, cfg.run.seed)
        prompts = ddp.rank_share(prompts)  # whole groups per rank (distributed.py)
        group, injected = self.step_group(prompts)
        t0 = time.perf_counter()
        self.engine.wake_up()
        with self.memory.phase("rollout"):
            trajs = self.rollout(
                group, seed=_seed(cfg.run.seed, "step", step), offset=ddp.exclusive_prefix_sum(len(group))
            )
            trajs += self.adv_inputs.extra_rollouts(  # V0.5's adaptive budget: more rollouts for some prompts, counted
                prompts, trajs, lambda exs, rnd: self.rollout(exs, seed=_seed(cfg.run.seed, "v05", step, rnd, ddp.rank())),
                self.anchor.values() if self.anchor is not None else None)  # fmt: skip
            trajs += injected
        t1 = time.perf_counter()
        batch = collate(trajs, self.tokenizer.pad_token_id)
        anchors = self.anchor.values() if self.anchor is not None else None
        adv_kwargs = self.adv_inputs.kwargs(trajs, batch)
        adv = self.estimator(batch.rewards, batch.uids, anchors=anchors, **adv_kwargs)
        self.engine.sleep()  # the KV cache is free while the trainer holds activations and grads
        try:
            with self.memory.phase("train"), self.where.autocast():
                stats = policy_update(self.model, self.optimizer, batch, adv, cfg.optim, temperature=cfg.rollout.temperature,
                                      seed=_seed(cfg.run.seed, "update", step), engine=self.engine, ref_model=self.ref_model,
                                      importance=cfg.rollout.importance_correction,
                                      default_agg=getattr(self.estimator, "loss_agg", "token-mean"),
                                      norm_len=cfg.rollout.max_response_tokens) if self.adv_inputs.trains_policy(step) else {}  # fmt: skip
                stats.update(self.adv_inputs.after_step(batch, adv_kwargs, seed=_seed(cfg.run.seed, "critic", step)))
        finally:
            self.engine.wake_up()  # evaluation and the next rollouts sample again
        t2 = time.perf_counter()
        sampled = trajs[: len(trajs) - len(injected)]
        metrics = {**summarize(sampled), **advantage_stats(adv, batch.uids, mask=batch.loss_mask), **stats,
                   "time/rollout_s": t1 - t0, "time/train_s": t2 - t1}  # fmt: skip
        if anchors is not None:  # over the sampled rollouts' prompts, so reward - anchor compares like with like
            metrics["anchor/mean"] = float(np.mean([anchors[t.uid] for t in sampled])) if sampled else 0.0
        if self.partition is not None:
            metrics["gt/fraction"] = len(injected) / len(trajs)
            metrics["gs/pool_size"] = float(len(self.pool()))
        metrics.update(self._report)
        self._report = {}
        metrics.update(self.cost.step_metrics())
        metrics.update(self.memory.pop())
        return ddp.reduce_metrics(metrics, len(trajs))

    def run(self) -> TrainResult:
        cfg = self.cfg
        if self.start_step == 0 and self.data.eval:
            self.result.eval_before = self.evaluate("before")
        budget = cfg.run.rollout_budget  # when set, the run usually ends before run.steps: no step total to show
        bar = Progress(desc="train", unit="step", initial=self.start_step, total=cfg.run.steps if budget is None else None,
                       enabled=self.show_progress)  # fmt: skip
        for step in range(self.start_step + 1, cfg.run.steps + 1):
            metrics = self.train_step(step)
            # a rollout budget (anchor and GT generation included) ends the run at the step that reaches it
            last = step == cfg.run.steps or (budget is not None and metrics["cost/cum_rollouts"] >= budget)
            if cfg.run.eval_every and step % cfg.run.eval_every == 0 and not last:
                metrics.update(self.evaluate(f"step{step}"))
            if last and self.data.eval:
                self.result.eval_after = self.evaluate("after")
                metrics.update(self.result.eval_after)
            self.logger.log(step, metrics)
            if last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                save = save_sharded_checkpoint if ddp.is_distributed() else save_checkpoint
                save(self.run_dir, step, model=checkpoint_view(self.model), tokenizer=self.tokenizer, optimizer=self.optimizer,
                     extra={"cost": self.cost.state_dict(), **self.adv_inputs.state_dict()}, state_files=[self.run_dir / f for f in STATE_FILES])  # fmt: skip
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}", loss=f"{metrics.get('loss', 0):.3f}",
                            **({"rollouts": f"{metrics['cost/cum_rollouts']:.0f}/{budget}"} if budget is not None else {}))  # fmt: skip
            bar.update(1)
            self.result.steps_done = step
            if last:
                break
        bar.close()
        self.logger.close()
        self.result.metrics = read_jsonl(self.run_dir / "metrics.jsonl")
        return self.result


@contextlib.contextmanager
def _maybe_searcher(cfg: TrainConfig, run_dir: Path, data: Data, searcher: Searcher | None) -> Iterator[Searcher]:
    if searcher is not None:
        yield searcher
    else:
        with retriever_session(cfg, run_dir, data.corpus_path) as s:
            yield s


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    searcher: Searcher | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Train per `cfg` in `run_dir` (created); `searcher` overrides the configured retriever.
    A fresh run refuses a non-empty `run_dir` unless `overwrite`; a resume refuses a `cfg` that
    differs from the run's own config.yaml outside `run_dir.SAFE_ON_RESUME` (RunDirError)."""
    run_dir = Path(run_dir)
    ddp.init_from_env(placement(cfg.model.device).device)  # under torchrun: join the process group
    try:
        with contextlib.ExitStack() as stack:
            with ddp.main_first():  # rank 0 checks the run dir, writes the corpus and builds the index
                if resume:
                    check_resume_config(run_dir, cfg)
                elif ddp.is_main():
                    prepare_fresh(run_dir, overwrite=overwrite)
                run_dir.mkdir(parents=True, exist_ok=True)
                data = load_data(cfg, run_dir)
                s = stack.enter_context(_maybe_searcher(cfg, run_dir, data, searcher))
            trainer = stack.enter_context(Trainer(cfg, run_dir, data, s, resume=resume,
                                                  show_progress=show_progress and ddp.is_main()))  # fmt: skip
            return trainer.run()
    finally:
        ddp.shutdown()
