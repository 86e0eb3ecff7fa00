"""`pvpo_search`: our search episode as a verl agent loop (`AgentLoopBase`), token-in/token-out.

The tag protocol, as Search-R1 trains: one assistant turn that the model writes in pieces. Each
piece is generated until a stop string (`</search>`, `</answer>`) or EOS; the episode
(`pvpo.envs.Episode`: the same turn budget, retriever call, passage rendering and reward as
`pvpo/SearchQA-v0`) reads it; a search's result block (or the correction message) is tokenized
and appended with `response_mask` 0. Model tokens are kept exactly as the server produced them
(never decoded and re-tokenized). The trajectory's `reward_score` is the episode's reward minus
the prompt's anchor when `anchors` is set (see `pvpo.integrations.verl.reward` for why the anchor
is subtracted here), so verl's reward loop is skipped for these trajectories.

Configured through verl's agent-loop config (`agent_loop.yaml`: every key besides `name` and
`_target_` is a keyword argument here), and registered as `pvpo_search` when this module is
imported. Stop strings go to the server as vLLM sampling parameters (`stop`,
`include_stop_str_in_output`), verl's default rollout backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

from pvpo.integrations.verl.requirement import verl_missing

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
except ModuleNotFoundError as err:
    raise verl_missing(err, __name__) from err

from pvpo.envs import EpisodeConfig, QAExample
from pvpo.envs.episode import Episode, StepResult
from pvpo.integrations.reference import anchor_for
from pvpo.integrations.verl.clients import shared_client
from pvpo.integrations.verl.data import AGENT_LOOP
from pvpo.integrations.verl.reward import anchors_from, golds_of
from pvpo.reward import ActionKind, TagProtocol


def example_from_row(row: Mapping[str, Any]) -> QAExample:
    """The question of a verl sample: uid and question from `extra_info` (as `verl_rows` writes
    them; the question falls back to the last user message), golds from `reward_model`."""
    extra = row.get("extra_info") or {}
    question = extra.get("question")
    if question is None:
        users = [m for m in row.get("raw_prompt", ()) if m.get("role") == "user"]
        question = users[-1]["content"] if users else ""
    uid = extra.get("uid", f"{row.get('data_source', 'verl')}-{extra.get('index', row.get('index', 0))}")
    golds = golds_of((row.get("reward_model") or {}).get("ground_truth"))
    return QAExample(str(uid), str(question), tuple(golds))


@register(AGENT_LOOP)
class PVPOSearchAgentLoop(AgentLoopBase):
    """verl agent loop over our search episode. Keyword arguments (from the agent-loop config):
    `retriever_url` (default $PVPO_RETRIEVER_URL), `protocol`, `reward`, `reward_params`,
    `max_turns`, `topk`, `max_obs_chars` (as `pvpo/SearchQA-v0`), `anchors` (an anchor file of
    a `pvpo train` run, or a mapping uid -> value) and `timeout` for the retriever."""

    def __init__(
        self,
        *args: Any,
        retriever_url: str | Sequence[str] | None = None,
        protocol: str | TagProtocol = "search_r1",
        reward: str = "pvpo",
        reward_params: Mapping[str, Any] | None = None,
        max_turns: int = 6,
        topk: int = 3,
        max_obs_chars: int | None = 2000,
        anchors: str | Path | Mapping[str, float] | None = None,
        timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.episode_config = EpisodeConfig(protocol, reward, dict(reward_params or {}), max_turns, topk, max_obs_chars)
        self.reward_fn = self.episode_config.reward_fn()
        self.retriever = shared_client(retriever_url, topk=topk, timeout=timeout)
        self.anchors = anchors_from(anchors)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        example = example_from_row(kwargs)
        anchor = anchor_for(example.uid, self.anchors) if self.anchors is not None else None
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        episode = Episode(example, self.episode_config, self.reward_fn)
        protocol = self.episode_config.tag_protocol
        params = {**sampling_params, "stop": list(protocol.stop_strings), "include_stop_str_in_output": True}
        tokenizer: Any = self.tokenizer  # a PreTrainedTokenizer (verl annotates it as AutoTokenizer)
        eos = {tokenizer.eos_token_id} - {None}
        request_id = uuid4().hex  # one sticky session per trajectory (the server reuses its prefix cache)
        response_ids: list[int] = []
        response_mask: list[int] = []
        logprobs: list[float] = []
        have_logprobs = bool(sampling_params.get("logprobs"))
        generate_s = search_s = 0.0
        result: StepResult | None = None
        while result is None or not episode.done:
            budget = self.response_length - len(response_ids)
            if budget <= 0:
                result = episode.end()
                break
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=request_id,
                prompt_ids=prompt_ids + response_ids,
                sampling_params={**params, "max_tokens": budget},
            )
            generate_s += time.perf_counter() - t0
            ids = list(out.token_ids)
            response_ids += ids
            response_mask += [1] * len(ids)
            logprobs += list(out.log_probs) if have_logprobs and out.log_probs else [0.0] * len(ids)
            text = tokenizer.decode(ids, skip_special_tokens=True)
            stopped_short = not ids or ids[-1] in eos or len(ids) >= budget
            if stopped_short and protocol.parse_action(text).kind is ActionKind.INVALID:
                result = episode.end(text)  # EOS or out of tokens without an action: scored as it stands
                break
            query = episode.begin_step(text)
            t0 = time.perf_counter()
            passages = (
                (await asyncio.to_thread(self.retriever.search, [query], self.episode_config.topk))[0]
                if query is not None
                else None
            )
            search_s += time.perf_counter() - t0
            result = episode.finish_step(passages)
            if result.observation and not episode.done:
                obs = tokenizer.encode(result.observation, add_special_tokens=False)
                response_ids += obs
                response_mask += [0] * len(obs)
                logprobs += [0.0] * len(obs)
        reward = float(result.reward)
        info = result.info
        metrics = info.get("metrics", {})
        extra = {
            "pvpo_reward": reward,
            "em": float(metrics.get("em", 0.0)),
            "f1": float(metrics.get("f1", 0.0)),
            "format_ok": float(bool(info.get("format_ok"))),
            "num_searches": float(len(episode.queries)),
            "pvpo_anchor": float("nan") if anchor is None else anchor,
        }
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:n],
            response_mask=response_mask[:n],
            response_logprobs=logprobs[:n] if have_logprobs else None,
            reward_score=reward - anchor if anchor is not None else reward,
            num_turns=1 + episode.turns + len(episode.queries),  # the prompt, each agent turn, each search result
            metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=search_s),
            # (not "uid": verl keeps its own per-step uid in that column)
            extra_fields={
                "reward_extra_info": extra,
                "turn_scores": [],
                "tool_rewards": [],
                "pvpo_uid": example.uid,
                "queries": list(episode.queries),
            },
        )
