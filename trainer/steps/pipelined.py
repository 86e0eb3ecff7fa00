"""Rollouts that never wait for the update (`rollout.max_staleness: eta > 0`): the training step
of `synchronous.py` with its rollouts sampled beside the update, under a staleness bound.

A rollout thread (`rollout/episode_stream.py`) samples the planned episodes while the trainer's
thread updates the policy. Step k of the run then reads:

1. the plans: the prompts, Group Sampling's GT rows and the episodes (their seeds and places, the
   synchronous loop's, `plan.plan_step`) of each step up to k + eta are planned (`_plan`: the
   step's prompts are drawn from the pool as the plan is made); the rollout thread starts them as AReaL's admission
   rule allows (accepted + running <= (eta + version + 1) x batch, Fu et al. 2025,
   arXiv:2505.24298);
2. the batch (`BatchLedger`), in the order the episodes finished, oldest plan first: with a
   static baseline (PVPO's anchor: a row's advantage needs no other row of its group) finished
   episodes stream in one by one, the step's planned episode count of them; with a group baseline
   (GRPO, RLOO, GDPO, ...) whole groups, its prompt count of them. Each step takes exactly its
   plan's count (the last one what remains), waits for every episode of the steps before it, and
   takes no more episodes of later plans than those plans' own batches can give back, so an
   episode is at most one step late and no step waits for an episode that is not coming; a
   prompt's GT rows (Group Sampling) join the batch that takes its first episode;
3. the update of `loop.py` (`StepHost.learn`) with AReaL's decoupled objective (the importance
   correction forced on: clip against the proximal policy, the weights the update starts from,
   times the clamped behaviour weight pi_prox / pi_behav; a GT row keeps pi_gt as its
   denominator and weight 1); the engine neither sleeps nor receives each optimizer step's weights;
4. the new weights published (`after_update`): the engine loads them between two turns of the
   episodes in flight (partial rollouts, where the engine allows it: `EngineSpec.partial_rollouts`,
   the transformers and vLLM engines; otherwise once no episode is in flight: one step off), each
   turn recording the version that sampled it; then the plan of step k + 1 + eta.

At eta = 0 the rule admits step k's episodes only once the policy of step k - 1 exists and the
batch is exactly step k's episodes: the synchronous loop (`synchronous.py` runs that one itself).

The staleness bound is eta + 1, not eta, for a straggler's first turns: the rule starts step
k's episodes from version k - 1 - eta on, so on time (trained by the update that starts from
version k - 1) a token is at most eta versions old, and one step late (the batch of step k + 1,
from version k) its first turns may be eta + 1. They are kept, not dropped: the behaviour weight
pi_prox / pi_behav already corrects them, and dropping would leave the step short of its plan.

Metrics beyond the synchronous loop's: `stale/lag_0` ... `stale/lag_<eta>` (the share of the
batch's model tokens sampled that many versions before the update's policy) and
`stale/lag_over_eta` (a straggler's first turns, eta + 1 old), `stale/mean`, `stale/max`,
`stale/late_frac` (the share of the batch's episodes planned for an earlier step); the clamp's share is
`mismatch/truncated_frac` (tokens whose behaviour weight exceeded the cap), the engine's idle
share `time/engine_idle_frac` (the step's wall time with no episode in flight) and the update's
wait `time/update_wait_s`.

Every wait of the trainer's thread on the rollout thread (the batch, the new weights loaded, a
pause) ends after `rollout.wait_timeout_s` in `RolloutStall`: one line naming what it waited for
and the command that resumes the run from its last checkpoint.

Resume: a checkpoint records how many episodes were in flight or finished but not yet trained on
(`state_dict`); a resumed run discards them and samples them again, with the resumed weights,
from the next step's plan on (`pipeline/regenerated_episodes` in its first step's metrics).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.reference.anchor import needs_refresh
from pvpo.trainer.rollout.engine import RolloutEngine, engine_spec
from pvpo.trainer.rollout.episode_stream import EpisodeStream, Finished, Planned
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.resume import where_stopped
from pvpo.trainer.steps.plan import StepHost, episode_batches, plan_step

log = logging.getLogger(__name__)

Key = tuple[int, str]  # (plan step, prompt uid): one group


class RolloutStall(TimeoutError, ValueError):
    """The trainer waited on the rollouts longer than `rollout.wait_timeout_s` (or for what can no
    longer come); its message is the one line the run ends with (a ValueError: `pvpo` prints it,
    exit status 2)."""


class BatchLedger:
    """What each step's batch takes from the finished episodes (module doc, 2.), in units: one
    episode each with a static baseline (`streaming`), else one whole group.

    Step k takes exactly `quota[k]` units (the synchronous plan's count: what the plan owes it),
    the finished ones sorted oldest plan first, then in finishing order, once no episode of a plan
    before k runs. Taking units of a later plan j early (they finished first) is a debt: plan j's
    leftovers then join step j + 1's batch, so the units of plans >= j taken before step j must
    never exceed `quota[j]` (else a straggler would be two steps late), and a choice that would
    break it waits for the step's own episodes instead. Once every episode of plans <= k has
    finished the oldest-first choice takes none of a later plan, so it is always reachable: no
    step waits for units that are not coming, and the last step takes exactly what remains. The
    rejected rule (take max(quota, the earlier plans' leftovers)) let a step take more than its
    quota, never paid back, so the last step waited forever (steps of 5/4/3 episodes at eta 2)."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.quota: dict[int, int] = {}  # plan step -> units its batch takes
        self.group_size: dict[Key, int] = {}  # sampled episodes planned per group
        self.ahead: Counter[int] = Counter()  # plan step -> its units taken by an earlier step's batch

    def plan(self, step: int, quota: int, groups: Sequence[str]) -> None:
        """Plan `step`: its batch takes `quota` units; `groups` names each planned episode's group
        (its prompt's uid, once per episode)."""
        self.quota[step] = quota
        for uid in groups:
            self.group_size[(step, uid)] = self.group_size.get((step, uid), 0) + 1

    def choose(self, step: int) -> Callable[[Sequence[Finished], Counter[int]], list[int] | None]:
        """`EpisodeStream.take`'s choice for step `step`'s batch (indices into the buffer, or None:
        wait for more episodes)."""
        quota = self.quota[step]

        def choose(buffer: Sequence[Finished], outstanding: Counter[int]) -> list[int] | None:
            if any(n > 0 for s, n in outstanding.items() if s < step):
                return None  # an episode of an earlier step still runs: it belongs in this batch
            units: dict[Key, list[int]] = {}
            for i, f in enumerate(buffer):
                key = (f.planned.step, f.planned.example.uid)
                units.setdefault((f.planned.step, str(i)) if self.streaming else key, []).append(i)
            done = [k for k, idx in units.items() if self.streaming or len(idx) == self.group_size[k]]
            done.sort(key=lambda k: (k[0], units[k][0]))  # oldest plan first, then as they finished
            if len(done) < quota:
                return None
            picked = done[:quota]
            if not self._repayable(step, Counter(k[0] for k in picked if k[0] > step)):
                return None  # too many of a later plan: wait for this step's own episodes
            return [i for k in picked for i in units[k]]

        return choose

    def _repayable(self, step: int, early: Counter[int]) -> bool:
        """Whether, with `early` (plan -> units of later plans this batch would take) taken, every
        later plan j's batch can still take all leftovers of the plans before it."""
        later = sorted(s for s in self.quota if s > step)
        owed_back = 0
        for j in reversed(later):  # units of plans >= j taken before step j
            owed_back += self.ahead[j] + early[j]
            if owed_back > self.quota[j]:
                return False
        return True

    def record(self, step: int, taken: Sequence[Finished]) -> None:
        """Count the units of later plans that step `step`'s batch took (`taken`)."""
        seen: set[Key] = set()
        for f in taken:
            key = (f.planned.step, f.planned.example.uid)
            if f.planned.step > step and (self.streaming or key not in seen):
                self.ahead[f.planned.step] += 1
            seen.add(key)

    def forget(self, step: int) -> None:
        """Drop what no batch after step `step`'s needs (its quota, the groups of earlier plans)."""
        self.quota.pop(step, None)
        self.ahead.pop(step, None)
        for key in [k for k in self.group_size if k[0] < step]:
            del self.group_size[key]


def staleness_metrics(trajs: Sequence[Trajectory], version: int, eta: int) -> dict[str, float]:
    """The lag (`version` minus the version that sampled it) of the model tokens of `trajs`: its
    histogram `stale/lag_<j>` for j <= eta and `stale/lag_over_eta`, `stale/mean`, `stale/max`."""
    lags = [version - v for t in trajs for v, m in zip(t.versions, t.loss_mask, strict=False) if m]
    n = max(1, len(lags))
    counts = Counter(lags)
    out = {f"stale/lag_{j}": counts.get(j, 0) / n for j in range(eta + 1)}
    out["stale/lag_over_eta"] = sum(c for lag, c in counts.items() if lag > eta) / n
    out["stale/mean"] = sum(lags) / n
    out["stale/max"] = float(max(lags, default=0))
    return out


class PipelinedSteps:
    """A trainer's steps with rollouts beside the update (see the module doc; a `plan.StepMode`)."""

    def __init__(self, host: StepHost, resumed: Mapping[str, Any] | None = None) -> None:
        """`resumed`: the pipeline record of the checkpoint the run resumed from (`state_dict`)."""
        cfg = host.cfg  # an estimator sampling extra rollouts is refused when the config loads
        self.host, self.cfg = host, cfg
        self.eta = cfg.rollout.max_staleness
        self.per_turn = engine_spec(cfg.rollout.engine).partial_rollouts
        self.stream: EpisodeStream | None = None
        self._idle0 = 0.0  # the stream's idle seconds when the current step began
        self.planned_through = 0
        self.ledger = BatchLedger(streaming=host.spec.needs_anchors)  # a static baseline: rows stream in
        self.timeout = cfg.rollout.wait_timeout_s
        self.gt: dict[Key, list[Trajectory]] = {}  # a group's GT rows, until a batch takes its first episode
        self.regenerated = int((resumed or {}).get("running", 0)) + int((resumed or {}).get("finished", 0))
        if self.regenerated:
            log.info(
                "resumed with rollouts beside the update: %d episode(s) in flight or untrained at the checkpoint "
                "are sampled again with the checkpoint's weights",
                self.regenerated,
            )

    # ---- one step ----------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        t = self.host
        if self.stream is None:  # the reference is built before any episode runs
            t.ensure_reference(step - 1)
            self._start(step)
        elif self._reference_due(step):
            with self.paused():
                t.ensure_reference(step - 1)
        assert self.stream is not None
        t0, self._idle0 = time.perf_counter(), self.stream.idle_seconds()
        with self._waiting(step, "the finished episodes of its batch"):
            taken = self.stream.take(self.ledger.choose(step), timeout=self.timeout)
        self.ledger.record(step, taken)
        self.ledger.forget(step)
        t1 = time.perf_counter()
        taken.sort(key=lambda f: (f.planned.step, f.planned.position))
        sampled = [f.trajectory for f in taken]
        injected = [
            row
            for key in dict.fromkeys((f.planned.step, f.trajectory.uid) for f in taken)
            for row in self.gt.pop(key, [])
        ]
        prompts = examples_of(taken)
        t.cost.add("train", sampled)
        with self._waiting(step, "the rollout engine to load the last published weights"):
            self.stream.gate.wait_applied(self.timeout)  # the update writes the module they were read from
        metrics = t.learn(step, sampled + injected, injected, prompts, t.reference.anchors(), t0, t1)
        stale = staleness_metrics(sampled, step - 1, self.eta)
        stale["stale/late_frac"] = sum(f.planned.step < step for f in taken) / max(1, len(taken))
        metrics.update(ddp.reduce_metrics(stale, len(sampled)))
        if self.regenerated:
            metrics["pipeline/regenerated_episodes"] = float(ddp.all_reduce_sum(self.regenerated))
            self.regenerated = 0
        return metrics

    def _start(self, step: int) -> None:
        """The rollout thread, at the policy version of the step before `step`, with the plans up
        to `step + eta`."""
        t, r = self.host, self.cfg.rollout
        self.stream = EpisodeStream(
            t.engine,
            t.tokenizer,
            t.searcher,
            t.epcfg,
            t.loop,
            eta=self.eta,
            per_turn=self.per_turn,
            # as the synchronous loop: `rollout.batch_size` trajectories generated together
            concurrency=min(r.batch_size, r.max_concurrency),
            version=step - 1,
        )
        self.planned_through = step - 1
        for s in range(step, step + self.eta + 1):
            self._plan(s)

    def _plan(self, step: int) -> None:
        """Plan `step`'s episodes as the synchronous loop rolls them out (its prompts, rank share,
        GT rows, each episode's seed and index: `StepHost.rollout`); none past `run.steps`."""
        if step > self.cfg.run.steps or step <= self.planned_through:
            return
        assert self.stream is not None
        t, cfg = self.host, self.cfg
        plan = plan_step(
            t.reference,
            t.data.train,
            step,
            prompts_per_step=cfg.data.prompts_per_step,
            n=cfg.rollout.n,
            run_seed=cfg.run.seed,
        )
        group = plan.group
        episodes = [
            Planned(step, j, group[j], batch_seed, first + j - lo)
            for lo, hi, batch_seed, first in episode_batches(plan.seed, plan.offset, len(group), cfg.rollout.batch_size)
            for j in range(lo, hi)
        ]
        streaming = self.ledger.streaming
        self.ledger.plan(step, len(episodes) if streaming else len(plan.prompts), [ex.uid for ex in group])
        for row in plan.injected:
            self.gt.setdefault((step, row.uid), []).append(row)
        self.planned_through = step
        self.stream.plan(step, episodes)

    @contextlib.contextmanager
    def _waiting(self, step: int | None, what: str) -> Iterator[None]:
        """A wait on the rollout thread: past `rollout.wait_timeout_s` (or when what it waits for
        can no longer come) a `RolloutStall` naming `what` and the command that resumes the run."""
        try:
            yield
        except TimeoutError as e:
            stream = self.stream
            if stream is not None and e in (stream.error, getattr(stream, "gate", None) and stream.gate.error):
                raise  # an episode's own error (a timeout of its engine or search), re-raised as it is
            at = f"step {step}" if step is not None else "the trainer"
            raise RolloutStall(
                f"rollouts beside the update: {at} waited for {what} and stopped ({e}; "
                f"rollout.wait_timeout_s={self.timeout:g}): {where_stopped(self.host.run_dir, 'pvpo train')}"
            ) from e

    def after_update(self, step: int) -> None:
        """Publish the policy of `step` to the engine (its weights gathered here: a collective
        under torchrun) and plan the step the rule now admits (`StepHost.learn` calls it)."""
        assert self.stream is not None
        t = self.host
        self.stream.publish(step, t.engine.weights_for_sync(t.model))
        self._plan(step + 1 + self.eta)

    def idle_seconds(self) -> float | None:
        """Seconds since the current step began with no episode in flight (`StepHost.learn`)."""
        return self.stream.idle_seconds() - self._idle0 if self.stream is not None else 0.0

    def _reference_due(self, step: int) -> bool:
        """Whether the anchor is due for a refresh before `step` (it samples with the engine)."""
        store, a = self.host.reference.anchor, self.cfg.algorithm.anchor
        return store is not None and needs_refresh(step - 1, a.refresh_every, store.computed_at_step)

    def update_scope(self) -> AbstractContextManager[None]:
        """The engine keeps sampling through the update."""
        return contextlib.nullcontext()

    def synced_engine(self) -> RolloutEngine | None:
        """None: the new weights are published once the update is done (`after_update`)."""
        return None

    # ---- around the steps ------------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The engine free for the trainer's own use (an evaluation, an anchor refresh): the
        episodes in flight wait between two turns (or, one step off, finish first)."""
        if self.stream is None:
            yield
            return
        with self._waiting(None, "the rollouts in flight to pause"):
            self.stream.gate.pause(self.timeout)
        try:
            yield
        finally:
            self.stream.gate.resume()

    def postfix(self, metrics: Mapping[str, float]) -> dict[str, str]:
        """The progress line's figures of a pipelined step."""
        return {
            "stale": f"{metrics.get('stale/mean', 0.0):.2f}",
            "clamp": f"{metrics.get('mismatch/truncated_frac', 0.0):.3f}",
            "idle": f"{metrics.get('time/engine_idle_frac', 0.0):.2f}",
            "wait": f"{metrics.get('time/update_wait_s', 0.0):.1f}s",
        }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records: the episodes a resume from it samples again."""
        running, finished = self.stream.in_flight() if self.stream is not None else (0, 0)
        return {"pipeline": {"running": running, "finished": finished}}

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


def examples_of(taken: Sequence[Finished]) -> list[QAExample]:
    """The distinct examples of `taken`, in order."""
    return list({f.planned.example.uid: f.planned.example for f in taken}.values())
