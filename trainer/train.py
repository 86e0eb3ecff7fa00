"""The training loop: rollouts -> rewards -> advantages -> policy update -> log -> checkpoint.

Everything random is a pure function of `(run.seed, step)` (data order, sampling, mini-batch
order), and the optimizer / RNG / anchor store are checkpointed, so `resume=True` continues
exactly where the last checkpoint left off: no step lost or repeated in `metrics.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from pvpo.envs.data import QAExample
from pvpo.retriever.types import Searcher
from pvpo.trainer.advantages import advantage_stats, get_estimator
from pvpo.trainer.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.anchor import AnchorStore, build_anchor, needs_refresh
from pvpo.trainer.checkpoint import (atomic_write_dir, latest_checkpoint, load_trainer_state, load_weights, read_jsonl,
                                     save_checkpoint, set_rng_state)
from pvpo.trainer.config import TrainConfig, dump_config
from pvpo.trainer.engine import RolloutEngine, build_engine
from pvpo.trainer.evaluate import evaluate
from pvpo.trainer.metrics_log import MetricsLogger
from pvpo.trainer.policy import frozen_copy, save_policy
from pvpo.trainer.resources import Data, episode_config, initial_policy, load_data, retriever_session
from pvpo.trainer.run_dir import check_resume_config, prepare_fresh
from pvpo.trainer.trajectory import collate, summarize
from pvpo.trainer.update import policy_update

WARM_START_FILE = "warm_start.json"  # the warm start's losses and questions, for reports and resumes


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    warm_start_losses: list[float] = field(default_factory=list)
    warm_start_seconds: float = 0.0


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

    def __init__(self, cfg: TrainConfig, run_dir: Path, data: Data, searcher: Searcher, *, resume: bool = False,
                 show_progress: bool = True, after_step: Callable[[int], None] | None = None) -> None:
        self.cfg, self.run_dir, self.data, self.searcher = cfg, run_dir, data, searcher
        self.show_progress, self.after_step = show_progress, after_step
        self.epcfg = episode_config(cfg)
        self.result = TrainResult(run_dir, 0)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        policy, fresh = initial_policy(cfg, data, run_dir)
        self.model, self.tokenizer = policy.model, policy.tokenizer
        self.engine: RolloutEngine = self._build_engine(self.model)
        if fresh:
            if cfg.model.warm_start_steps and data.world is not None:
                self._warm_start()
            atomic_write_dir(run_dir / "initial_policy", lambda tmp: save_policy(policy, tmp))
        elif (run_dir / WARM_START_FILE).exists():
            self.result.warm_start_losses = json.loads((run_dir / WARM_START_FILE).read_text())["losses"]
        a = cfg.algorithm.anchor
        need_ref = cfg.optim.kl_coef > 0 or (cfg.algorithm.uses_anchor and a.refresh_every > 0 and a.refresh_from == "reference")
        self.ref_model = frozen_copy(self.model) if need_ref else None
        self._ref_engine: RolloutEngine | None = None  # built on first use: only anchor refreshes sample from it
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.estimator = get_estimator(cfg.algorithm.estimator)
        self.anchor = AnchorStore(run_dir / "anchor.json", source="reference") if cfg.algorithm.uses_anchor else None
        self.start_step = 0
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            load_weights(self.model, ckpt)
            self.engine.sync_weights(self.model)
            state = load_trainer_state(ckpt)
            self.optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"])
            self.start_step = int(state["step"])
        dump_config(cfg, run_dir / "config.yaml")
        self.logger = MetricsLogger(run_dir, resume_step=self.start_step, tensorboard=cfg.run.tensorboard)

    # ---- pieces ----------------------------------------------------------------------------
    def _build_engine(self, model: torch.nn.Module) -> RolloutEngine:
        """The configured rollout engine over `model`, with its `rollout.<engine>` options."""
        return build_engine(self.cfg.rollout.engine, model=model, tokenizer=self.tokenizer, **self.cfg.rollout.engine_options())

    @property
    def ref_engine(self) -> RolloutEngine | None:
        """An engine sampling from the frozen reference policy (None when no reference is kept)."""
        if self._ref_engine is None and self.ref_model is not None:
            self._ref_engine = self._build_engine(self.ref_model)
        return self._ref_engine

    def _warm_start(self) -> None:
        """SFT on the oracle trajectories of `data.warm_start` (the RL prompts themselves when the
        config names no separate set); the losses and questions go to `<run>/warm_start.json`."""
        from pvpo.trainer.warmstart import oracle_trajectories, warm_start

        m, t0 = self.cfg.model, time.perf_counter()
        questions = self.data.warm_start
        trajs = oracle_trajectories(questions, lambda ex: self.data.world.oracle_trajectory(ex, self.epcfg.protocol),
                                    self.tokenizer, self.searcher, self.epcfg, chat_template=m.chat_template)  # fmt: skip
        self.result.warm_start_losses = warm_start(
            self.model, trajs, self.tokenizer.pad_token_id, steps=m.warm_start_steps, lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size, seed=self.cfg.run.seed, show_progress=self.show_progress,
        )  # fmt: skip
        self.engine.sync_weights(self.model)
        self.result.warm_start_seconds = time.perf_counter() - t0
        record = {"losses": self.result.warm_start_losses, "questions": [ex.uid for ex in questions]}
        (self.run_dir / WARM_START_FILE).write_text(json.dumps(record))

    def rollout(self, examples: Sequence[QAExample], *, seed: int, engine: RolloutEngine | None = None,
                temperature: float | None = None) -> list:
        """Trajectories for `examples`, `rollout.batch_size` at a time."""
        bs, out = self.cfg.rollout.batch_size, []
        for s in range(0, len(examples), bs):
            out += run_agent_loop(engine or self.engine, self.tokenizer, examples[s : s + bs], self.searcher, self.epcfg,
                                  loop_config(self.cfg, temperature), seed=_seed(seed, s))  # fmt: skip
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
        engine = self.engine if current or is_reference or self.ref_model is None else self.ref_engine
        source = "current" if current else "reference"

        def rollout_fn(exs: list[QAExample]) -> list[tuple[str, float, float]]:
            seed = _seed("anchor", at, *[e.uid for e in exs[:4]], len(exs))
            return [(t.uid, t.reward, t.accuracy) for t in self.rollout(exs, seed=seed, engine=engine, temperature=a.temperature)]

        engine.wake_up()
        try:
            build_anchor(self.data.train, rollout_fn, num_rollouts=a.num_rollouts,
                         batch_size=max(1, self.cfg.rollout.batch_size // a.num_rollouts), store=self.anchor, step=at,
                         source=source, show_progress=self.show_progress)  # fmt: skip
        finally:
            if engine is not self.engine:
                engine.sleep()  # the reference engine holds no memory until the next refresh

    def evaluate(self, tag: str) -> dict[str, float]:
        if not self.data.eval:
            return {}
        return evaluate(self.engine, self.tokenizer, self.data.eval, self.searcher, self.epcfg, loop_config(self.cfg),
                        temperature=self.cfg.run.eval_temperature, seed=_seed("eval", tag),
                        batch_size=self.cfg.rollout.batch_size)  # fmt: skip

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        self.ensure_anchor(step - 1)
        prompts = step_examples(self.data.train, step, cfg.data.prompts_per_step, cfg.run.seed)
        group = [ex for ex in prompts for _ in range(cfg.rollout.n)]
        t0 = time.perf_counter()
        self.engine.wake_up()
        trajs = self.rollout(group, seed=_seed(cfg.run.seed, "step", step))
        t1 = time.perf_counter()
        batch = collate(trajs, self.tokenizer.pad_token_id)
        anchors = self.anchor.values() if self.anchor is not None else None
        adv = self.estimator(batch.rewards, batch.uids, anchors=anchors)
        self.engine.sleep()  # the KV cache is free while the trainer holds activations and grads
        try:
            stats = policy_update(self.model, self.optimizer, batch, adv, cfg.optim, temperature=cfg.rollout.temperature,
                                  seed=_seed(cfg.run.seed, "update", step), engine=self.engine, ref_model=self.ref_model,
                                  importance=cfg.rollout.importance_correction)  # fmt: skip
        finally:
            self.engine.wake_up()  # evaluation and the next rollouts sample again
        t2 = time.perf_counter()
        metrics = {**summarize(trajs), **advantage_stats(adv, batch.uids), **stats,
                   "time/rollout_s": t1 - t0, "time/train_s": t2 - t1}  # fmt: skip
        if anchors is not None:
            metrics["anchor/mean"] = float(np.mean([anchors[u] for u in batch.uids]))
        return metrics

    def run(self) -> TrainResult:
        cfg = self.cfg
        if self.start_step == 0 and self.data.eval:
            self.result.eval_before = self.evaluate("before")
        bar = tqdm(range(self.start_step + 1, cfg.run.steps + 1), desc="train", initial=self.start_step,
                   total=cfg.run.steps, disable=not self.show_progress)  # fmt: skip
        for step in bar:
            metrics = self.train_step(step)
            if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.run.steps:
                metrics.update(self.evaluate(f"step{step}"))
            if step == cfg.run.steps and self.data.eval:
                self.result.eval_after = self.evaluate("after")
                metrics.update(self.result.eval_after)
            self.logger.log(step, metrics)
            if self.after_step is not None:
                self.after_step(step)  # tests inject a crash here: logged, not yet checkpointed
            if step == cfg.run.steps or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                save_checkpoint(self.run_dir, step, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}", loss=f"{metrics.get('loss', 0):.3f}")
            self.result.steps_done = step
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


def train(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
          searcher: Searcher | None = None, show_progress: bool = True,
          after_step: Callable[[int], None] | None = None) -> TrainResult:
    """Train per `cfg` in `run_dir` (created); `searcher` overrides the configured retriever.
    A fresh run refuses a non-empty `run_dir` unless `overwrite`; a resume refuses a `cfg` that
    differs from the run's own config.yaml outside `run_dir.SAFE_ON_RESUME` (RunDirError)."""
    run_dir = Path(run_dir)
    if resume:
        check_resume_config(run_dir, cfg)
    else:
        prepare_fresh(run_dir, overwrite=overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg, run_dir)
    with _maybe_searcher(cfg, run_dir, data, searcher) as s:
        trainer = Trainer(cfg, run_dir, data, s, resume=resume, show_progress=show_progress, after_step=after_step)
        return trainer.run()
