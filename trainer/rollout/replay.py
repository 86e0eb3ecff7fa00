"""Scripted turns replayed through the env: the synthetic world's oracle trajectories (the warm
start's SFT data and the `oracle` GT source), with the env's own observations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import info_at
from pvpo.retriever.types import Searcher
from pvpo.trainer.rollout.agent_loop import prompt_ids, vector_env
from pvpo.trainer.rollout.trajectory import Trajectory


def oracle_trajectories(
    examples: Sequence[QAExample],
    oracle: Callable[[QAExample], list[str]],
    tokenizer: Any,
    searcher: Searcher,
    episode_config: EpisodeConfig,
    *,
    chat_template: bool = False,
    eos: bool = True,
) -> list[Trajectory]:
    """Replay `oracle(example)`'s turns through a `SearchVectorEnv` (one retriever call per turn
    for the batch), so the observations are exactly the env's; prompts are encoded as the agent
    loop encodes them. With `eos` the last turn is followed by EOS (SFT teaches the model to stop);
    without it the trajectory ends at the answer's stop string, as the agent loop's do. Each
    oracle token gets log-prob 0: the oracle is deterministic."""
    if not examples:
        return []
    turns = [oracle(ex) for ex in examples]
    env = vector_env(searcher, episode_config, len(examples))
    try:
        prompts, _ = env.reset(options={"questions": list(examples)})
        trajs = [
            Trajectory(ex.uid, prompt_ids(tokenizer, p, chat_template=chat_template))
            for ex, p in zip(examples, prompts, strict=True)
        ]
        for t in range(max(len(ts) for ts in turns)):
            # An oracle ends with its answer, so an episode still running has a turn left.
            live = [i for i, ts in enumerate(turns) if t < len(ts) and not env.done[i]]
            if not live:
                break
            actions = [""] * len(examples)  # finished episodes ignore theirs
            for i in live:
                actions[i] = turns[i][t]
                ids = list(tokenizer.encode(actions[i], add_special_tokens=False))
                trajs[i].append_model(ids, [0.0] * len(ids))
            obs, rewards, terminated, truncated, infos = env.step(actions)
            for i in live:
                trajs[i].num_turns += 1
                info = info_at(infos, i)
                trajs[i].num_tool_calls = int(info.get("num_searches", 0))
                if terminated[i] or truncated[i]:
                    trajs[i].reward = float(rewards[i])
                    trajs[i].accuracy = float(info.get("metrics", {}).get("em", 0.0))
                    trajs[i].prediction = info.get("prediction")
                    trajs[i].reward_components = dict(info.get("reward_components", {}))
                    trajs[i].finish_reason = "answer" if terminated[i] else "max_turns"
                    if eos:
                        trajs[i].append_model([tokenizer.eos_token_id], [0.0])
                else:
                    trajs[i].append_env(list(tokenizer.encode(obs[i], add_special_tokens=False)))
        return trajs
    finally:
        env.close()
