"""Scripted turns replayed through the agent loop: the synthetic world's oracle trajectories (the
warm start's SFT data and the `oracle` GT source), with the env's own observations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.retriever.types import Searcher
from pvpo.trainer.rollout.agent_loop import Conversation, LoopConfig, Turn, prompt_ids, run_episodes
from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.trajectory import Trajectory


class ScriptedTurns:
    """A turn source that writes each prompt's scripted turns, in order, tokenized with the
    policy's tokenizer (log-prob 0: the script is deterministic)."""

    def __init__(self, scripts: dict[str, list[str]], tokenizer: Any, *, chat_template: bool) -> None:
        self.scripts, self.tokenizer, self.chat_template = scripts, tokenizer, chat_template

    def start(self, prompt: str) -> tuple[list[int], Conversation]:
        return prompt_ids(self.tokenizer, prompt, chat_template=self.chat_template), Conversation(prompt)

    async def turn(self, conv: Conversation, sampling: SamplingConfig) -> Turn:
        script = self.scripts[conv.prompt]
        if len(conv.turns) >= len(script):  # the script ran out before the episode ended
            return Turn([], [], "", "eos", 0)
        text = script[len(conv.turns)]
        conv.turns.append((text, ""))
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Turn(ids, [0.0] * len(ids), text, "stop", len(ids), logprobs_source="script")

    def observe(self, conv: Conversation, turn: Turn, observation: str) -> list[int]:
        conv.turns[-1] = (turn.text, observation)
        return list(self.tokenizer.encode(observation, add_special_tokens=False))

    def close(self) -> None:
        return None


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
    """Replay `oracle(example)`'s turns through the agent loop, so the observations are exactly
    the env's and the prompts are encoded as the loop encodes them. With `eos` the answer is
    followed by EOS (SFT teaches the model to stop); without it the trajectory ends at the
    answer's stop string, as sampled ones do. Each oracle token gets log-prob 0: the oracle is
    deterministic. No token budget applies."""
    if not examples:
        return []
    scripts = {episode_config.prompt(ex): oracle(ex) for ex in examples}
    loop = LoopConfig(
        max_new_tokens=1 << 30,
        max_response_tokens=1 << 30,
        chat_template=chat_template,
    )

    def make(_: Executor) -> ScriptedTurns:
        return ScriptedTurns(scripts, tokenizer, chat_template=chat_template)

    trajs = run_episodes(make, examples, searcher, episode_config, loop, seed=0)
    for t in trajs:
        if eos and t.finish_reason == "answer":
            t.append_model([tokenizer.eos_token_id], [0.0], "script")
    return trajs
