"""A policy behind any OpenAI-compatible endpoint (vLLM / SGLang `serve`, OpenAI, ...), evaluated
with the multi-turn search loop running on the client.

Each turn the conversation so far is sent with the protocol's stop strings (`</search>`,
`</answer>`); the returned text, with its stop string put back (OpenAI servers strip it; vLLM
also says which one matched in `stop_reason`), is the agent's turn; a `SearchVectorEnv` steps
the batch (one retriever call for all its searches) and the observation is appended. Two APIs:

- `completions`: the prompt is plain text, prompt + response so far (for a local checkpoint
  served by vLLM this is the token loop's context as text; there is no chat template);
- `chat`: the question is the user message, each agent turn an assistant message and each
  observation a user message (any chat endpoint, e.g. a hosted model).

The endpoint returns text, not token ids, so this is an evaluation path, not a training one.
Token counts come from the server's `usage`; the response budget counts model tokens only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import info_at
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind, TagProtocol
from pvpo.trainer.eval_run import EvalSettings, Outcome, search_queries

APIS = ("completions", "chat")
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIError(RuntimeError):
    """The endpoint refused a request (or kept failing after the retries)."""


class OpenAIClient:
    """POSTs to `<base_url>/completions` or `/chat/completions` with retries (exponential backoff
    with jitter on connection errors, timeouts, 408/409/429/5xx); other errors raise at once with
    the server's message. Thread-safe (one httpx.Client)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0,
                 retries: int = 4, backoff: float = 0.5) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)
        self.requests = 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{path.lstrip('/')}"
        body = {"model": self.model, **body}
        err: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1) * (1 + random.random()))
            self.requests += 1
            try:
                r = self.http.post(url, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                err = f"{type(e).__name__}: {e}"
                continue
            if r.status_code == 200:
                return r.json()
            err = f"HTTP {r.status_code}: {r.text[:300]}"
            if r.status_code not in RETRY_STATUS:
                break
        raise OpenAIError(f"{url} failed after {attempt + 1} attempt(s): {err}")

    def close(self) -> None:
        self.http.close()


@dataclass
class TurnResult:
    text: str  # stop string restored
    finish: str  # "stop" (a stop string), "eos", "length"
    prompt_tokens: int
    completion_tokens: int


def restore_stop(text: str, finish_reason: str | None, stop_reason: Any, protocol: TagProtocol) -> tuple[str, str]:
    """The turn's text with the stop string the server stripped put back, and why it ended.

    `finish_reason == "length"` -> the token limit. `"stop"`: vLLM names the matched string in
    `stop_reason`; other servers do not, so the stop was the closing tag of the last block the
    turn opened and left open (`<search>` or `<answer>`); with no open block it was EOS."""
    if finish_reason == "length":
        return text, "length"
    stops = protocol.stop_strings
    if isinstance(stop_reason, str) and stop_reason in stops:
        return (text if text.endswith(stop_reason) else text + stop_reason), "stop"
    if any(text.endswith(s) for s in stops):
        return text, "stop"
    best, best_pos = None, -1
    for tag in (protocol.search, protocol.answer):
        pos = text.rfind(protocol.open_tag(tag))
        if pos > best_pos and text.find(protocol.close_tag(tag), pos) == -1:
            best, best_pos = tag, pos
    if best is not None:
        return text + protocol.close_tag(best), "stop"
    return text, "eos"


class OpenAIPolicy:
    """An `EvalPolicy` (see `pvpo.trainer.eval_run`) over an OpenAI-compatible endpoint."""

    def __init__(self, client: OpenAIClient, *, api: str = "completions", concurrency: int = 16) -> None:
        if api not in APIS:
            raise ValueError(f"unknown api {api!r}; known: {list(APIS)}")
        self.client, self.api, self.concurrency = client, api, concurrency

    def _turn(self, prompt: str, turns: list[tuple[str, str]], protocol: TagProtocol, settings: EvalSettings,
              max_tokens: int, seed: int) -> TurnResult:  # fmt: skip
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
                                  "stop": list(protocol.stop_strings)}  # fmt: skip
        if settings.temperature > 0:
            params["seed"] = seed
        if settings.top_k > 0:
            params["top_k"] = settings.top_k  # vLLM / SGLang extension
        if self.api == "completions":
            text = prompt + "".join(t + o for t, o in turns)
            data = self.client.post("completions", {"prompt": text, **params})
            choice = data["choices"][0]
            raw = choice.get("text") or ""
        else:
            messages = [{"role": "user", "content": prompt}]
            for t, o in turns:
                messages += [{"role": "assistant", "content": t}, {"role": "user", "content": o}]
            data = self.client.post("chat/completions", {"messages": messages, **params})
            choice = data["choices"][0]
            raw = (choice.get("message") or {}).get("content") or ""
        text, finish = restore_stop(raw, choice.get("finish_reason"), choice.get("stop_reason"), protocol)
        usage = data.get("usage") or {}
        return TurnResult(text, finish, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))

    def rollout(self, examples: Sequence[QAExample], searcher: Searcher, episode: EpisodeConfig,
                settings: EvalSettings, *, seed: int) -> list[Outcome]:  # fmt: skip
        """The agent loop of `pvpo.trainer.agent_loop.run_agent_loop`, on text: the same env,
        turn limits and endings (answer, max turns, EOS without an answer, token budget)."""
        from pvpo.trainer.agent_loop import vector_env

        if not examples:
            return []
        protocol: TagProtocol = episode.protocol  # type: ignore[assignment]
        env = vector_env(searcher, episode, len(examples))
        n = len(examples)
        try:
            prompts, _ = env.reset(options={"questions": list(examples)})
            turns: list[list[tuple[str, str]]] = [[] for _ in range(n)]  # (agent turn, observation)
            used = [0] * n
            first_prompt_tokens = [0] * n
            stop = [""] * n
            searches = [0] * n
            final: list[dict[str, Any]] = [{} for _ in range(n)]  # the env's verdict when each ended
            active = list(range(n))
            pool = ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, n)))
            try:
                for turn in range(settings.max_turns):
                    if not active:
                        break
                    room = {i: settings.max_response_tokens - used[i] for i in active}
                    futures = {i: pool.submit(self._turn, prompts[i], turns[i], protocol, settings,
                                              max(1, min(settings.max_new_tokens, room[i])),
                                              (seed + i) * 1_000_003 + turn * 7919)
                               for i in active}  # fmt: skip
                    results = {i: f.result() for i, f in futures.items()}
                    actions = [""] * n
                    stepped = []
                    for i in active:
                        r = results[i]
                        if turn == 0:
                            first_prompt_tokens[i] = r.prompt_tokens
                        used[i] += r.completion_tokens
                        if r.finish == "length" and used[i] >= settings.max_response_tokens:
                            turns[i].append((r.text, ""))
                            final[i] = env.finish(i, r.text)[1]
                            stop[i] = "budget"
                        elif r.finish == "eos" and protocol.parse_action(r.text).kind is not ActionKind.ANSWER:
                            turns[i].append((r.text, ""))
                            final[i] = env.finish(i, r.text)[1]
                            stop[i] = "eos"
                        else:
                            actions[i] = r.text
                            stepped.append(i)
                    obs, _, terminated, truncated, infos = env.step(actions)
                    active = []
                    for i in stepped:
                        info = info_at(infos, i)
                        searches[i] = int(info.get("num_searches", 0))
                        if terminated[i] or truncated[i]:
                            final[i] = info
                            turns[i].append((actions[i], ""))
                            stop[i] = "answer" if terminated[i] else "max_turns"
                            continue
                        turns[i].append((actions[i], obs[i]))
                        active.append(i)
                for i in active:  # only when settings.max_turns < the episode's max_turns
                    final[i] = env.finish(i, "")[1]
                    stop[i] = "max_turns"
            finally:
                pool.shutdown(wait=True)
            outcomes = []
            for i in range(n):
                response = "".join(t + o for t, o in turns[i])
                outcomes.append(Outcome(
                    prompt=prompts[i], response=response, prediction=final[i].get("prediction"),
                    format_ok=bool(final[i].get("format_ok", False)), num_searches=searches[i],
                    num_turns=len(turns[i]), prompt_tokens=first_prompt_tokens[i],
                    completion_tokens=used[i], stop_reason=stop[i],
                    queries=search_queries(response, protocol, searches[i]),
                ))  # fmt: skip
            return outcomes
        finally:
            env.close()
