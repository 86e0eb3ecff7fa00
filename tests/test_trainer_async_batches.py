"""The batches of rollouts beside the update (`steps.pipelined.BatchLedger`): each step takes exactly its
planned count, waits for the steps before it, an episode is never more than one step late, and no
schedule of step sizes and episode delays ends in a wait that never returns: the 5/4/3-at-eta-2
case on the real stream, and hundreds of seeded schedules simulated with the admission rule."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import random
import types
from collections import Counter

import pytest
from trainer_support import WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.rollout.agent_loop import LoopConfig
from pvpo.trainer.rollout.engine import AsyncGenerate, Completion, RolloutEngine
from pvpo.trainer.rollout.episode_stream import Admission, EpisodeStream, Finished, Planned
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.steps.pipelined import BatchLedger, RolloutStall


class SlowQuestions(RolloutEngine):
    """One answer turn per episode, `slow` seconds for the questions in `slow_for`, else 5 ms."""

    def __init__(self, tok, slow_for: set[str], slow: float) -> None:
        self.tok, self.slow_for, self.slow = tok, slow_for, slow

    def generate(self, prompts, sampling):  # pragma: no cover - the stream samples through sessions
        raise NotImplementedError

    def sync_weights(self, model) -> None:
        pass

    def async_session(self, executor):
        async def generate(prompt, sampling):
            text = self.tok.decode(list(prompt))
            await asyncio.sleep(self.slow if any(q in text for q in self.slow_for) else 0.005)
            ids = self.tok.encode("<answer>Zaro</answer>", add_special_tokens=False)
            return Completion(ids, [-0.5] * len(ids), "stop", stop_string="</answer>")

        return AsyncGenerate(generate)


def test_steps_of_5_4_3_episodes_at_eta_2_each_take_their_own_count_and_the_last_one_ends(policy):
    """Step 1's episodes are slow, steps 2 and 3's fast: the rule that let step 2 take all of step
    1's leftovers (5 > 4) left step 3 waiting forever for a third episode."""
    base = WORLD.questions("train")[0]
    sizes = {1: 5, 2: 4, 3: 3}
    plans = {
        step: [
            Planned(
                step,
                i,
                dataclasses.replace(base, uid=f"q{step}.{i}", question=f"{base.question} ({step}.{i})"),
                step,
                i,
            )
            for i in range(n)
        ]
        for step, n in sizes.items()
    }
    engine = SlowQuestions(policy.tokenizer, {p.example.question for p in plans[1]}, slow=0.4)
    ledger = BatchLedger(streaming=True)
    stream = EpisodeStream(
        engine,
        policy.tokenizer,
        OverlapSearcher(WORLD.passages),
        EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=2, topk=2, max_obs_chars=120),
        LoopConfig(max_new_tokens=30, max_response_tokens=600),
        eta=2,
        per_turn=True,
        concurrency=64,
    )
    batches = []
    try:
        for step in sizes:
            ledger.plan(step, sizes[step], [p.example.uid for p in plans[step]])
            stream.plan(step, plans[step])
        for step in sizes:
            taken = stream.take(ledger.choose(step), timeout=20)
            ledger.record(step, taken)
            ledger.forget(step)
            batches.append(sorted(f.planned.step for f in taken))
            stream.publish(step, lambda: None)
    finally:
        stream.close()
    assert [len(b) for b in batches] == [5, 4, 3]
    assert all(max(b) - 1 <= i + 1 for i, b in enumerate(batches))  # none of a plan more than one step late
    assert sorted(s for b in batches for s in b) == [1] * 5 + [2] * 4 + [3] * 3  # the last took what remained


def test_a_step_waits_for_an_episode_of_an_earlier_step_still_running():
    ledger = BatchLedger(streaming=True)
    ledger.plan(1, 2, ["a", "b"])
    ledger.plan(2, 2, ["c", "d"])
    buffer = [_finished(2, "c"), _finished(2, "d")]
    assert ledger.choose(2)(buffer, Counter({1: 1})) is None  # step 1's straggler belongs in step 2's batch
    assert ledger.choose(2)(buffer, Counter()) == [0, 1]


def test_a_step_takes_no_more_of_a_later_plan_than_that_plans_own_batch_can_give_back():
    ledger = BatchLedger(streaming=True)
    ledger.plan(1, 5, "abcde")
    ledger.plan(2, 4, "fghi")
    later = [_finished(2, u) for u in "fghi"] + [_finished(3, "j")]
    ledger.plan(3, 3, "jkl")
    choose = ledger.choose(1)
    assert choose(later, Counter({1: 5})) is None  # 5 of plans >= 2 taken early: step 2 could not take 5 back
    assert choose([_finished(1, "a"), *later], Counter({1: 4})) == [0, 1, 2, 3, 4]


def test_a_wait_for_episodes_that_cannot_come_ends_at_once_and_any_other_at_its_timeout(policy):
    first, second = WORLD.questions("train")[:2]
    stream = EpisodeStream(
        SlowQuestions(policy.tokenizer, {second.question}, 30.0),
        policy.tokenizer,
        OverlapSearcher(WORLD.passages),
        EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=2, topk=2, max_obs_chars=120),
        LoopConfig(max_new_tokens=30, max_response_tokens=600),
        eta=1,
        per_turn=True,
        concurrency=4,
    )
    try:
        stream.plan(1, [Planned(1, 0, first, seed=1, index=0)])
        with pytest.raises(TimeoutError, match="every planned episode has finished and 1 untaken"):
            stream.take(lambda buffer, outstanding: None, timeout=60)
        stream.plan(2, [Planned(2, 0, second, seed=2, index=0)])  # 30 s an episode
        with pytest.raises(TimeoutError, match="no batch within 0.2 s"):
            stream.take(lambda buffer, outstanding: None, timeout=0.2)
    finally:
        stream.close()


def test_a_stalled_wait_ends_the_run_in_one_line_naming_it_and_the_resume_command(tmp_path):
    from pvpo.trainer.steps.pipelined import PipelinedSteps

    steps = PipelinedSteps.__new__(PipelinedSteps)
    steps.host, steps.timeout, steps.stream = types.SimpleNamespace(run_dir=tmp_path / "run"), 5.0, None
    (tmp_path / "run").mkdir()
    with pytest.raises(RolloutStall) as err, steps._waiting(3, "the finished episodes of its batch"):
        raise TimeoutError("no batch within 5 s")
    line = str(err.value)
    assert "\n" not in line and isinstance(err.value, ValueError)
    assert "step 3 waited for the finished episodes of its batch" in line and "rollout.wait_timeout_s=5" in line
    assert f"pvpo train --run-dir {tmp_path / 'run'} --resume" in line


# ---- hundreds of seeded schedules, simulated --------------------------------------------------
def _finished(step: int, uid: str, started: int = 0) -> Finished:
    example = types.SimpleNamespace(uid=uid)
    return Finished(Planned(step, 0, example, 0, 0), Trajectory.__new__(Trajectory), started)  # type: ignore[arg-type]


def simulate(seed: int) -> dict[str, object]:
    """One run: random step sizes (streamed episodes, or whole groups), episode and update times,
    eta and concurrency; the trainer and the rollouts as `PipelinedSteps` and `EpisodeStream` run
    them (the admission rule, the ledger's choice), as discrete events. Raises on a hang."""
    rng = random.Random(seed)
    eta, steps, streaming = rng.randint(0, 3), rng.randint(1, 7), rng.random() < 0.5
    group_n, concurrency = rng.randint(1, 3), rng.choice([1, 2, 4, 64])
    ledger, rule = BatchLedger(streaming), Admission(eta)
    queue: list[Planned] = []
    running: list[tuple[float, int, Planned, int]] = []  # (finish time, tiebreak, episode, start version)
    buffer: list[Finished] = []
    outstanding: Counter[int] = Counter()
    clock, version, started, finished, tick = 0.0, 0, 0, 0, 0
    lateness, lags = [], []

    def plan(step: int) -> None:
        if step > steps:
            return
        prompts = [f"{step}-{i}" for i in range(rng.randint(1, 5))]
        group = [u for u in prompts for _ in range(group_n)]
        ledger.plan(step, len(group) if streaming else len(prompts), group)
        rule.plan(step, len(group))
        outstanding[step] += len(group)
        queue.extend(Planned(step, i, types.SimpleNamespace(uid=u), 0, i) for i, u in enumerate(group))  # type: ignore[arg-type]

    def admit() -> None:
        nonlocal started, tick
        while queue and len(running) < concurrency and rule.allows(finished, len(running), version):
            p = queue.pop(0)
            started += 1
            tick += 1
            slow = rng.random() < 0.2
            heapq.heappush(
                running, (clock + rng.expovariate(1.0) * (rng.uniform(3, 10) if slow else 1), tick, p, version)
            )

    def advance(until: float | None) -> bool:
        """Finish the next episode (before `until`, if given); False when none is left to finish."""
        nonlocal clock, finished
        if not running or (until is not None and running[0][0] > until):
            if until is not None:
                clock = max(clock, until)
            return False
        clock, _, p, v = heapq.heappop(running)
        finished += 1
        outstanding[p.step] -= 1
        buffer.append(Finished(p, Trajectory.__new__(Trajectory), v))
        admit()
        return True

    for s in range(1, eta + 2):
        plan(s)
    admit()
    for step in range(1, steps + 1):
        choose = ledger.choose(step)
        while (picked := choose(buffer, outstanding)) is None:
            if not advance(None):
                raise AssertionError(f"seed {seed}: step {step} waits forever (eta {eta})")
        taken = [buffer[i] for i in picked]
        buffer = [f for i, f in enumerate(buffer) if i not in set(picked)]
        units = len(taken) if streaming else len({(f.planned.step, f.planned.example.uid) for f in taken})
        assert units == ledger.quota[step], f"seed {seed}: step {step} took {units} of {ledger.quota[step]}"
        ledger.record(step, taken)
        ledger.forget(step)
        lateness += [step - f.planned.step for f in taken]
        lags += [(step - 1) - f.started_version for f in taken]  # the episode's first turn
        update_end = clock + rng.expovariate(1.0) * rng.choice([0.1, 1, 5])
        while advance(update_end):  # the rollouts go on during the update
            pass
        version = step
        plan(step + 1 + eta)
        admit()
    assert not buffer and not queue and not running, f"seed {seed}: episodes left over"
    return {"eta": eta, "lateness": max(lateness, default=0), "lag": max(lags, default=0)}


def test_hundreds_of_random_schedules_never_hang_and_stay_within_one_step_and_eta_plus_one():
    runs = [simulate(seed) for seed in range(600)]
    assert all(r["lateness"] <= 1 for r in runs)  # an episode trains at most one step after its plan's
    assert all(r["lag"] <= r["eta"] + 1 for r in runs)  # a first turn's staleness: eta + 1 at most
    assert any(r["lag"] == r["eta"] + 1 for r in runs if r["eta"])  # and that bound is reached


def test_an_episodes_own_timeout_error_is_not_reported_as_a_stalled_wait(tmp_path):
    from pvpo.trainer.steps.pipelined import PipelinedSteps

    steps = PipelinedSteps.__new__(PipelinedSteps)
    own = TimeoutError("the search server timed out")
    steps.host, steps.timeout = types.SimpleNamespace(run_dir=tmp_path), 5.0
    steps.stream = types.SimpleNamespace(error=own, gate=types.SimpleNamespace(error=None))  # type: ignore[assignment]
    with pytest.raises(TimeoutError) as err, steps._waiting(2, "the finished episodes of its batch"):
        raise own
    assert err.value is own and not isinstance(err.value, RolloutStall)
