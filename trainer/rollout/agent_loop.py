"""The agent loop: turns of generation and search for a batch of prompts, kept token-exact.

Each turn the engine samples every active trajectory until a stop string (`</search>`,
`</answer>`) or EOS; a `SearchVectorEnv` steps all of them at once (its episode rules read the
turns and send all pending queries of the batch to the retriever in one call); the observations
are tokenized and appended with loss mask 0. A trajectory ends on an answer or `max_turns` (the
env's rules), or on EOS without an answer or the response token budget (the loop's; the env then
scores the episode as it stands with `finish`). Rewards are the env's, computed on the text the
policy saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import SearchVectorEnv, info_at
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind
from pvpo.trainer.rollout.engine import RolloutEngine, SamplingConfig
from pvpo.trainer.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class LoopConfig:
    """Per-rollout limits; the episode's own `max_turns` is set from `max_turns` too."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 4
    max_new_tokens: int = 48
    max_response_tokens: int = 384
    chat_template: bool = False  # prompt = the tokenizer's chat template over one user message


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


def _seed(base: int, turn: int) -> int:
    # A per-turn seed derived from the caller's: sampling is reproducible after a resume.
    return (base * 1_000_003 + turn * 7919) % (2**62)


def _finish(traj: Trajectory, info: dict[str, Any], reward: float, reason: str) -> None:
    traj.reward = float(reward)
    traj.reward_components = dict(info.get("reward_components", {}))
    traj.prediction = info.get("prediction")
    traj.accuracy = float(info.get("metrics", {}).get("em", 0.0))
    traj.finish_reason = reason


def vector_env(searcher: Searcher, episode_config: EpisodeConfig, num_envs: int) -> SearchVectorEnv:
    """A `SearchVectorEnv` with `episode_config`'s rules over `searcher`; questions come at reset."""
    c = episode_config
    return SearchVectorEnv(
        num_envs,
        None,
        retriever=searcher,
        protocol=c.protocol,
        reward=c.reward,
        reward_params=c.reward_params,
        max_turns=c.max_turns,
        topk=c.topk,
        max_obs_chars=c.max_obs_chars,
        prompt_template=c.prompt_template,
    )


def run_agent_loop(
    engine: RolloutEngine,
    tokenizer: Any,
    examples: Sequence[QAExample],
    searcher: Searcher,
    episode_config: EpisodeConfig,
    loop: LoopConfig,
    *,
    seed: int,
) -> list[Trajectory]:
    """One trajectory per example (repeat an example n times for a group of n), in order."""
    if not examples:
        return []
    protocol = episode_config.tag_protocol
    env = vector_env(searcher, episode_config, len(examples))
    try:
        prompts, _ = env.reset(options={"questions": list(examples)})
        trajs = [
            Trajectory(uid=ex.uid, prompt_ids=prompt_ids(tokenizer, p, chat_template=loop.chat_template))
            for ex, p in zip(examples, prompts, strict=True)
        ]
        contexts = [list(t.prompt_ids) for t in trajs]

        def end(i: int, reason: str, text: str = "") -> None:
            reward, info = env.finish(i, text)
            _finish(trajs[i], info, reward, reason)

        active = list(range(len(trajs)))
        eos_id = tokenizer.eos_token_id
        for turn in range(loop.max_turns):
            if not active:
                break
            room = {i: loop.max_response_tokens - len(trajs[i].response_ids) for i in active}
            sampling = SamplingConfig(
                temperature=loop.temperature,
                top_p=loop.top_p,
                stop=tuple(protocol.stop_strings),
                max_new_tokens=max(1, min(loop.max_new_tokens, max(room.values()))),
                seed=_seed(seed, turn),
            )
            completions = engine.generate([contexts[i] for i in active], sampling)
            actions = [""] * len(trajs)  # finished episodes ignore theirs
            stepped: list[int] = []
            for i, comp in zip(active, completions, strict=True):
                traj = trajs[i]
                ids, lps = comp.token_ids[: room[i]], comp.logprobs[: room[i]]
                traj.append_model(ids, lps)
                contexts[i].extend(ids)
                traj.num_turns += 1
                text = tokenizer.decode([t for t in ids if t != eos_id], skip_special_tokens=False)
                traj.response_text += text
                if len(ids) < len(comp.token_ids):  # budget hit inside this turn
                    end(i, "budget", text)
                elif comp.finish_reason == "eos" and protocol.parse_action(text).kind is not ActionKind.ANSWER:
                    end(i, "eos", text)
                else:
                    actions[i] = text
                    stepped.append(i)
            obs, rewards, terminated, truncated, infos = env.step(actions)
            active = []
            for i in stepped:
                traj, info = trajs[i], info_at(infos, i)
                traj.num_tool_calls = int(info.get("num_searches", 0))
                if terminated[i] or truncated[i]:
                    _finish(traj, info, float(rewards[i]), "answer" if terminated[i] else "max_turns")
                    continue
                obs_ids = list(tokenizer.encode(obs[i], add_special_tokens=False))
                if len(traj.response_ids) + len(obs_ids) >= loop.max_response_tokens:
                    end(i, "budget")  # the env's response already holds this observation
                    continue
                traj.append_env(obs_ids)
                traj.response_text += obs[i]
                contexts[i].extend(obs_ids)
                active.append(i)
        for i in active:  # only when loop.max_turns < the episode's max_turns
            end(i, "max_turns")
        return trajs
    finally:
        env.close()
