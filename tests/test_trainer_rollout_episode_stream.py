"""Episodes sampled beside the update (`rollout/episode_stream.py`, `rollout/weight_gate.py`):
AReaL's admission rule is never exceeded, new weights load between two turns with the version of
each turn recorded (partial rollouts), one step off they load only once no episode is in flight,
and a pause waits for the turns in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from trainer_support import WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.rollout.agent_loop import LoopConfig
from pvpo.trainer.rollout.engine import AsyncGenerate, Completion, RolloutEngine
from pvpo.trainer.rollout.episode_stream import Admission, EpisodeStream, Planned

EPISODE = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=4, topk=2, max_obs_chars=120)
LOOP = LoopConfig(max_new_tokens=30, max_response_tokens=600)


class ScriptedTurns(RolloutEngine):
    """Each turn takes `delay` seconds: a search while the context holds fewer than `searches`
    results, then an answer. `first_turn` is set once a turn has been sampled."""

    def __init__(self, tok, searches: int = 2, delay: float = 0.02) -> None:
        self.tok, self.searches, self.delay = tok, searches, delay
        self.turns = 0
        self.first_turn = threading.Event()

    def generate(self, prompts, sampling):  # pragma: no cover - the stream samples through sessions
        raise NotImplementedError

    def sync_weights(self, model) -> None:
        pass

    def async_session(self, executor):
        async def generate(prompt, sampling):
            await asyncio.sleep(self.delay)
            done = self.tok.decode(list(prompt)).count("Doc 1(Title")  # the results so far
            text = "<search>the mentor of Zaro</search>" if done < self.searches else "<answer>Zaro</answer>"
            ids = self.tok.encode(text, add_special_tokens=False)
            self.turns += 1
            self.first_turn.set()
            return Completion(ids, [-0.5] * len(ids), "stop", stop_string=text[-9:])

        return AsyncGenerate(generate)


def _plan(step: int, n: int) -> list[Planned]:
    exs = WORLD.questions("train")
    return [Planned(step, j, exs[(step * n + j) % len(exs)], seed=step, index=j) for j in range(n)]


def _stream(policy, engine, *, eta: int = 1, per_turn: bool = True, on_start=None) -> EpisodeStream:
    return EpisodeStream(
        engine,
        policy.tokenizer,
        OverlapSearcher(WORLD.passages),
        EPISODE,
        LOOP,
        eta=eta,
        per_turn=per_turn,
        concurrency=64,
        on_start=on_start,
    )


def _take(stream: EpisodeStream, n: int):
    return stream.take(lambda buffer, outstanding: list(range(n)) if len(buffer) >= n else None, timeout=60)


def _turn_versions(traj) -> list[int]:
    """The version of each model turn; a turn's tokens must all carry the same one."""
    out = []
    for start, end, _ in traj.model_turns:
        versions = set(traj.versions[start:end])
        assert len(versions) == 1, f"a turn sampled by versions {versions}"
        out.append(versions.pop())
    return out


def test_admission_rule_caps_accepted_plus_running_at_eta_plus_version_plus_one_batches():
    rule = Admission(eta=1)
    for step in (1, 2, 3):
        rule.plan(step, 4)
    assert rule.capacity(0) == 8 and rule.capacity(1) == 12 and rule.capacity(2) == 12
    assert rule.allows(accepted=3, running=4, version=0) and not rule.allows(accepted=4, running=4, version=0)


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_the_stream_never_starts_an_episode_the_admission_rule_forbids(policy, eta):
    batch, steps = 4, 5
    starts: list[tuple[int, int, int]] = []
    stream = _stream(
        policy, ScriptedTurns(policy.tokenizer, searches=1, delay=0.005), eta=eta, on_start=lambda *a: starts.append(a)
    )
    try:
        for step in range(1, steps + 1):  # every step planned at once: only the rule holds them back
            stream.plan(step, _plan(step, batch))
        for version in range(1, steps + 1):
            _take(stream, batch)
            time.sleep(0.05)  # had the rule let more start, they would have started by now
            assert stream.counts.started <= (eta + version) * batch
            stream.publish(version, lambda: None)
        _take(stream, 0)
    finally:
        stream.close()
    assert len(starts) == steps * batch
    assert all(accepted + running + 1 <= (eta + version + 1) * batch for accepted, running, version in starts)
    # the rule was what held them: at version 0 exactly (eta + 1) batches started
    assert max(a + r + 1 for a, r, v in starts if v == 0) == (eta + 1) * batch


def test_new_weights_load_between_turns_and_each_turn_records_the_version_that_sampled_it(policy):
    engine = ScriptedTurns(policy.tokenizer, searches=2, delay=0.05)
    stream = _stream(policy, engine)
    holders_at_load: list[int] = []
    try:
        stream.plan(1, _plan(1, 3))
        assert engine.first_turn.wait(30)
        stream.publish(1, lambda: holders_at_load.append(stream.gate.holders))
        taken = _take(stream, 3)
    finally:
        stream.close()
    assert holders_at_load == [0]  # no turn was being sampled while the weights changed
    turns = [_turn_versions(f.trajectory) for f in taken]
    assert all(t == sorted(t) and len(t) == 3 for t in turns)
    assert any(t[0] == 0 and t[-1] == 1 for t in turns), f"no episode went on with the new weights: {turns}"
    assert all(v == -1 for f in taken for v, m in zip(f.trajectory.versions, f.trajectory.loss_mask) if not m)


def test_one_step_off_loads_new_weights_only_once_no_episode_is_in_flight(policy):
    engine = ScriptedTurns(policy.tokenizer, searches=2, delay=0.05)
    stream = _stream(policy, engine, per_turn=False)
    finished_at_load: list[int] = []
    try:
        stream.plan(1, _plan(1, 3))
        assert engine.first_turn.wait(30)
        stream.publish(1, lambda: finished_at_load.append(stream.counts.finished))
        stream.plan(2, _plan(2, 2))  # admitted by version 1 (eta = 1 allows step 2 from version 0 anyway)
        first = _take(stream, 3)
        second = _take(stream, 2)
    finally:
        stream.close()
    assert finished_at_load == [3]
    assert all(_turn_versions(f.trajectory) == [0, 0, 0] for f in first)
    assert all(set(_turn_versions(f.trajectory)) == {1} for f in second)


def test_a_pause_waits_for_the_turns_in_flight_and_holds_the_next_ones_until_resumed(policy):
    engine = ScriptedTurns(policy.tokenizer, searches=3, delay=0.05)
    stream = _stream(policy, engine)
    try:
        stream.plan(1, _plan(1, 2))
        assert engine.first_turn.wait(30)
        stream.gate.pause(timeout=30)
        assert stream.gate.holders == 0
        turns = engine.turns
        time.sleep(0.3)
        assert engine.turns == turns, "a turn was sampled while the rollouts were paused"
        stream.gate.resume()
        taken = _take(stream, 2)
    finally:
        stream.close()
    assert all(len(f.trajectory.model_turns) == 4 for f in taken)


def test_an_episode_that_fails_reaches_the_trainer_at_its_next_take(policy):
    class Broken(ScriptedTurns):
        def async_session(self, executor):
            async def generate(prompt, sampling):
                raise RuntimeError("the engine broke")

            return AsyncGenerate(generate)

    stream = _stream(policy, Broken(policy.tokenizer))
    try:
        stream.plan(1, _plan(1, 2))
        with pytest.raises(RuntimeError, match="the engine broke"):
            _take(stream, 2)
    finally:
        stream.close()


class ThreadCounts(ScriptedTurns):
    """Records torch's CPU thread count in the thread that samples and in the engine's executor."""

    def __init__(self, tok, omp_threads) -> None:
        super().__init__(tok, searches=0, delay=0.0)
        self.omp_threads = omp_threads
        self.seen: list[int] = []

    def async_session(self, executor):
        inner = super().async_session(executor)

        async def generate(prompt, sampling):
            self.seen.append(self.omp_threads())
            self.seen.append(await asyncio.get_running_loop().run_in_executor(executor, self.omp_threads))
            return await inner.generate(prompt, sampling)

        return AsyncGenerate(generate)


def test_the_rollout_threads_run_at_the_trainers_torch_threads_not_the_process_default(policy):
    import torch
    from omp_support import omp_max_threads_reader

    omp_threads = omp_max_threads_reader()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh: list[int] = []
        t = threading.Thread(target=lambda: fresh.append(omp_threads()))
        t.start()
        t.join()
        if fresh[0] == 1:
            pytest.skip("a new thread starts at 1 OpenMP thread here too (one CPU): nothing to tell apart")
        engine = ThreadCounts(policy.tokenizer, omp_threads)
        stream = _stream(policy, engine)
        try:
            stream.plan(1, _plan(1, 3))
            _take(stream, 3)
        finally:
            stream.close()
        assert engine.seen and set(engine.seen) == {1}, f"rollout threads ran at {sorted(set(engine.seen))} threads"
    finally:
        torch.set_num_threads(before)
