"""The agent loop: the one driver of every multi-turn episode (training rollouts, the anchor's
reference rollouts, evaluation, GT generation, warm-start data), asynchronous per trajectory.

Each trajectory is its own asyncio task: it samples a turn (until a stop string, `</search>` /
`</answer>`, EOS or the chat template's end-of-turn token), hands the turn to its `Episode` (the
env's rules and rewards, `pvpo.envs.episode`), searches if the turn asked to, appends the
observation (loss mask 0) and goes on, while the other trajectories are still generating; a turn
never waits for another trajectory's turn. The engine batches whatever turns are pending
(continuous batching for `hf`); the searches of the trajectories that finish a turn together
meet in one retriever call (`tick_batching.SearchBatcher`). At most `LoopConfig.max_concurrency`
trajectories are in flight; a search that takes longer than `search_timeout_s` is retried once in
a call of its own (the batched call may have been held up by another trajectory's query), and if
that times out too its trajectory ends (`finish_reason="search_timeout"`); the others go on.

A trajectory ends on an answer or the episode's `max_turns` (the env's rules), or on EOS without
an answer, a token budget or a turn fallen into a loop (the loop's: `LoopConfig`; the env then
scores the episode as it stands with `Episode.end`). Sampled ids and log-probs are kept as
sampled; rewards are the env's, computed on the text the policy saw.

Determinism: every trajectory samples each turn with its own seed, derived from the caller's
`seed`, the trajectory's index and the turn (`turn_seed`), and the HF engine gives each request
its own generator, so the same seed gives the same trajectories whatever the scheduling (exactly
so for greedy decoding, up to float rounding across padding widths). Engines seeded per batch
(the default `RolloutEngine.generate_each`, which groups requests of one tick under the first
one's seed) and remote endpoints can sample differently when requests meet in other groupings;
vLLM seeds each request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pvpo.envs.data import QAExample
from pvpo.envs.episode import Episode, EpisodeConfig
from pvpo.hardware import carry_torch_threads
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind
from pvpo.signals import hold_signals
from pvpo.trainer.rollout.engine import AsyncGenerate, RolloutEngine, SamplingConfig, stop_token_ids
from pvpo.trainer.rollout.repetition import ends_in_loop
from pvpo.trainer.rollout.tick_batching import SearchBatcher
from pvpo.trainer.rollout.trajectory import Trajectory

T = TypeVar("T")


@dataclass(frozen=True)
class LoopConfig:
    """Per-rollout limits (the turn limit is the episode's: `EpisodeConfig.max_turns`).
    `max_concurrency`: trajectories in flight at once; `search_timeout_s`: a search's limit
    (None: none). Token budgets: `max_new_tokens` a turn, `max_response_tokens` the response
    (model and env tokens), `max_completion_tokens` the model's tokens of an episode (None: no
    bound of its own); `repetition_stop` > 0 ends an episode whose turn falls into a loop of
    that many tokens (`repetition.ends_in_loop`; 0: never)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    max_response_tokens: int = 384
    chat_template: bool = False  # prompt = the tokenizer's chat template over one user message
    top_k: int = -1
    max_concurrency: int = 256
    search_timeout_s: float | None = None
    max_completion_tokens: int | None = None
    repetition_stop: int = 0


def prompt_ids(tokenizer: Any, prompt: str, *, chat_template: bool = False) -> list[int]:
    """Token ids of an episode's prompt, optionally as a user turn of the tokenizer's chat
    template followed by the assistant's generation prompt."""
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("model.chat_template is set but the tokenizer has no chat template")
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return list(tokenizer.encode(prompt, add_special_tokens=False))


def turn_seed(base: int, index: int, turn: int) -> int:
    """The sampling seed of trajectory `index`'s turn `turn` in a run seeded with `base`
    (reproducible after a resume, distinct across the identical prompts of a group)."""
    digest = hashlib.blake2b(f"{base}:{index}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


# ---- what generates the turns ------------------------------------------------------------------
def finish_of(ids: Sequence[int], text: str, sampling: SamplingConfig, stop_ids: Any) -> str:
    """How a turn that a server returned without a finish reason ended: "stop" when its text ends
    with a stop string, "eos" when its last token ends a turn like EOS (or it is empty), "length"
    when it filled `sampling.max_new_tokens`; any other ending is the server's own, read as EOS."""
    if any(text.endswith(s) for s in sampling.stop):
        return "stop"
    if not ids or ids[-1] in stop_ids:
        return "eos"
    return "length" if len(ids) >= sampling.max_new_tokens else "eos"


@dataclass
class Turn:
    """One sampled turn: `ids`/`logprobs` enter the trajectory as model tokens (mask 1); `text`
    is what the env reads; `finish` is "stop", "eos" or "length"; `completion_tokens` counts
    against the response budget."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish: str
    completion_tokens: int
    prompt_tokens: int = 0
    logprobs_source: str = "sampler"
    version: int = 0  # the policy version that sampled it (`Completion.version`)


@dataclass
class Conversation:
    """One trajectory's context as its source keeps it: token ids, or the text turns."""

    prompt: str
    ids: list[int] = field(default_factory=list)
    turns: list[tuple[str, str]] = field(default_factory=list)  # (agent turn, observation)


class TurnSource(Protocol):
    """Generates the turns of concurrent trajectories (a token engine or a text endpoint)."""

    def start(self, prompt: str) -> tuple[list[int], Conversation]:
        """The prompt's token ids (the trajectory's `prompt_ids`) and a fresh conversation."""
        ...

    async def turn(self, conv: Conversation, sampling: SamplingConfig) -> Turn: ...

    def observe(self, conv: Conversation, turn: Turn, observation: str) -> list[int]:
        """Append the agent's turn and the env's observation; the observation's token ids."""
        ...

    def close(self) -> None: ...


class TokenTurns:
    """A rollout engine's asynchronous session: token-exact turns over the context's ids."""

    def __init__(
        self,
        session: AsyncGenerate,
        tokenizer: Any,
        *,
        chat_template: bool,
        stop_ids: Any,
        tokenize_prompt: Callable[[str], list[int]] | None = None,
    ) -> None:
        """`tokenize_prompt`: the prompt's ids where the caller builds them its own way (verl's
        chat template over the sample's messages); default `prompt_ids`."""
        self.session, self.tokenizer, self.chat_template = session, tokenizer, chat_template
        self.stop_ids = set(stop_ids)
        self.tokenize_prompt = tokenize_prompt

    def start(self, prompt: str) -> tuple[list[int], Conversation]:
        if self.tokenize_prompt is not None:
            ids = list(self.tokenize_prompt(prompt))
        else:
            ids = prompt_ids(self.tokenizer, prompt, chat_template=self.chat_template)
        return ids, Conversation(prompt, list(ids))

    async def turn(self, conv: Conversation, sampling: SamplingConfig) -> Turn:
        comp = await self.session.generate(conv.ids, sampling)
        ids = list(comp.token_ids)
        conv.ids.extend(ids)
        text = self.tokenizer.decode([t for t in ids if t not in self.stop_ids], skip_special_tokens=False)
        return Turn(ids, list(comp.logprobs), str(text), comp.finish_reason, len(ids), version=comp.version)

    def observe(self, conv: Conversation, turn: Turn, observation: str) -> list[int]:
        ids = list(self.tokenizer.encode(observation, add_special_tokens=False))
        conv.ids.extend(ids)
        return ids

    def close(self) -> None:
        self.session.close()


def engine_turns(engine: RolloutEngine, tokenizer: Any, loop: LoopConfig) -> Callable[[Executor], TokenTurns]:
    """A factory of `engine`'s turn source for one run (its session lives in the run's loop)."""
    stop_ids = getattr(engine, "stop_ids", None) or stop_token_ids(tokenizer)
    return lambda executor: TokenTurns(
        engine.async_session(executor), tokenizer, chat_template=loop.chat_template, stop_ids=stop_ids
    )


# ---- the driver --------------------------------------------------------------------------------
def _finish(traj: Trajectory, info: dict[str, Any], reward: float, reason: str) -> None:
    traj.info = dict(info)
    traj.reward = float(reward)
    traj.reward_components = dict(info.get("reward_components", {}))
    traj.prediction = info.get("prediction")
    traj.accuracy = float(info.get("metrics", {}).get("em", 0.0))
    traj.format_ok = bool(info.get("format_ok", False))
    traj.num_tool_calls = int(info.get("num_searches", traj.num_tool_calls))
    traj.finish_reason = reason


async def _search(searches: SearchBatcher, query: str, timeout: float | None) -> Any:
    """The query's passages: in the tick's batched call, then, if that call does not answer within
    `timeout` (another query of the batch may be the stuck one), in a call of its own; TimeoutError
    when that does not answer in time either."""
    try:
        return await asyncio.wait_for(searches.search(query), timeout)
    except TimeoutError:
        return await asyncio.wait_for(searches.search_alone(query), timeout)


async def run_episode(
    index: int,
    example: QAExample,
    source: TurnSource,
    searches: SearchBatcher,
    episode_config: EpisodeConfig,
    reward_fn: Any,
    loop: LoopConfig,
    seed: int,
    on_start: Callable[[Trajectory], None] | None = None,
) -> Trajectory:
    """One trajectory of `example`, its turns sampled by `source` with the seeds of trajectory
    `index` (see the module doc for the ending rules). Every caller runs its episodes here: the
    trainer's rollouts and `pvpo eval` through `run_episodes_async`, the TRL and verl adapters
    directly or through `run_agent_loop`. `on_start(trajectory)` gets the trajectory as it starts,
    to watch it grow turn by turn (a progress meter)."""
    protocol = episode_config.tag_protocol
    ep = Episode(example, episode_config, reward_fn)
    ids, conv = source.start(ep.prompt)
    traj = Trajectory(uid=example.uid, prompt_ids=ids)
    if on_start is not None:
        on_start(traj)

    def end(reason: str, text: str = "") -> Trajectory:
        res = ep.end(text)
        _finish(traj, res.info, res.reward, reason)
        return traj

    for turn in range(episode_config.max_turns):
        room = loop.max_response_tokens - traj.completion_tokens - traj.loss_mask.count(0)
        if loop.max_completion_tokens is not None:
            room = min(room, loop.max_completion_tokens - traj.completion_tokens)
            if room <= 0:
                return end("budget")  # the last turn used the model's whole budget
        sampling = SamplingConfig(
            temperature=loop.temperature,
            top_p=loop.top_p,
            top_k=loop.top_k,
            stop=tuple(protocol.stop_strings),
            max_new_tokens=max(1, min(loop.max_new_tokens, room)),
            seed=turn_seed(seed, index, turn),
            repetition_stop=loop.repetition_stop,
        )
        out = await source.turn(conv, sampling)
        if turn == 0:
            traj.prompt_tokens = out.prompt_tokens or len(traj.prompt_ids)
        traj.append_model(out.ids, out.logprobs, out.logprobs_source, version=out.version)
        traj.completion_tokens += out.completion_tokens
        traj.num_turns += 1
        traj.response_text += out.text
        # an engine without the stop of its own runs a loop to the turn's end: the same ending
        if out.finish == "repetition" or (out.finish == "length" and ends_in_loop(out.ids, loop.repetition_stop)):
            return end("repetition", out.text)
        if out.finish == "length" and out.completion_tokens >= room:  # the budget ran out inside the turn
            return end("budget", out.text)
        if out.finish == "eos" and protocol.parse_action(out.text).kind is not ActionKind.ANSWER:
            return end("eos", out.text)
        query = ep.begin_step(out.text)
        passages = None
        if query is not None:
            try:
                passages = await _search(searches, query, loop.search_timeout_s)
            except TimeoutError:
                return end("search_timeout")
        res = ep.finish_step(passages)
        traj.num_tool_calls = int(res.info.get("num_searches", 0))
        if res.terminated or res.truncated:
            _finish(traj, res.info, res.reward, "answer" if res.terminated else "max_turns")
            return traj
        obs_ids = source.observe(conv, out, res.observation)
        if len(traj.response_ids) + len(obs_ids) >= loop.max_response_tokens:
            return end("budget")  # the episode's response already holds this observation
        traj.append_env(obs_ids)
        traj.response_text += res.observation
    return end("max_turns")  # not reached: the episode truncates at its last turn


async def run_episodes_async(
    make_source: Callable[[Executor], TurnSource],
    examples: Sequence[QAExample],
    searcher: Searcher,
    episode_config: EpisodeConfig,
    loop: LoopConfig,
    *,
    seed: int,
    executor: Executor | None = None,
    indices: Sequence[int] | None = None,
    on_done: Callable[[int, Trajectory], None] | None = None,
    on_start: Callable[[int, Trajectory], None] | None = None,
) -> list[Trajectory]:
    """One trajectory per example, in order, each its own task (at most `loop.max_concurrency`
    at once). Blocking work (engine calls, retriever calls) runs in `executor`'s threads, except
    vLLM's engine steps, which run in the event loop's thread (`vllm_engine._StepScheduler`).
    `indices`: the index each example samples with (`turn_seed`; default its position), so a
    subset of a dataset samples as it would within the whole; `on_done(i, trajectory)` is called
    as the i-th example's trajectory ends, before the others have (e.g. to save it), and
    `on_start(i, trajectory)` as it starts (the same object, growing turn by turn)."""
    own = executor is None
    # One engine thread: torch's OpenMP pool is per calling thread, and two engine threads taking
    # turns kept two pools spinning on the same cores (6 questions of `pvpo eval`: 0.49x -> 1.03x).
    # (at the torch thread count of the thread that runs this loop, not the process default)
    pool = executor or ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="pvpo-rollout", initializer=carry_torch_threads()
    )
    # searches get threads of their own: a stuck one never holds up an engine step
    search_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pvpo-search")
    source = make_source(pool)
    searches = SearchBatcher(searcher, episode_config.topk, search_pool)
    reward_fn = episode_config.reward_fn()
    gate = asyncio.Semaphore(max(1, loop.max_concurrency))

    where = list(range(len(examples))) if indices is None else list(indices)
    if len(where) != len(examples):
        raise ValueError(f"{len(where)} indices for {len(examples)} examples")

    async def one(i: int, ex: QAExample) -> Trajectory:
        async with gate:
            started = None if on_start is None else (lambda t: on_start(i, t))
            traj = await run_episode(where[i], ex, source, searches, episode_config, reward_fn, loop, seed, started)
        if on_done is not None:
            on_done(i, traj)
        return traj

    try:
        return list(await asyncio.gather(*(one(i, ex) for i, ex in enumerate(examples))))
    finally:
        source.close()
        search_pool.shutdown(wait=False, cancel_futures=True)  # a stuck search's thread ends on its own
        if own:
            pool.shutdown(wait=False, cancel_futures=True)


def run_fresh(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(make())`, with the event loop built while Ctrl-C is held: a KeyboardInterrupt
    inside the loop's constructor left a half-built loop whose finalizer printed an "Exception
    ignored ... no attribute '_ssock'" traceback as the process ended (CI, one run of a 40-SIGINT
    storm during `pvpo train`). The run and its clean-up (tasks cancelled, async generators and the
    default executor shut, the loop closed, as `asyncio.run` does) are not held: they join threads.
    (`asyncio.Runner(loop_factory=...)` would do it from Python 3.11; we support 3.10.)"""
    with hold_signals():
        event_loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(event_loop)
        return event_loop.run_until_complete(make())
    finally:
        try:
            tasks = asyncio.all_tasks(event_loop)
            for task in tasks:
                task.cancel()
            try:
                if tasks:
                    event_loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            finally:
                # A KeyboardInterrupt (Ctrl-C, SIGTERM's `Stopped`) raised in a task while it is
                # cancelled leaves the loop before gather reads it: read here, it propagates once,
                # instead of asyncio also logging "Task exception was never retrieved" with its
                # traceback after the command's one-line stop (1 SIGTERM in 6, bench/faults/run.py).
                for task in tasks:
                    if task.done() and not task.cancelled():
                        task.exception()
            event_loop.run_until_complete(event_loop.shutdown_asyncgens())
            event_loop.run_until_complete(event_loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            event_loop.close()


def run_episodes(
    make_source: Callable[[Executor], TurnSource],
    examples: Sequence[QAExample],
    searcher: Searcher,
    episode_config: EpisodeConfig,
    loop: LoopConfig,
    *,
    seed: int,
    indices: Sequence[int] | None = None,
    on_done: Callable[[int, Trajectory], None] | None = None,
    on_start: Callable[[int, Trajectory], None] | None = None,
) -> list[Trajectory]:
    """`run_episodes_async` from synchronous code (in a fresh event loop; in a helper thread when
    the caller already runs one)."""
    if not examples:
        return []

    def go() -> list[Trajectory]:
        return run_fresh(
            lambda: run_episodes_async(
                make_source,
                examples,
                searcher,
                episode_config,
                loop,
                seed=seed,
                indices=indices,
                on_done=on_done,
                on_start=on_start,
            )
        )

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return go()
    with ThreadPoolExecutor(max_workers=1, initializer=carry_torch_threads()) as helper:
        return helper.submit(go).result()


def run_agent_loop(
    engine: RolloutEngine,
    tokenizer: Any,
    examples: Sequence[QAExample],
    searcher: Searcher,
    episode_config: EpisodeConfig,
    loop: LoopConfig,
    *,
    seed: int,
    indices: Sequence[int] | None = None,
    on_done: Callable[[int, Trajectory], None] | None = None,
    on_start: Callable[[int, Trajectory], None] | None = None,
) -> list[Trajectory]:
    """One token-exact trajectory per example (repeat an example n times for a group of n), in
    order, sampled by `engine` (`indices`, `on_done`, `on_start`: see `run_episodes_async`)."""
    return run_episodes(
        engine_turns(engine, tokenizer, loop),
        examples,
        searcher,
        episode_config,
        loop,
        seed=seed,
        indices=indices,
        on_done=on_done,
        on_start=on_start,
    )
