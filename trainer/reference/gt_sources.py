"""The GT sources `oracle` and `model` (see `sources.py` for what a source is and how pi_gt is
set for each); importing this module registers them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.vector import info_at
from pvpo.trainer.reference.sources import GTContext, GTSource, register_gt_source
from pvpo.trainer.rollout.agent_loop import prompt_ids, run_agent_loop, vector_env
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


class LocalModelSource:
    """A local HF causal LM running our agent loop (token-exact); its log-probs are pi_gt."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.model.policy import load_policy
        from pvpo.trainer.rollout.engine import build_engine

        m = gt_config.model
        policy = load_policy(m.path)
        if policy.tokenizer.get_vocab() != context.tokenizer.get_vocab():
            raise ValueError(
                f"gt.model.path={m.path}: its tokenizer differs from the policy's, so its trajectories "
                "cannot be replayed token-exact; use a model of the same family, or an endpoint "
                "(gt.model.base_url) with gt.logprobs=reference"
            )
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
    """An OpenAI-compatible chat endpoint running the turns as text, client side: each turn stops
    at the protocol's stop strings (which the server strips and we put back), the env's reply goes
    back as the next user message. The text is tokenized with the policy's tokenizer."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.rollout.openai_client import OpenAIClient

        m = gt_config.model
        if gt_config.logprobs != "reference":
            raise ValueError(
                "gt.model.base_url: an endpoint's log-probs are over its own tokenization; "
                "set algorithm.gt.logprobs=reference"
            )
        self.ctx, self.cfg = context, m
        self.client = OpenAIClient(
            m.base_url, m.model, api_key=os.environ.get(m.api_key_env) or None, timeout=m.timeout_s
        )

    def _chat(self, messages: list[dict[str, str]], seed: int) -> str:
        from pvpo.trainer.rollout.openai_client import restore_stop

        c, p = self.cfg, self.ctx.episode_config.tag_protocol
        body = {
            "messages": messages,
            "temperature": c.temperature,
            "seed": seed,
            "max_tokens": self.ctx.loop.max_new_tokens,
            "stop": list(p.stop_strings),
        }
        choice = self.client.post("chat/completions", body)["choices"][0]
        text, _ = restore_stop(
            choice["message"]["content"] or "", choice.get("finish_reason"), choice.get("stop_reason"), p
        )
        return text

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        c = self.ctx
        env = vector_env(c.searcher, c.episode_config, 1)
        out: list[Trajectory | None] = []
        try:
            for k, ex in enumerate(examples):
                prompts, _ = env.reset(options={"questions": [ex]})
                traj = Trajectory(ex.uid, prompt_ids(c.tokenizer, prompts[0], chat_template=c.loop.chat_template))
                messages = [{"role": "user", "content": prompts[0]}]
                for _ in range(c.loop.max_turns):
                    text = self._chat(messages, seed=attempt * 100_003 + k)
                    ids = list(c.tokenizer.encode(text, add_special_tokens=False))
                    traj.append_model(ids, [0.0] * len(ids))
                    traj.response_text += text
                    traj.num_turns += 1
                    obs, rewards, terminated, truncated, infos = env.step([text])
                    info = info_at(infos, 0)
                    traj.num_tool_calls = int(info.get("num_searches", 0))
                    if terminated[0] or truncated[0]:
                        traj.reward, traj.prediction = float(rewards[0]), info.get("prediction")
                        traj.accuracy = float(info.get("metrics", {}).get("em", 0.0))
                        break
                    traj.append_env(list(c.tokenizer.encode(obs[0], add_special_tokens=False)))
                    traj.response_text += obs[0]
                    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs[0]}]
                out.append(traj)
        finally:
            env.close()
        return out

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
