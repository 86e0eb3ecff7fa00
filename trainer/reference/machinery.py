"""PVPO's reference machinery for one run, in the order a step uses it: the static anchor (built
before step 1, refreshed when due, an interrupted build finished), Group Sampling's partition of
the training pool by the anchor's reference accuracy, and the GT trajectories injected into the
groups of never-solved prompts (arXiv:2508.21104, Sec. 3.2-3.3).

The trainer hands it a rollout function (counted as `anchor` cost) and, for GT scored by the
reference, a log-prob function; everything it decides is saved in the run dir (`RunDir`'s state
files) and restored from a checkpoint on resume. Under torchrun every rank holds the same anchor,
partition and GT cache and rank 0 alone writes them (`trainer.parallel.shared_state`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.reference.anchor import AnchorStore, build_anchor, needs_refresh
from pvpo.trainer.reference.group_sampling import (
    Partition,
    correctness,
    load_partition,
    partition,
    save_partition,
    savings,
)
from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt
from pvpo.trainer.reference.gt_registry import GTContext, build_gt_source
from pvpo.trainer.reference.sharded_gt import shared_gt_source
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.cost import add_rollout_cost
from pvpo.trainer.state.run_dir import RunDir

log = logging.getLogger(__name__)

# (examples, seed, engine, temperature) -> trajectories, counted as anchor cost by the trainer
AnchorRollout = Callable[[list[QAExample], int, RolloutEngine, float | None], list[Trajectory]]


class Reference:
    """The anchor store, Group Sampling's partition and the GT cache of a run (each None when
    the run does not use it), and the work that keeps them current."""

    def __init__(self, cfg: Any, run_dir: str | Path, *, uses_anchor: bool) -> None:
        files, alg = RunDir(run_dir), cfg.algorithm
        self.cfg, self.files = cfg, files
        gs = alg.group_sampling.enabled
        self.anchor = AnchorStore(files.anchor, source="reference") if uses_anchor else None
        self.partition: Partition | None = load_partition(files.group_sampling) if gs else None
        self.gt_cache = GTCache(files.gt_cache, read_only=not ddp.is_main()) if gs else None
        self.report: dict[str, float] = {}  # anchor / Group Sampling figures, logged with the next step
        self.s_per_rollout: float | None = None  # the last anchor build's measured seconds per rollout

    def anchors(self) -> dict[str, float] | None:
        """uid -> mean reference reward (the `anchors=` of the estimator), or None without an anchor."""
        return self.anchor.values() if self.anchor is not None else None

    def pop_report(self) -> dict[str, float]:
        out, self.report = self.report, {}
        return out

    # ---- the anchor ---------------------------------------------------------------------------
    def ensure_anchor(
        self,
        step: int,
        train: Sequence[QAExample],
        rollout: AnchorRollout,
        *,
        policy_engine: RolloutEngine,
        reference_engine: Callable[[], RolloutEngine | None],
        is_reference: bool,
        seed: Callable[..., int],
        show_progress: bool = True,
    ) -> None:
        """Build the anchor before step 1, refresh it when due, finish an interrupted build.
        `is_reference`: the policy is still the reference (before this run's first update), so no
        second engine is needed; `reference_engine()` builds one on first use otherwise."""
        if self.anchor is None:
            return
        a = self.cfg.algorithm.anchor
        anchor = self.anchor
        last = self.anchor.computed_at_step
        incomplete = any(not self.anchor.is_complete(ex.uid, a.num_rollouts) for ex in train)
        if not (incomplete or needs_refresh(step, a.refresh_every, last)):
            return
        at = last if incomplete else step
        current = at > 0 and a.refresh_from == "current"
        ref_engine = None if current or is_reference else reference_engine()
        engine = ref_engine if ref_engine is not None else policy_engine
        source = "current" if current else "reference"
        made = 0

        metric = self.cfg.algorithm.group_sampling.metric

        def rollout_fn(exs: list[QAExample]) -> list[tuple[str, float, float]]:
            nonlocal made
            trajs = rollout(exs, seed("anchor", at, *[e.uid for e in exs[:4]], len(exs)), engine, a.temperature)
            made += len(trajs)
            add_rollout_cost(anchor.cost, trajs)  # saved with the stats they give, in one write
            golds = {e.uid: e.golden_answers for e in exs}
            # the anchor's accuracy is Group Sampling's, by `group_sampling.metric`
            return [
                (t.uid, t.reward, correctness(t.reward, t.reward_components, t.prediction, golds[t.uid], metric))
                for t in trajs
            ]

        engine.wake_up()
        t0 = time.perf_counter()
        try:
            build_anchor_sharded(
                train,
                rollout_fn,
                num_rollouts=a.num_rollouts,
                batch_size=max(1, self.cfg.rollout.batch_size // a.num_rollouts),
                store=self.anchor,
                step=at,
                source=source,
                show_progress=show_progress and ddp.is_main(),
            )
        finally:
            if engine is not policy_engine:
                engine.sleep()  # the reference engine holds no memory until the next refresh
        if made:  # this rank's rollouts
            self.s_per_rollout = (time.perf_counter() - t0) / made
            self.report["time/anchor_s"] = time.perf_counter() - t0

    # ---- Group Sampling -----------------------------------------------------------------------
    def ensure_group_sampling(
        self,
        train: Sequence[QAExample],
        context: GTContext,
        *,
        on_generated: Callable[[list[Trajectory]], None],
        reference_logprobs: Callable[[list[Trajectory]], None] | None,
    ) -> None:
        """Partition the train prompts by the current anchor's reference accuracy (once per anchor)
        and fetch GT trajectories for the never-solved ones (cached; a resume fetches nothing).
        `on_generated` counts what the GT source wrote; `reference_logprobs` sets pi_gt to the
        reference's when `gt.logprobs: reference`."""
        if self.gt_cache is None or self.anchor is None:
            return
        at = self.anchor.computed_at_step
        if self.partition is not None and self.partition.computed_at_step == at:
            return
        alg = self.cfg.algorithm
        gs, t0 = alg.group_sampling, time.perf_counter()
        part = partition(
            [ex.uid for ex in train],
            self.anchor.stats(),
            drop_threshold=gs.drop_threshold,
            gt_threshold=gs.gt_threshold,
            computed_at_step=at,
        )
        part.report.update(part.fractions())
        if self.s_per_rollout is not None:
            part.report.update(
                savings(part, rollouts_per_prompt=self.cfg.rollout.n, seconds_per_rollout=self.s_per_rollout)
            )
        wanted = set(part.gt)
        # under torchrun each rank writes its share and every rank gets all: the GT cost is counted once
        source = shared_gt_source(build_gt_source(alg.gt.source, alg.gt, context))
        cache = self.gt_cache

        def generated(trajs: list[Trajectory]) -> None:
            add_rollout_cost(cache.cost, trajs, policy_tokens=False)  # saved with the cache they fill
            on_generated(trajs)

        try:
            counts = fetch_gt(
                [ex for ex in train if ex.uid in wanted],
                source,
                self.gt_cache,
                attempts=alg.gt.attempts,
                min_reward=alg.gt.min_reward,
                on_generated=generated if ddp.is_main() else None,
                set_logprobs=reference_logprobs if alg.gt.logprobs == "reference" else None,
            )
        finally:
            source.close()
        part.report.update(counts)
        # never solved by the reference and no GT found: only zero advantages; the paper removes
        # the currently impossible samples, so they leave the pool until the next partition
        part.unavailable = [u for u in part.gt if u not in self.gt_cache.records]
        part.report["gt/unavailable"] = float(len(part.unavailable))
        if part.unavailable and ddp.is_main():
            log.warning(
                "group sampling: %d never-solved prompt(s) have no GT trajectory (the GT source failed on them); "
                "removed from the training pool until the next anchor refresh",
                len(part.unavailable),
            )
        part.report["time/group_sampling_s"] = time.perf_counter() - t0
        part = ddp.broadcast_object(part)  # the same decisions on every rank; rank 0's timings in the report
        if ddp.is_main():
            save_partition(part, self.files.group_sampling)
        self.partition = part
        self.report.update(part.report)

    def saved_cost(self) -> dict[str, dict[str, float]]:
        """What the anchor and the GT cache on disk recorded they cost, by cost kind (`anchor`,
        `gt`): a run resumed without a checkpoint reuses them, and counts this (`CostCounter.count_saved`)."""
        out: dict[str, dict[str, float]] = {}
        if self.anchor is not None and self.anchor.cost:
            out["anchor"] = dict(self.anchor.cost)
        if self.gt_cache is not None and self.gt_cache.cost:
            out["gt"] = dict(self.gt_cache.cost)
        return out

    def pool(self, train: list[QAExample]) -> list[QAExample]:
        """The training prompts: all of them, or those Group Sampling keeps (not dropped, and not
        never-solved without a GT trajectory; all of them again if it would keep none, with the
        reason in the log)."""
        if self.partition is None:
            return train
        keep = self.partition.pool
        kept = [ex for ex in train if ex.uid in keep]
        if not kept:
            log.warning(
                "group sampling left no training prompt (the reference solves them all, or the never-solved ones "
                "have no GT trajectory); training on all of them"
            )
            return train
        return kept

    def group(self, prompts: Sequence[QAExample], n: int) -> tuple[list[QAExample], list[Trajectory]]:
        """The examples to roll out for `prompts` (n each) and the GT trajectories that replace
        `gt.replace_per_group` of them (at most n - 1) for Group Sampling's GT prompts."""
        replace = self.cfg.algorithm.gt.replace_per_group
        todo: list[QAExample] = []
        injected: list[Trajectory] = []
        gt_uids = set(self.partition.gt) if self.partition is not None else set()
        for ex in prompts:
            record = self.gt_cache.records.get(ex.uid) if self.gt_cache is not None and ex.uid in gt_uids else None
            # at least one rollout of every group stays the policy's own: a group of GT copies alone
            # is supervised learning for free (cached GT costs no rollout), not PVPO's replacement
            r = min(replace, n - 1) if record is not None else 0
            todo += [ex] * (n - r)
            injected += [record.trajectory(ex.uid) for _ in range(r)] if record is not None else []
        return todo, injected


def build_anchor_sharded(
    examples: Sequence[Any],
    rollout_fn: Callable[..., Any],
    *,
    num_rollouts: int,
    batch_size: int,
    store: AnchorStore,
    step: int,
    source: str,
    show_progress: bool = True,
) -> AnchorStore:
    """`build_anchor` with its prompts split over the ranks (whole `batch_size` batches, so
    each batch and its seed are what one process would roll out), the per-prompt statistics
    gathered into `store` on every rank and saved by rank 0. A single process builds the whole anchor."""
    if not ddp.is_distributed():
        return build_anchor(
            examples,
            rollout_fn,
            num_rollouts=num_rollouts,
            batch_size=batch_size,
            store=store,
            step=step,
            source=source,
            show_progress=show_progress,
        )
    unique = list({ex.uid: ex for ex in examples}.values())
    if len(store) and (store.computed_at_step != step or store.source != source):
        store.reset(step=step, source=source)
    before = dict(store.cost)  # read from the file on every rank: each rank adds only its own rollouts' cost
    mine = ddp.rank_share(unique, unit=batch_size)
    local = AnchorStore(None, source=source, computed_at_step=step)
    for ex in mine:  # rollouts an interrupted build already stored
        if (have := store.get(ex.uid)) is not None:
            local.update(ex.uid, [have.mean_reward] * have.n, [have.accuracy] * have.n)
    build_anchor(
        mine,
        rollout_fn,
        num_rollouts=num_rollouts,
        batch_size=batch_size,
        store=local,
        step=step,
        source=source,
        show_progress=show_progress,
    )
    # each gathered stat already includes what the store held for its prompt: it replaces it
    merged = {
        **store.stats(),
        **{uid: stat for part in ddp.all_gather_objects(local.stats()) for uid, stat in part.items()},
    }
    cost = dict(before)  # every rank's rollouts counted once, as one process would record them
    for part in ddp.all_gather_objects({k: v - before.get(k, 0.0) for k, v in store.cost.items()}):
        for k, v in part.items():
            cost[k] = cost.get(k, 0.0) + v
    store.reset(step=step, source=source)
    for uid, stat in merged.items():
        store.update(uid, [stat.mean_reward] * stat.n, [stat.accuracy] * stat.n)
    store.num_rollouts = num_rollouts
    store.cost = cost
    if ddp.is_main() and store.path is not None:
        store.save()
    ddp.barrier()
    return store
