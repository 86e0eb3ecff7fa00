"""The training loop, read top to bottom: rollouts -> rewards -> advantages -> policy update ->
log -> checkpoint (`Trainer.train_step`, `Trainer.run`).

What the run builds before its first step is `data.py`'s and `setup.py`'s (the episode rules and
loop limits are made once there and kept here); the Trainer is given the policy it trains, built or
reloaded, and on a fresh run evaluated and warm-started, before it (`setup.prepare_run`); how a
step gets its trajectories is its step mode's (`steps/`: rolled out then trained on, or sampled
beside the update); PVPO's anchor, Group Sampling and GT trajectories are
`reference/machinery.py`'s; what an estimator needs beyond rewards and groups is its own state
(`algorithms/estimator_state.py`). Everything random is a pure function of `(run.seed, step)` (data
order, sampling, mini-batch order: `steps/plan.py`), and the optimizer / RNG / anchor store are
checkpointed, so `resume=True` continues exactly where the last checkpoint left off: no step lost
or repeated in `metrics.jsonl`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pvpo.atomic import read_jsonl
from pvpo.envs.data import QAExample
from pvpo.locks import folder_lock
from pvpo.progress import Progress
from pvpo.retriever.types import Searcher
from pvpo.trainer.algorithms.advantages import advantage_stats
from pvpo.trainer.algorithms.spec import get_spec
from pvpo.trainer.config.preflight import preflight
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.config.written import dump_config
from pvpo.trainer.data import Data, agent_settings, load_data, retriever_session
from pvpo.trainer.heldout.points import (
    PolicyUnderTest,
    evaluate_current,
    evaluation_before,
    validation_point,
    watches_validation,
)
from pvpo.trainer.model.device import resolve_device, with_resolved_dtype
from pvpo.trainer.model.lora import checkpoint_view
from pvpo.trainer.model.memory import process_peak_rss_gib
from pvpo.trainer.model.optimizer_spill import optimizer_state_on_disk
from pvpo.trainer.model.update import importance_for, policy_update, reference_logprobs
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.parallel.checkpoint import load_run_checkpoint, save_run_checkpoint
from pvpo.trainer.reference.gt_registry import GTContext
from pvpo.trainer.reference.machinery import Reference
from pvpo.trainer.rollout.agent_loop import run_agent_loop
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.rollout.trajectory import Trajectory, collate, summarize
from pvpo.trainer.setup import RunStart, build_model, estimator_state, prepare_run, uses_anchor
from pvpo.trainer.state.best import ValidationCurve
from pvpo.trainer.state.checkpoint import (
    KEPT_CHECKPOINTS,
    prune_checkpoints,
    step_name,
)
from pvpo.trainer.state.cost import CostCounter
from pvpo.trainer.state.episode_log import log_step_episodes
from pvpo.trainer.state.metrics_log import MetricsLogger
from pvpo.trainer.state.result import TrainResult
from pvpo.trainer.state.resume import (
    check_resume_config,
    config_record,
    fresh_run_dir,
    run_inputs,
)
from pvpo.trainer.state.run_dir import RunDir
from pvpo.trainer.steps import derive_seed, make_steps, resumed_record
from pvpo.trainer.steps.plan import episode_batches

log = logging.getLogger(__name__)


class Trainer:
    """Trains the policy it is given (`setup.RunStart`): holds it, its engine, optimizer, estimator
    state and reference machinery; `run()` trains to `run.steps`."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        data: Data,
        searcher: Searcher,
        start: RunStart,
        *,
        show_progress: bool = True,
    ) -> None:
        """A Trainer of the policy `start` holds (`setup.prepare_run`: built or reloaded, and on a
        fresh run evaluated and warm-started as the config asks, before this); a resume's
        checkpoint (`start.checkpoint`) is loaded here."""
        cfg = with_resolved_dtype(cfg, resolve_device(cfg.model.device))
        self.cfg, self.run_dir, self.files, self.data, self.searcher = (
            cfg,
            Path(run_dir),
            RunDir(run_dir),
            data,
            searcher,
        )
        self.show_progress = show_progress
        agent = agent_settings(cfg)  # the run's episode rules and loop limits, made once
        self.epcfg, self.loop = agent.episode(), agent.loop()
        self.spec = get_spec(cfg.algorithm.estimator)
        m = build_model(cfg, start, self.spec)  # LoRA, the frozen reference, FSDP2 around the policy
        self.model, self.tokenizer, self.engine, self.ref_model = m.model, m.tokenizer, m.engine, m.ref_model
        self.where, self.memory, self._make_engine = m.where, m.memory, m.make_engine
        self.result = TrainResult(
            self.run_dir,
            0,
            warm_start_losses=start.warm_start_losses,
            warm_start_seconds=start.warm_start_seconds,
            eval_base=start.eval_base,
        )
        if start.eval_base_em:
            self.result.eval_em["base"] = start.eval_base_em
        if start.eval_base_scores:
            self.result.eval_scores["base"] = start.eval_base_scores
        self._ref_engine: RolloutEngine | None = None  # built on first use: only anchor refreshes sample from it
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.cost = CostCounter()
        self.reference = Reference(cfg, self.run_dir, uses_anchor=uses_anchor(cfg, self.spec))
        ckpt = start.checkpoint
        if start.resume and ckpt is None and ddp.is_main():  # state a killed first attempt saved: its cost is unlogged
            self.cost.count_saved(self.reference.saved_cost())
        self.estimator_state = estimator_state(cfg, self.spec, m, self.run_dir)
        self.curve = ValidationCurve()  # validation EM by step (run.eval_every), restored with the checkpoint
        self.steps_record: dict[str, Any] = {}  # what a checkpoint's step mode left (steps/)
        self.start_step = self._restore(ckpt) if ckpt is not None else 0
        self.steps = make_steps(self, self.steps_record)  # rollouts then update, or beside it (steps/)
        self.result.resumed_from = self.start_step
        if ddp.is_main():
            dump_config(cfg, self.files.config)
        # every rank logs the reduced metrics; rank 0's are the run's, the others' go under ranks/
        log_dir = self.run_dir if ddp.is_main() else self.files.rank_dir(ddp.rank())
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logger = MetricsLogger(
            log_dir, resume_step=self.start_step, tensorboard=cfg.run.tensorboard and ddp.is_main()
        )

    def _restore(self, ckpt: Path) -> int:
        """Weights, optimizer, RNG, cost counters and the estimator's state of `ckpt`; its step."""
        state = load_run_checkpoint(
            ckpt, model=self.model, optimizer=self.optimizer, modules=self.estimator_state.sharded_modules()
        )
        extra = state.get("extra", {})
        self.estimator_state.load_state_dict(extra)
        self.engine.sync_weights(self.model)
        if "cost" in extra:
            self.cost.load_state_dict(extra["cost"])
        if "validation" in extra:
            self.curve = ValidationCurve.from_json(extra["validation"])
        self.steps_record = resumed_record(extra)
        return int(state["step"])

    def close(self) -> None:
        """Shut the rollout engines down (vLLM: its engine process and its temporary copy of the
        model); `with Trainer(...) as trainer:` does it on leaving."""
        self.steps.close()  # its rollouts first: they use the engine
        for engine in (self.engine, self._ref_engine):
            if engine is not None:
                engine.close()
        self._ref_engine = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- pieces ----------------------------------------------------------------------------
    @property
    def ref_engine(self) -> RolloutEngine | None:
        """An engine sampling from the frozen reference policy (None when no reference is kept)."""
        if self._ref_engine is None and self.ref_model is not None:
            self._ref_engine = self._make_engine(self.ref_model)
        return self._ref_engine

    def rollout(
        self,
        examples: Sequence[QAExample],
        *,
        seed: int,
        engine: RolloutEngine | None = None,
        temperature: float | None = None,
        kind: str = "train",
        offset: int = 0,
        progress: Progress | None = None,
    ) -> list[Trajectory]:
        """Trajectories for `examples`, `rollout.batch_size` at a time, counted as `kind` cost.
        `offset`: the position of `examples[0]` in the step's whole list (a rank's share), so each
        trajectory's seed is the one a single process rolling out the whole list gives it.
        `progress` counts the trajectories as they end."""
        out: list[Trajectory] = []
        loop = self.loop if temperature is None else replace(self.loop, temperature=temperature)
        done = (lambda i, t: progress.update(1)) if progress is not None else None
        for lo, hi, batch_seed, first in episode_batches(seed, offset, len(examples), self.cfg.rollout.batch_size):
            with self.where.autocast():
                out += run_agent_loop(
                    engine or self.engine,
                    self.tokenizer,
                    examples[lo:hi],
                    self.searcher,
                    self.epcfg,
                    loop,
                    seed=batch_seed,
                    indices=range(first, first + hi - lo),
                    on_done=done,
                )
        self.cost.add(kind, out)
        return out

    def meter(self, step: int, what: str, unit: str, total: int | None = None) -> Progress:
        """A brief meter for one phase of `step` (`pvpo.progress.Progress`: off a terminal, a line
        every 30 s while it lasts, none for a shorter phase)."""
        return Progress(
            desc=f"step {step}/{self.cfg.run.steps}: {what}",
            unit=unit,
            total=total,
            enabled=self.show_progress,
            brief=True,
        )

    def ensure_reference(self, step: int) -> None:
        """PVPO's anchor (built before step 1, refreshed when due) and Group Sampling's partition
        and GT trajectories for it (mem/reference_peak_rss_gib: their peak)."""
        ref, ref_model, pad = self.reference, self.ref_model, self.tokenizer.pad_token_id
        with self.memory.phase("reference"):
            ref.ensure_anchor(
                step,
                self.data.train,
                lambda exs, seed, engine, temperature: self.rollout(
                    exs, seed=seed, engine=engine, temperature=temperature, kind="anchor"
                ),
                policy_engine=self.engine,
                reference_engine=lambda: self.ref_engine,
                # before this run's first update (and not resumed) the policy is the reference
                is_reference=self.start_step == 0 and self.result.steps_done == 0,
                seed=derive_seed,
                show_progress=self.show_progress,
            )
            ref.ensure_group_sampling(
                self.data.train,
                GTContext(self.tokenizer, self.searcher, self.epcfg, self.loop, self.data.world),
                on_generated=lambda ts: self.cost.add("gt", ts, policy_tokens=False),
                # pi_gt by the frozen reference (gt.logprobs: reference)
                reference_logprobs=None
                if ref_model is None
                else lambda ts: reference_logprobs(ref_model, self.model, ts, pad, self.cfg),
            )

    def evaluate(
        self, tag: str, examples: Sequence[QAExample] | None = None, per_question_out: list[float] | None = None
    ) -> dict[str, float]:
        """Held-out metrics (`eval/*`) of the current policy, one greedy rollout per question of
        `examples` (default: the run's evaluation set, whose per-question scores are kept);
        `per_question_out` receives each question's EM. RL's optimizer state waits on disk meanwhile."""
        under_test = PolicyUnderTest(
            self.cfg,
            self.engine,
            self.tokenizer,
            self.where,
            self.searcher,
            self.memory,
            self.steps.paused,  # rollouts beside the update wait meanwhile
            self.show_progress,
        )
        questions = self.data.eval if examples is None else examples
        kept = self.result if examples is None else None  # the evaluation set's per-question scores are kept
        with optimizer_state_on_disk(self.optimizer, self.files.optimizer_spill, distributed=ddp.is_distributed()):
            return evaluate_current(under_test, tag, questions, result=kept, per_question_out=per_question_out)

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """Step `step`'s metrics, by the run's step mode (`steps/`): PVPO's reference, the step's
        rollouts and rewards, then `learn`."""
        return self.steps.step(step)

    def learn(
        self,
        step: int,
        trajs: list[Trajectory],
        injected: list[Trajectory],
        prompts: Sequence[QAExample],
        anchors: dict[str, float] | None,
        t0: float,
        t1: float,
    ) -> dict[str, float]:
        """Steps 3-5 of `step` on its trajectories (the policy's rollouts of `prompts`, then the
        `injected` GT rows), awaited from `t0` to `t1`: advantages, the update, metrics. The step
        mode says what the engine does meanwhile (`StepMode.update_scope`: asleep, or sampling the
        next steps' episodes) and whether it takes each optimizer step's weights."""
        cfg, seed = self.cfg, self.cfg.run.seed
        # 3. advantages
        batch = collate(trajs, self.tokenizer.pad_token_id)
        adv_kwargs = self.estimator_state.kwargs(trajs, batch)
        # group baselines over the policy's own rollouts; injected GT rows are measured against them
        adv = self.spec(batch.rewards, batch.uids, anchors=anchors, policy_rows=~batch.is_gt, **adv_kwargs)
        log_step_episodes(self.files.episodes, step, trajs, adv, batch.loss_mask, prompts, self.tokenizer, cfg.run)
        # 4. the policy update (and what the estimator learns from the step)
        with self.steps.update_scope():
            with self.memory.phase("train"), self.where.autocast(), self.meter(step, "update", "micro-batch") as meter:
                stats = {}
                if self.estimator_state.trains_policy(step):
                    stats = policy_update(
                        self.model,
                        self.optimizer,
                        batch,
                        adv,
                        cfg.optim,
                        temperature=cfg.rollout.temperature,
                        seed=derive_seed(seed, "update", step),
                        engine=self.steps.synced_engine(),
                        ref_model=self.ref_model,
                        importance=importance_for(cfg.rollout),  # with rollouts ahead: the decoupled objective
                        default_agg=self.spec.loss_agg,
                        norm_len=cfg.rollout.max_response_tokens,
                        progress=meter,
                    )
                stats.update(self.estimator_state.after_step(batch, adv_kwargs, seed=derive_seed(seed, "critic", step)))
        self.steps.after_update(step)
        idle = self.steps.idle_seconds()  # no episode in flight
        t2 = time.perf_counter()
        # 5. metrics (under torchrun the rollouts' own are weighted by each rank's sampled rollouts)
        sampled = trajs[: len(trajs) - len(injected)]
        per_rollout = dict(summarize(sampled))
        if anchors is not None:  # over the sampled rollouts' prompts, so reward - anchor compares like with like
            per_rollout["anchor/mean"] = float(np.mean([anchors[t.uid] for t in sampled])) if sampled else 0.0
        metrics = {
            **advantage_stats(adv, batch.uids, mask=batch.loss_mask, gt_rows=batch.is_gt),
            **stats,
            "time/rollout_s": t1 - t0,
            "time/train_s": t2 - t1,
            "time/update_wait_s": t1 - t0,
            "time/engine_idle_frac": (t2 - t1 if idle is None else idle) / max(t2 - t0, 1e-9),
        }
        if self.reference.partition is not None:
            metrics["gt/fraction"] = len(injected) / len(trajs)
            metrics["gs/pool_size"] = float(len(self.reference.pool(self.data.train)))
        metrics.update(self.reference.pop_report())
        metrics.update(self.memory.pop())
        metrics = {**ddp.reduce_metrics(per_rollout, len(sampled)), **ddp.reduce_metrics(metrics, len(trajs))}
        # summed over the ranks inside the counter: every rank holds the run's totals (a checkpoint's)
        metrics.update(self.cost.step_metrics(reduce=ddp.all_reduce_sums))
        return metrics

    def save(self, step: int) -> Path:
        """A checkpoint of `step`: weights, optimizer, RNG, cost, the estimator's state and the
        run's state files."""
        return save_run_checkpoint(
            self.run_dir,
            step,
            model=checkpoint_view(self.model),
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            extra={
                "cost": self.cost.state_dict(),
                "config": config_record(self.cfg),
                "validation": self.curve.to_json(),
                **self.estimator_state.state_dict(),
                **self.steps.state_dict(),
            },
            state_files=self.files.state_files(),
            modules=self.estimator_state.sharded_modules(),
        )

    def run(self) -> TrainResult:
        cfg = self.cfg
        if self.data.eval and cfg.run.steps:  # fresh: measured, resumed: read back; run.steps=0 (no RL): neither
            evaluation_before(self, fresh=self.start_step == 0, saved=self.files.eval_before)
        # with a validation split, run.eval_every watches it: val/* by step, the best step's checkpoint kept
        watch = watches_validation(cfg, self.data)
        if watch and self.start_step == 0 < cfg.run.steps:  # step 0: the policy RL starts from (no checkpoint)
            self.curve.questions = [q.uid for q in self.data.validation]
            self.curve.record(0, *validation_point(self, 0, last=False))
            if ddp.is_main():
                self.curve.save(self.files.best)
        budget = cfg.run.rollout_budget  # when set, the run usually ends before run.steps: no step total to show
        total = cfg.run.steps if budget is None else None
        bar = Progress(desc="train", unit="step", initial=self.start_step, total=total, enabled=self.show_progress)
        for step in range(self.start_step + 1, cfg.run.steps + 1):
            metrics = self.train_step(step)
            # a rollout budget (anchor and GT generation included) ends the run at the step that reaches it
            last = step == cfg.run.steps or (budget is not None and metrics["cost/cum_rollouts"] >= budget)
            due = bool(cfg.run.eval_every) and step % cfg.run.eval_every == 0
            if due and not last and not watch:  # no validation split: the evaluation set is watched
                metrics.update(self.evaluate(f"step{step}"))
            if last and self.data.eval:
                self.result.eval_after = self.evaluate("after")
                metrics.update(self.result.eval_after)
            val, val_em = validation_point(self, step, last)
            metrics.update(val)
            metrics.update(self.memory.pop())  # the evaluation's peaks (the one before step 1 pops in step 1)
            whole = process_peak_rss_gib()  # the run so far: /usr/bin/time sees only the last phase's (memory.py)
            if whole is not None:
                metrics["mem/process_peak_rss_gib"] = whole
            self.logger.log(step, metrics)
            best = bool(val) and self.curve.record(step, val, val_em)
            if best:  # the best so far: its checkpoint is kept beside the newest
                self.curve.kept(step, step_name(step))
            if best or last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                self.save(step)
            if val and ddp.is_main():  # named once saved; the best before it is pruned now
                self.curve.save(self.files.best)
                if best:
                    prune_checkpoints(self.files.checkpoints, KEPT_CHECKPOINTS)
            postfix = {
                "reward": f"{metrics['reward/mean']:.3f}",
                "acc": f"{metrics['accuracy']:.2f}",
                "loss": f"{metrics.get('loss', 0):.3f}",
            }
            if val:
                postfix["val_em"] = f"{val['val/accuracy']:.3f}"
            if budget is not None:
                postfix["rollouts"] = f"{metrics['cost/cum_rollouts']:.0f}/{budget}"
            postfix.update(self.steps.postfix(metrics))  # with rollouts beside the update: stale, clamp, idle
            bar.set_postfix(**postfix)
            bar.update(1)
            self.result.steps_done = step
            if last:
                break
        bar.close()
        self.logger.close()
        self.result.validation = self.curve.to_json() if self.curve.points else {}
        self.result.metrics = read_jsonl(self.files.metrics)
        return self.result


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    searcher: Searcher | None = None,
    show_progress: bool = True,
    preflighted: bool = False,
) -> TrainResult:
    """Train per `cfg` in `run_dir` (created): the stages the config asks before a Trainer (the base
    evaluation, the warm start: `setup.prepare_run`), then the Trainer's steps; `searcher` overrides
    the configured retriever. A fresh run refuses a non-empty `run_dir` unless `overwrite`; a resume
    refuses a `cfg` that differs from the run's own config.yaml, or its checkpoint's, outside
    `resume.SAFE_ON_RESUME` (RunDirError); a run dir another process writes is refused
    (`pvpo.locks.FolderInUse`); a run that cannot run here is refused before any of it
    (`config.preflight`; `preflighted`: the caller, `pvpo train`, ran it already, before taking the
    run dir's lock)."""
    if not preflighted:
        preflight(cfg, resume=resume, retriever=searcher is None)
    run_dir = Path(run_dir)
    device = resolve_device(cfg.model.device)
    ddp.init_from_env(device)  # under torchrun: join the process group
    cfg = with_resolved_dtype(cfg, device)
    completed = False
    try:
        with contextlib.ExitStack() as stack:
            with ddp.main_first():  # rank 0 checks the run dir, writes the corpus and builds the index
                if ddp.is_main():  # one process writes a run dir; under torchrun rank 0 holds it for all ranks
                    stack.enter_context(folder_lock(run_dir, "pvpo train"))
                if resume:
                    check_resume_config(run_dir, cfg)
                elif ddp.is_main():  # an old run is moved aside, and back if this fails before a checkpoint
                    stack.enter_context(fresh_run_dir(run_dir, overwrite=overwrite, inputs=run_inputs(cfg)))
                run_dir.mkdir(parents=True, exist_ok=True)
                data = load_data(cfg, run_dir)
                given = contextlib.nullcontext(searcher) if searcher is not None else None
                s = stack.enter_context(given or retriever_session(cfg, run_dir, data.corpus_path))
            show = show_progress and ddp.is_main()
            # the base evaluation and the warm start, as the config asks, before the Trainer (setup.py)
            start = prepare_run(cfg, run_dir, data, s, resume=resume, show_progress=show)
            trainer = stack.enter_context(Trainer(cfg, run_dir, data, s, start, show_progress=show))
            result = trainer.run()
        completed = True
        return result
    finally:
        ddp.shutdown(completed=completed)
