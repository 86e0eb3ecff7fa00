"""The GT sources `oracle` and `model` (see `sources.py` for what a source is and how pi_gt is
set for each); importing this module registers them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.trainer.reference.gt_registry import GTContext, GTSource, register_gt_source
from pvpo.trainer.rollout.agent_loop import run_agent_loop, run_episodes
from pvpo.trainer.rollout.trajectory import Trajectory


class OracleSource:
    """The synthetic world's oracle, replayed through the env: observations are the env's own."""

    deterministic = True

    def __init__(self, context: GTContext) -> None:
        if context.world is None:
            raise ValueError(
                "algorithm.gt.source=oracle needs the synthetic world (data.source: synthetic); "
                "use gt.source=model for a real dataset"
            )
        self.ctx = context

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from pvpo.trainer.rollout.replay import oracle_trajectories

        c = self.ctx
        protocol = c.episode_config.tag_protocol
        return list(
            oracle_trajectories(
                examples,
                lambda ex: c.world.oracle_trajectory(ex, protocol),
                c.tokenizer,
                c.searcher,
                c.episode_config,
                chat_template=c.loop.chat_template,
                eos=False,
            )
        )

    def close(self) -> None:
        return None


def check_same_tokenizer(path: str, tokenizer: Any, policy_tokenizer: Any) -> None:
    """A ValueError naming `algorithm.gt.model.path` when the GT model's `tokenizer` is not the
    policy's: its trajectories could not be replayed token-exact."""
    if tokenizer.get_vocab() != policy_tokenizer.get_vocab():
        raise ValueError(
            f"algorithm.gt.model.path={path}: its tokenizer differs from the policy's, so its trajectories "
            "cannot be replayed token-exact; use a model of the same family, or an endpoint "
            "(gt.model.base_url) with gt.logprobs=reference"
        )


def gt_model_tokenizer(path: str) -> Any:
    """The tokenizer of the GT model at `path` (a local folder, hub id, catalog name or *.gguf
    file, resolved as `load_policy` resolves it), without its weights."""
    from transformers import AutoTokenizer

    from pvpo.model_catalog import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(path))


class LocalModelSource:
    """A local HF causal LM running our agent loop (token-exact); its log-probs are pi_gt."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.model.policy import load_policy
        from pvpo.trainer.rollout.engine import build_engine

        m = gt_config.model
        policy = load_policy(m.path)
        check_same_tokenizer(m.path, policy.tokenizer, context.tokenizer)
        self.ctx, self.temperature = context, m.temperature
        self.engine = build_engine(m.engine, model=policy.model, tokenizer=policy.tokenizer)

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from dataclasses import replace

        c = self.ctx
        loop = replace(c.loop, temperature=self.temperature, top_p=1.0)
        return list(
            run_agent_loop(
                self.engine, c.tokenizer, examples, c.searcher, c.episode_config, loop, seed=1_000_003 * (attempt + 1)
            )
        )

    def close(self) -> None:
        self.engine.close()


class EndpointSource:
    """An OpenAI-compatible chat endpoint running the agent loop's turns as text, client side
    (`pvpo.trainer.rollout.endpoint_turns`): each turn stops at the protocol's stop strings (which
    the server strips and we put back), the env's reply goes back as the next user message. The
    text is tokenized with the policy's tokenizer. The endpoint is asked for its log-probs (vLLM's
    server returns them): each turn whose tokens it spells as the policy's tokenizer does keeps
    them as pi_gt (source "endpoint"); every other turn has none (source "") and takes the
    reference policy's (`gt.logprobs: reference`; `gt.set_pi_gt`)."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.rollout.openai_client import OpenAIClient

        m = gt_config.model
        if gt_config.logprobs != "reference":
            raise ValueError(
                "gt.model.base_url: an endpoint may return no log-probs, or log-probs over its own "
                "tokenization; set algorithm.gt.logprobs=reference"
            )
        self.ctx, self.cfg = context, m
        self.client = OpenAIClient(
            m.base_url, m.model, api_key=os.environ.get(m.api_key_env) or None, timeout=m.timeout_s
        )

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from dataclasses import replace

        from pvpo.trainer.rollout.endpoint_turns import EndpointTurns

        c = self.ctx
        loop = replace(c.loop, temperature=self.cfg.temperature, top_p=1.0)
        trajs = run_episodes(
            lambda _: EndpointTurns(
                self.client,
                c.episode_config.tag_protocol,
                api="chat",
                tokenizer=c.tokenizer,
                chat_template=c.loop.chat_template,
                logprobs=True,
            ),
            examples,
            c.searcher,
            c.episode_config,
            loop,
            seed=100_003 * (attempt + 1),
        )
        return list(trajs)

    def close(self) -> None:
        self.client.close()


@register_gt_source("oracle")
def _oracle(gt_config: Any, context: GTContext) -> GTSource:
    return OracleSource(context)


@register_gt_source("model")
def _model(gt_config: Any, context: GTContext) -> GTSource:
    if gt_config.model.path:
        return LocalModelSource(gt_config, context)
    if gt_config.model.base_url:
        return EndpointSource(gt_config, context)
    raise ValueError("algorithm.gt.source=model needs gt.model.path (a local HF folder) or gt.model.base_url")
