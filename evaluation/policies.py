"""The policies `pvpo eval` runs: a local model through a token engine and the token-exact agent
loop (`TokenPolicy`), or an OpenAI-compatible endpoint with the same loop run on text, client side
(`OpenAIPolicy`).

`OpenAIPolicy`: each turn the conversation so far is sent with the protocol's stop strings
(`</search>`, `</answer>`); the returned text, with its stop string put back (OpenAI servers strip
it; vLLM also says which one matched in `stop_reason`), is the agent's turn; a `SearchVectorEnv`
steps the batch (one retriever call for all its searches) and the observation is appended. Two APIs:

- `completions`: the prompt is plain text, prompt + response so far (for a local checkpoint
  served by vLLM this is the token loop's context as text; there is no chat template);
- `chat`: the question is the user message, each agent turn an assistant message and each
  observation a user message (any chat endpoint, e.g. a hosted model).

Token counts come from the server's `usage`; the response budget counts model tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import info_at
from pvpo.evaluation.run import EvalError, EvalSettings, Outcome, search_queries
from pvpo.model_catalog import resolve_model_path
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind, TagProtocol
from pvpo.trainer.rollout.openai_client import APIS, OpenAIClient, TurnResult, restore_stop


class TokenPolicy:
    """A local model through a rollout engine (`hf` or `vllm`) and the token-exact agent loop."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Searcher,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
    ) -> list[Outcome]:
        from pvpo.trainer.rollout.agent_loop import run_agent_loop

        loop = settings.loop(self.tokenizer)
        trajs = run_agent_loop(self.engine, self.tokenizer, examples, searcher, episode, loop, seed=seed)
        protocol: TagProtocol = episode.protocol  # type: ignore[assignment]
        # Prediction and format are the env's (it judges the response without its correction
        # messages, as in training).
        return [
            Outcome(
                prompt=self.tokenizer.decode(t.prompt_ids, skip_special_tokens=False),
                response=t.response_text,
                prediction=t.prediction,
                format_ok=bool(t.reward_components.get("format", 0.0)),
                num_searches=t.num_tool_calls,
                num_turns=t.num_turns,
                prompt_tokens=len(t.prompt_ids),
                completion_tokens=t.num_model_tokens,
                stop_reason=t.finish_reason,
                queries=search_queries(t.response_text, protocol, t.num_tool_calls),
            )
            for t in trajs
        ]


def token_policy(
    model: str | Path,
    engine: str = "hf",
    *,
    dtype: str = "auto",
    device: str | None = None,
    batch_size: int = 32,
    engine_options: Mapping[str, Any] | None = None,
) -> TokenPolicy:
    """A local HF folder (ours or any published checkpoint) behind the `hf` or `vllm` engine.
    `dtype="auto"`: bfloat16 on CUDA, float32 on CPU."""
    import torch

    from pvpo.trainer.rollout.engine import build_engine

    model = resolve_model_path(str(model))  # a catalog name or *.gguf file: its converted folder
    if not Path(model).exists():
        raise EvalError(f"--model {model}: no such folder (a local HF model directory)")
    if engine not in ("hf", "vllm"):
        raise EvalError(f"unknown engine {engine!r}; known: ['hf', 'vllm', 'openai']")
    cuda = torch.cuda.is_available()
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    if engine == "vllm":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
        return TokenPolicy(build_engine("vllm", model=str(model), dtype=dtype, **dict(engine_options or {})), tokenizer)
    from pvpo.trainer.model.policy import load_policy

    policy = load_policy(model, dtype=dtype)
    target = device or ("cuda" if cuda else "cpu")
    module: torch.nn.Module = policy.model
    module.to(target)
    eng = build_engine(
        "hf", model=policy.model, tokenizer=policy.tokenizer, micro_batch_size=batch_size, **dict(engine_options or {})
    )
    return TokenPolicy(eng, policy.tokenizer)


class OpenAIPolicy:
    """An `EvalPolicy` (see `pvpo.evaluation.run`) over an OpenAI-compatible endpoint."""

    def __init__(self, client: OpenAIClient, *, api: str = "completions", concurrency: int = 16) -> None:
        if api not in APIS:
            raise ValueError(f"unknown api {api!r}; known: {list(APIS)}")
        self.client, self.api, self.concurrency = client, api, concurrency

    def _turn(
        self,
        prompt: str,
        turns: list[tuple[str, str]],
        protocol: TagProtocol,
        settings: EvalSettings,
        max_tokens: int,
        seed: int,
    ) -> TurnResult:
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "stop": list(protocol.stop_strings),
        }
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

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Searcher,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
    ) -> list[Outcome]:
        """The agent loop of `pvpo.trainer.rollout.agent_loop.run_agent_loop`, on text: the same env,
        turn limits and endings (answer, max turns, EOS without an answer, token budget)."""
        from pvpo.trainer.rollout.agent_loop import vector_env

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
                    futures = {
                        i: pool.submit(
                            self._turn,
                            prompts[i],
                            turns[i],
                            protocol,
                            settings,
                            max(1, min(settings.max_new_tokens, room[i])),
                            (seed + i) * 1_000_003 + turn * 7919,
                        )
                        for i in active
                    }
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
                outcomes.append(
                    Outcome(
                        prompt=prompts[i],
                        response=response,
                        prediction=final[i].get("prediction"),
                        format_ok=bool(final[i].get("format_ok", False)),
                        num_searches=searches[i],
                        num_turns=len(turns[i]),
                        prompt_tokens=first_prompt_tokens[i],
                        completion_tokens=used[i],
                        stop_reason=stop[i],
                        queries=search_queries(response, protocol, searches[i]),
                    )
                )
            return outcomes
        finally:
            env.close()
