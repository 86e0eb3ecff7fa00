"""The asynchronous agent loop: greedy trajectories equal the synchronous loop's (captured before
it was replaced), no trajectory waits on another's turn, continuous batching is exact, a stuck
search times out alone, at most `max_concurrency` trajectories run, the same seed gives the same
trajectories whatever the scheduling, and turns stop at the chat template's end-of-turn token."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from trainer_support import WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.rollout.agent_loop import LoopConfig, prompt_ids, run_agent_loop
from pvpo.trainer.rollout.engine import AsyncGenerate, Completion, RolloutEngine, SamplingConfig, stop_token_ids
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.rollout.hf_scheduler import ContinuousBatcher

FIXTURE = Path(__file__).parent / "fixtures" / "agent_loop_greedy_old.json"
EPISODE = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=4, topk=2, max_obs_chars=120)


def _bias(policy, bias: float):
    stop_id = policy.tokenizer.convert_tokens_to_ids("</search>")
    return policy.model.lm_head.register_forward_hook(
        lambda m, i, o: o.index_add(-1, torch.tensor([stop_id]), torch.full_like(o[..., :1], bias))
    )


@pytest.mark.parametrize("bias", ["0.0", "6.0", "8.0"])
def test_greedy_trajectories_equal_the_synchronous_loops(policy, bias):
    # captured from the per-turn synchronous loop (commit efe3bcf) with the same policy and limits
    ref = json.loads(FIXTURE.read_text())[bias]
    handle = _bias(policy, float(bias))
    try:
        trajs = run_agent_loop(
            HFEngine(policy.model, policy.tokenizer),
            policy.tokenizer,
            WORLD.questions("train")[:8],
            OverlapSearcher(WORLD.passages),
            EPISODE,
            LoopConfig(temperature=0.0, max_new_tokens=12, max_response_tokens=600),
            seed=5,
        )
    finally:
        handle.remove()
    assert len(trajs) == len(ref)
    for t, r in zip(trajs, ref, strict=True):
        assert (t.uid, t.prompt_ids, t.response_ids, t.loss_mask) == (
            r["uid"],
            r["prompt_ids"],
            r["response_ids"],
            r["loss_mask"],
        )
        assert (t.reward, t.finish_reason, t.num_turns, t.num_tool_calls, t.prediction) == (
            r["reward"],
            r["finish_reason"],
            r["num_turns"],
            r["num_tool_calls"],
            r["prediction"],
        )
        assert t.old_logprobs == pytest.approx(r["old_logprobs"], abs=1e-4)


def test_rows_joining_and_leaving_a_running_batch_sample_as_if_alone(policy):
    from concurrent.futures import ThreadPoolExecutor

    eng = HFEngine(policy.model, policy.tokenizer)
    tok = policy.tokenizer
    prompts = [tok.encode(q.question) for q in WORLD.questions("train")[:4]]
    budgets = [3, 20, 7, 15]
    alone = [
        eng.generate([p], SamplingConfig(temperature=0.0, max_new_tokens=n))[0]
        for p, n in zip(prompts, budgets, strict=True)
    ]

    async def go():
        with ThreadPoolExecutor(2) as pool:
            sched = ContinuousBatcher(eng, pool, max_batch=8)

            async def chain(first, then):
                a = await sched.generate(prompts[first], SamplingConfig(temperature=0.0, max_new_tokens=budgets[first]))
                b = await sched.generate(prompts[then], SamplingConfig(temperature=0.0, max_new_tokens=budgets[then]))
                return a, b

            (a0, a2), (a1, a3) = await asyncio.gather(chain(0, 2), chain(1, 3))
            return [a0, a1, a2, a3], sched.batch_sizes

    got, sizes = asyncio.run(go())
    for g, ref in zip(got, alone, strict=True):
        assert g.token_ids == ref.token_ids and g.finish_reason == ref.finish_reason
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    assert max(sizes) == 2 and sizes[-1] == 1  # rows left as they finished, joined as they came


class PacedEngine(RolloutEngine):
    """A fake engine whose turns take `seconds_per_token` each, scripted per prompt: the first
    `n_long` examples search (short turns) until the episode's turn limit, the others answer at
    once with a long turn. Logs (event, trajectory, time) and the peak number of turns in flight."""

    def __init__(self, tok, examples, n_long: int, seconds_per_token: float = 0.004) -> None:
        self.tok, self.pace = tok, seconds_per_token
        self.prompts = [prompt_ids(tok, EPISODE.prompt(ex)) for ex in examples]
        self.long = set(range(n_long))
        self.events: list[tuple[str, int, float]] = []
        self.in_flight = self.peak = 0

    def _which(self, context):
        return next(i for i, p in enumerate(self.prompts) if context[: len(p)] == p)

    def async_session(self, executor):
        async def generate(prompt, sampling):
            i = self._which(list(prompt))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            text = "<search>the mentor of Zaro</search>" if i in self.long else "<answer>" + "x " * 60 + "</answer>"
            ids = self.tok.encode(text, add_special_tokens=False)
            self.events.append(("start", i, time.perf_counter()))
            await asyncio.sleep(self.pace * len(ids))
            self.events.append(("end", i, time.perf_counter()))
            self.in_flight -= 1
            return Completion(ids, [-1.0] * len(ids), "stop", text[-9:])

        return AsyncGenerate(generate)

    def generate(self, prompts, sampling):
        raise AssertionError("the agent loop uses the asynchronous session")

    def sync_weights(self, model):
        return None


def test_short_episodes_run_their_turns_while_a_long_turn_is_still_generating(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:6]
    eng = PacedEngine(tok, examples, n_long=3)
    loop = LoopConfig(max_new_tokens=400, max_response_tokens=2000)
    trajs = run_agent_loop(eng, tok, examples, OverlapSearcher(WORLD.passages), EPISODE, loop, seed=0)
    assert [t.num_turns for t in trajs] == [4, 4, 4, 1, 1, 1]
    assert [t.finish_reason for t in trajs] == ["max_turns"] * 3 + ["answer"] * 3
    first_answer_done = min(t for e, i, t in eng.events if e == "end" and i >= 3)
    # every turn of the 4-turn episodes ran while the 1-turn episodes were still on their only turn
    assert all(t < first_answer_done for e, i, t in eng.events if i < 3)


class StuckSearcher(OverlapSearcher):
    """Blocks on any query naming `stuck` until released."""

    def __init__(self, passages, stuck: str) -> None:
        super().__init__(passages)
        self.stuck, self.release = stuck, threading.Event()

    def search(self, queries, topk=None):
        if any(self.stuck in q for q in queries):
            self.release.wait(30)
        return super().search(queries, topk)


class QueryEngine(PacedEngine):
    """Trajectory 0 searches for 'STUCK', the others for a normal query, then all answer."""

    def async_session(self, executor):
        async def generate(prompt, sampling):
            i = self._which(list(prompt))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            first = len(prompt) == len(self.prompts[i])
            q = "STUCK" if i == 0 else "the mentor of Zaro"
            text = f"<search>{q}</search>" if first else "<answer>Kelmo</answer>"
            ids = self.tok.encode(text, add_special_tokens=False)
            await asyncio.sleep(0.01)
            self.in_flight -= 1
            return Completion(ids, [-1.0] * len(ids), "stop", None)

        return AsyncGenerate(generate)


def test_a_stuck_search_ends_its_trajectory_and_the_others_go_on(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:3]
    searcher = StuckSearcher(WORLD.passages, "STUCK")
    loop = LoopConfig(max_new_tokens=40, max_response_tokens=2000, search_timeout_s=0.5)
    t0 = time.perf_counter()
    try:
        trajs = run_agent_loop(QueryEngine(tok, examples, 0), tok, examples, searcher, EPISODE, loop, seed=0)
    finally:
        searcher.release.set()
    assert time.perf_counter() - t0 < 10
    assert [t.finish_reason for t in trajs] == ["search_timeout", "answer", "answer"]
    assert trajs[0].num_turns == 1 and [t.num_turns for t in trajs[1:]] == [2, 2]


def test_at_most_max_concurrency_trajectories_are_in_flight(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:8]
    for bound in (1, 3):
        eng = PacedEngine(tok, examples, n_long=4, seconds_per_token=0.0005)
        loop = LoopConfig(max_new_tokens=400, max_response_tokens=2000, max_concurrency=bound)
        trajs = run_agent_loop(eng, tok, examples, OverlapSearcher(WORLD.passages), EPISODE, loop, seed=0)
        assert eng.peak == bound and len(trajs) == 8


def test_on_done_hands_over_each_trajectory_as_it_ends_with_no_barrier_between_questions(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:6]
    eng = PacedEngine(tok, examples, n_long=0, seconds_per_token=0.004)
    eng.long = {1, 2, 3, 4, 5}  # question 0 answers in one long turn; the others take one short search turn
    loop = LoopConfig(max_new_tokens=400, max_response_tokens=2000, max_concurrency=2)
    done: list[int] = []
    one_turn = replace(EPISODE, max_turns=1)
    trajs = run_agent_loop(
        eng, tok, examples, OverlapSearcher(WORLD.passages), one_turn, loop, seed=0, on_done=lambda i, t: done.append(i)
    )
    assert sorted(done) == list(range(6)) and trajs[0].finish_reason == "answer"
    # 2 in flight: questions 1, 2 and 3 pass through the second slot while question 0 still generates
    # (with batches of 2, question 2 would wait for question 0 to end)
    assert done.index(0) > done.index(3), done


def test_indices_sample_a_subset_as_it_samples_within_the_whole(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:5]
    handle = _bias(policy, 3.0)
    try:
        loop = LoopConfig(max_new_tokens=10, max_response_tokens=300)
        whole = run_agent_loop(
            HFEngine(policy.model, tok), tok, examples, OverlapSearcher(WORLD.passages), EPISODE, loop, seed=7
        )
        part = run_agent_loop(
            HFEngine(policy.model, tok),
            tok,
            [examples[1], examples[4]],
            OverlapSearcher(WORLD.passages),
            EPISODE,
            loop,
            seed=7,
            indices=[1, 4],
        )
    finally:
        handle.remove()
    assert [t.response_ids for t in part] == [whole[1].response_ids, whole[4].response_ids]


def test_same_seed_same_sampled_trajectories_whatever_the_scheduling(policy):
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:3] * 2  # groups: identical prompts sample differently
    runs = []
    handle = _bias(policy, 3.0)
    try:
        for bound, batch in ((1, 1), (6, 64), (4, 2)):
            loop = LoopConfig(max_new_tokens=10, max_response_tokens=300, max_concurrency=bound)
            eng = HFEngine(policy.model, tok, micro_batch_size=batch)
            runs.append(run_agent_loop(eng, tok, examples, OverlapSearcher(WORLD.passages), EPISODE, loop, seed=7))
    finally:
        handle.remove()
    ids = [[t.response_ids for t in r] for r in runs]
    assert ids[0] == ids[1] == ids[2]
    assert ids[0][0] != ids[0][3]  # a group's identical prompts got different seeds


def test_turns_stop_at_the_chat_templates_end_of_turn_token(policy):
    import copy

    tok = copy.deepcopy(policy.tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    assert tok.convert_tokens_to_ids("<|im_end|>") not in stop_token_ids(tok)
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    assert stop_token_ids(tok) == {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}


def test_the_schedulers_kv_cache_writes_decode_steps_in_place_and_grows_on_overrun():
    from pvpo.trainer.rollout.kv_cache import rebuild

    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    cache = rebuild([(k, v)], spare=2)
    layer = cache.layers[0]
    buf = layer.k_buf.data_ptr()
    steps = [(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)) for _ in range(3)]
    for i, (dk, dv) in enumerate(steps[:2]):
        keys, values = cache.update(dk, dv, 0)
        assert keys.shape[-2] == 6 + i and cache.get_seq_length() == 6 + i
    assert layer.k_buf.data_ptr() == buf, "a step within the spare room reallocated the cache"
    keys, values = cache.update(*steps[2], 0)  # past the room: grows, content kept
    assert layer.k_buf.data_ptr() != buf and layer.k_buf.shape[-2] > 8
    assert torch.equal(keys, torch.cat([k, *(s[0] for s in steps)], dim=-2))
    assert torch.equal(values, torch.cat([v, *(s[1] for s in steps)], dim=-2))


def test_a_next_turn_prefills_only_past_its_saved_turn_and_samples_as_if_prefilled_whole(policy):
    from concurrent.futures import ThreadPoolExecutor

    eng = HFEngine(policy.model, policy.tokenizer)
    tok = policy.tokenizer
    first = tok.encode(WORLD.questions("train")[0].question)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    turn1 = eng.generate([first], greedy)[0]
    second = first + turn1.token_ids + tok.encode(" observation: Paris is a city.")
    alone = eng.generate([second], SamplingConfig(temperature=0.0, max_new_tokens=9))[0]

    async def go():
        with ThreadPoolExecutor(1) as pool:
            sched = ContinuousBatcher(eng, pool, max_batch=4)
            a = await sched.generate(first, greedy)
            b = await sched.generate(first + a.token_ids + second[len(first) + len(a.token_ids) :], alone_sampling)
            return a, b, sched.prefixes

    alone_sampling = SamplingConfig(temperature=0.0, max_new_tokens=9)
    a, b, store = asyncio.run(go())
    assert a.token_ids == turn1.token_ids
    assert store.hits == 1 and store.reused_tokens == len(first) + len(a.token_ids) - 1
    assert b.token_ids == alone.token_ids and b.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_a_lookup_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    from pvpo.trainer.rollout.hf_scheduler import lookup_draft

    assert lookup_draft([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]  # latest 3-gram match
    assert lookup_draft([1, 2, 3, 4, 9, 2], 2) == [3, 4]  # no 2-gram match: the 1-gram's
    assert lookup_draft([1, 2, 1, 2], 5) == [1, 2]  # the draft may run into the suffix itself
    assert lookup_draft([1, 2, 3], 4) == [] and lookup_draft([4], 4) == [] and lookup_draft([3, 1, 3], 0) == []


def _pick_row_by_row(batcher: ContinuousBatcher, logits: torch.Tensor, rows: list) -> None:
    """The scheduler's pick one row at a time, as it was before it was batched (the reference)."""
    from pvpo.trainer.rollout.sampling import top_k_filter, top_p_filter

    logits = logits.float()
    for i, r in enumerate(rows):
        s = r.sampling
        if s.temperature <= 0:
            row = logits[i]
            t = int(row.argmax())
        else:
            row = logits[i] / s.temperature
            filtered = top_p_filter(top_k_filter(row[None], s.top_k), s.top_p)[0]
            probs = torch.softmax(filtered, dim=-1).cpu()
            t = int(torch.multinomial(probs, 1, generator=r.gen))
        batcher._append(r, t, float(torch.log_softmax(row, dim=-1)[t]))


def test_the_batched_pick_samples_and_scores_bit_for_bit_as_row_by_row():
    """`_pick` takes all greedy rows in one argmax and each sampling setting's rows in one pass;
    every row's token and log-prob equal the row-by-row reference's, its generator included."""
    from types import SimpleNamespace

    from pvpo.trainer.rollout.hf_scheduler import _Row

    engine = SimpleNamespace(stop_ids=frozenset(), _decode_tail=lambda tokens, n: "", sampled_tokens=0)
    settings = [
        SamplingConfig(temperature=0.0, max_new_tokens=99),
        SamplingConfig(temperature=0.8, max_new_tokens=99),
        SamplingConfig(temperature=0.8, top_p=0.9, max_new_tokens=99),
        SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=99),
        SamplingConfig(temperature=0.8, max_new_tokens=99),
        SamplingConfig(temperature=0.0, max_new_tokens=99),
    ]

    def rows() -> list[_Row]:
        out = []
        for seed, s in enumerate(settings):
            gen = None
            if s.temperature > 0:
                gen = torch.Generator().manual_seed(seed)
            out.append(_Row([1], s, None, gen, 0))  # type: ignore[arg-type]
        return out

    batched, single = rows(), rows()
    a, b = ContinuousBatcher(engine, None, 8), ContinuousBatcher(engine, None, 8)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        logits = torch.randn(len(settings), 500, generator=gen) * 3
        a._pick(logits, batched)
        _pick_row_by_row(b, logits.clone(), single)
    for x, y in zip(batched, single, strict=True):
        assert x.tokens == y.tokens and x.logps == y.logps
    assert len({tuple(r.tokens) for r in batched}) == len(settings)  # the rows did differ


@pytest.mark.parametrize("compact", [False, True])
def test_drafted_greedy_decoding_gives_the_tokens_of_one_at_a_time(policy, monkeypatch, compact):
    from concurrent.futures import ThreadPoolExecutor

    from pvpo.trainer.rollout import hf_scheduler

    if compact:  # compact the cache whenever a rejected draft left a masked position inside a row
        monkeypatch.setattr(hf_scheduler, "COMPACT_RATIO", 1)
        monkeypatch.setattr(hf_scheduler, "COMPACT_MIN", 0)
    eng = HFEngine(policy.model, policy.tokenizer)
    tok = policy.tokenizer
    vocab = policy.model.config.vocab_size
    # a nudge towards a short cycle of tokens makes the policy repeat itself often, but not always,
    # so drafts are kept in part: rows keep different numbers of tokens a step
    nudge = policy.model.lm_head.register_forward_hook(
        lambda m, i, o: o + 2.5 * torch.nn.functional.one_hot((o.argmax(-1) % 5) + 7, vocab).to(o.dtype)
    )
    prompts = [tok.encode(q.question) for q in WORLD.questions("train")[:4]]
    budgets = [9, 40, 17, 30]
    obs = tok.encode(" observation: Paris is a city.")

    async def run(draft_tokens):
        with ThreadPoolExecutor(1) as pool:
            sched = ContinuousBatcher(eng, pool, max_batch=3, draft_tokens=draft_tokens)

            async def chain(i):  # two turns: the second continues from the first's saved cache
                g = SamplingConfig(temperature=0.0, max_new_tokens=budgets[i])
                a = await sched.generate(prompts[i], g)
                b = await sched.generate(prompts[i] + a.token_ids + obs, g)
                return a, b

            out = await asyncio.gather(*(chain(i) for i in range(4)))
            return [c for pair in out for c in pair], sched

    try:
        plain, _ = asyncio.run(run(0))
        drafted, sched = asyncio.run(run(4))
    finally:
        nudge.remove()
    assert 0 < sched.accepted < sched.drafted, "the test must keep some drafts and reject others"
    assert sched.prefixes.hits > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.finish_reason) == (p.token_ids, p.finish_reason)
        assert d.logprobs == pytest.approx(p.logprobs, abs=1e-4)


def test_the_prefix_store_returns_the_longest_saved_prefix_once_and_evicts_the_oldest_past_its_budget():
    from pvpo.trainer.rollout.kv_prefix import PrefixStore

    def kv(n):  # one layer, 16 bytes a position for keys and values together
        return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]

    store = PrefixStore(max_bytes=16 * 10)
    store.save([1, 2, 3, 4], kv(4))
    assert store.take([1, 2, 3, 4]) is None, "nothing left to prefill: the next token needs a prefill"
    store.save([1, 2], kv(2))
    got = store.take([1, 2, 3, 4, 5])
    assert got is not None and got.ids == [1, 2, 3, 4] and store.take([1, 2, 3, 4, 5]).ids == [1, 2]
    assert store.take([1, 2, 3, 4, 5]) is None and store.nbytes == 0
    store.save([7], kv(4))
    store.save([8], kv(4))
    store.save([9], kv(4))  # 12 positions > 10: the oldest goes
    assert [e.ids for e in store.entries.values()] == [[8], [9]] and store.nbytes == 16 * 8
    store.save([5], kv(11))  # larger than the whole budget: not kept, nothing evicted
    assert [e.ids for e in store.entries.values()] == [[8], [9]]
    assert store.take([3, 3]) is None and store.hits == 2


def test_ctrl_c_while_the_episode_loop_is_built_stops_cleanly_with_no_half_built_loop(monkeypatch) -> None:
    """A Ctrl-C landing inside the event loop's constructor once left a loop without its self-pipe,
    whose finalizer printed an "Exception ignored ... no attribute '_ssock'" traceback as the process
    ended (CI, one run of a 40-SIGINT storm). The loop is now built with the signal held: the stop
    comes after it, as a KeyboardInterrupt, and nothing half-built is left to finalize."""
    import gc
    import os
    import signal
    import sys
    from asyncio import selector_events

    from pvpo.trainer.rollout.agent_loop import run_episodes

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    make_pipe = selector_events.BaseSelectorEventLoop._make_self_pipe

    def interrupted(self):  # the signal arrives in the constructor, before the self-pipe exists
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here, at the next bytecode
        return make_pipe(self)

    monkeypatch.setattr(selector_events.BaseSelectorEventLoop, "_make_self_pipe", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_episodes(None, [object()], None, None, None, seed=0)  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    gc.collect()
    assert not unraisable, [getattr(u, "exc_value", u) for u in unraisable]


def test_a_stop_raised_in_a_task_being_cancelled_propagates_once_without_an_unretrieved_task_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGTERM's `Stopped` (a KeyboardInterrupt) that reaches a task while run_fresh cancels the
    loop's tasks leaves the loop before gather reads it; asyncio then logged "Task exception was
    never retrieved" with a traceback after the command's one-line stop, unless run_fresh reads it."""
    import gc

    from pvpo.signals import Stopped
    from pvpo.trainer.rollout.agent_loop import run_fresh

    async def stops_when_cancelled() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise Stopped() from None

    async def main() -> None:
        asyncio.get_running_loop().create_task(stops_when_cancelled())
        await asyncio.sleep(0)
        raise Stopped()

    with caplog.at_level("ERROR", logger="asyncio"), pytest.raises(Stopped):
        run_fresh(main)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
