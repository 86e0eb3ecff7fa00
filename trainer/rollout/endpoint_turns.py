"""The agent loop's turns from an OpenAI-compatible endpoint (evaluation of a served or hosted
model, GT trajectories from a larger model): text turns, client side, at most `concurrency`
requests in flight.

Each turn sends the conversation so far with the protocol's stop strings (`</search>`,
`</answer>`); the returned text, with the stop string the server stripped put back
(`restore_stop`), is the agent's turn. Two APIs: `completions` (the prompt is plain text, prompt +
response so far: for a checkpoint served by vLLM, the token loop's context as text) and `chat`
(the question is the user message, each agent turn an assistant message, each observation a user
message). Token counts come from the server's `usage`; the response budget counts model tokens.

With a `tokenizer` (the policy's), turns and observations are tokenized into the trajectory; with
`logprobs`, the endpoint is asked for the log-prob of each token it sampled (OpenAI's `logprobs`,
which vLLM's server returns) and they become the turn's log-probs when the endpoint's tokens
are the policy's tokenizer's, string for string at the same places (same tokenizer family), turn by turn;
otherwise that turn's log-probs are 0.0 placeholders with source "" (`Trajectory.model_turns`), which
the GT cache replaces with the reference policy's (`pvpo.trainer.reference.gt_cache.set_pi_gt`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pvpo.retriever.client import clean_text
from pvpo.reward import TagProtocol
from pvpo.trainer.rollout.agent_loop import Conversation, Turn
from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.openai_client import APIS, OpenAIClient, restore_stop


def _endpoint_logprobs(choice: dict[str, Any], api: str) -> tuple[list[str], list[float]] | None:
    """The (token strings, log-probs) the endpoint reported for the sampled tokens, or None."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if api == "chat":
        content = lp.get("content")
        if not isinstance(content, list):
            return None
        return [str(c.get("token", "")) for c in content], [float(c.get("logprob", 0.0)) for c in content]
    tokens, values = lp.get("tokens"), lp.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return None
    return [str(t) for t in tokens], [float(v or 0.0) for v in values]


class EndpointTurns:
    """A turn source over `client` (see the module docstring)."""

    def __init__(
        self,
        client: OpenAIClient,
        protocol: TagProtocol,
        *,
        api: str = "completions",
        tokenizer: Any = None,
        chat_template: bool = False,
        logprobs: bool = False,
        concurrency: int = 16,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"unknown api {api!r}; known: {list(APIS)}")
        self.client, self.protocol, self.api = client, protocol, api
        self.tokenizer, self.chat_template, self.logprobs = tokenizer, chat_template, logprobs
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="pvpo-endpoint")

    def start(self, prompt: str) -> tuple[list[int], Conversation]:
        from pvpo.trainer.rollout.agent_loop import prompt_ids

        ids = prompt_ids(self.tokenizer, prompt, chat_template=self.chat_template) if self.tokenizer else []
        return ids, Conversation(prompt)

    def _body(self, conv: Conversation, sampling: SamplingConfig) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(self.protocol.stop_strings),
        }
        if sampling.temperature > 0 and sampling.seed is not None:
            params["seed"] = sampling.seed
        if sampling.top_k > 0:
            params["top_k"] = sampling.top_k  # vLLM / SGLang extension
        if self.api == "completions":
            if self.logprobs:
                params["logprobs"] = 1
            return "completions", {"prompt": conv.prompt + "".join(t + o for t, o in conv.turns), **params}
        if self.logprobs:
            params["logprobs"] = True
        messages = [{"role": "user", "content": conv.prompt}]
        for t, o in conv.turns:
            messages += [{"role": "assistant", "content": t}, {"role": "user", "content": o}]
        return "chat/completions", {"messages": messages, **params}

    async def turn(self, conv: Conversation, sampling: SamplingConfig) -> Turn:
        path, body = self._body(conv, sampling)
        data = await asyncio.get_running_loop().run_in_executor(self.pool, self.client.post, path, body)
        choice = data["choices"][0]
        raw = (choice.get("text") if self.api == "completions" else (choice.get("message") or {}).get("content")) or ""
        raw = clean_text(raw)  # a lone surrogate (JSON's "\\ud800") as U+FFFD: the next turn's request must encode
        text, finish = restore_stop(raw, choice.get("finish_reason"), choice.get("stop_reason"), self.protocol)
        usage = data.get("usage") or {}
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else []
        lps, source = [0.0] * len(ids), ""
        reported = _endpoint_logprobs(choice, self.api) if self.logprobs else None
        if reported is not None and self.tokenizer is not None:
            tokens, values = reported
            pieces = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            # token by token: the same strings at the same places (the joined text and the count can
            # agree while the boundaries do not, and a log-prob would then label another token); the
            # stop string the server stripped may or may not be among its reported tokens
            n = len(ids)
            if len(values) >= n and pieces == tokens[:n]:
                lps, source = values[:n], "endpoint"
        completion = int(usage.get("completion_tokens", 0)) or len(ids)
        return Turn(ids, lps, text, finish, completion, int(usage.get("prompt_tokens", 0)), source)

    def observe(self, conv: Conversation, turn: Turn, observation: str) -> list[int]:
        conv.turns.append((turn.text, observation))
        return list(self.tokenizer.encode(observation, add_special_tokens=False)) if self.tokenizer else []

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
