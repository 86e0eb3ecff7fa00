"""The one translation from settings to what an episode runs under: the episode's rules
(`EpisodeConfig`: protocol, prompt, reward, turns, search) and the agent loop's limits
(`LoopConfig`: sampling, token budgets, concurrency). The trainer's rollouts, its evaluations and
`pvpo eval` all build theirs here, from a run's `TrainConfig` (`trainer.data.agent_settings`) or
from `pvpo eval`'s settings (`evaluation.run.EvalSettings.agent`), so a field is added once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pvpo.envs.episode import MAX_QUESTION_CHARS, EpisodeConfig
from pvpo.reward import TagProtocol

if TYPE_CHECKING:
    from pvpo.trainer.rollout.agent_loop import LoopConfig


@dataclass(frozen=True)
class AgentSettings:
    """Everything that decides an episode and how the policy samples in it; each caller gives the
    settings it has and the rest keep the episode's and the loop's defaults."""

    protocol: TagProtocol | str
    prompt_template: str
    reward: str
    max_turns: int
    topk: int
    max_obs_chars: int | None
    temperature: float
    top_p: float
    max_new_tokens: int
    max_response_tokens: int
    chat_template: bool
    max_concurrency: int
    reward_params: Mapping[str, Any] = field(default_factory=dict)
    max_question_chars: int | None = MAX_QUESTION_CHARS
    top_k: int = -1
    search_timeout_s: float | None = None
    max_completion_tokens: int | None = None
    repetition_stop: int = 0

    def episode(self) -> EpisodeConfig:
        """The episode's rules."""
        return EpisodeConfig(
            protocol=self.protocol,
            reward=self.reward,
            reward_params=dict(self.reward_params),
            max_turns=self.max_turns,
            topk=self.topk,
            max_obs_chars=self.max_obs_chars,
            prompt_template=self.prompt_template,
            max_question_chars=self.max_question_chars,
        )

    def loop(self) -> LoopConfig:
        """The agent loop's limits."""
        from pvpo.trainer.rollout.agent_loop import LoopConfig  # torch: only where a loop runs

        return LoopConfig(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            max_response_tokens=self.max_response_tokens,
            chat_template=self.chat_template,
            max_concurrency=self.max_concurrency,
            search_timeout_s=self.search_timeout_s,
            max_completion_tokens=self.max_completion_tokens,
            repetition_stop=self.repetition_stop,
        )
