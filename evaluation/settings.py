"""`pvpo eval`'s settings: how the policy is sampled and each episode is run (`EvalSettings`), and
the prompt template / tag protocol a name stands for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pvpo.envs.episode import DEFAULT_PROMPT, EpisodeConfig
from pvpo.reward import TagProtocol, get_protocol
from pvpo.trainer.rollout.agent_settings import AgentSettings

if TYPE_CHECKING:
    from pvpo.trainer.rollout.agent_loop import LoopConfig


class EvalError(ValueError):
    """A bad evaluation setting or an output folder that does not match the run."""


@dataclass(frozen=True)
class EvalSettings:
    """How the policy is sampled and the episode is run. Greedy by default; PVPO (arXiv:2508.21104)
    evaluates at temperature 0.6, top-p 0.95. `max_new_tokens` bounds one turn,
    `max_response_tokens` the whole response (model and env tokens), `max_completion_tokens` the
    model's tokens of a question (None: no bound of its own); `repetition_stop` ends a question
    whose turn falls into a loop of that many tokens (0: never). The last two keep a degenerate
    answer short (a base model writing "000..." to every turn's budget: 6 x 512 tokens without
    them). The 1,125 Search-R1 (Qwen2.5-7B) trajectories of
    `../shared/data/scored` use at most 501 model tokens a question (SmolLM2's tokenizer) and
    repeat at most 18 tokens outside the one degenerate answer (`pvpo.trainer.rollout.repetition`),
    so neither default cuts them. `chat_template`: None = use the tokenizer's chat template when
    it has one (as Search-R1's inference script does)."""

    template: str = "search_r1"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_turns: int = 6
    max_new_tokens: int = 512
    max_response_tokens: int = 4096
    topk: int = 3
    max_obs_chars: int | None = None
    batch_size: int = 32
    seed: int = 0
    chat_template: bool | None = None
    max_completion_tokens: int | None = 1024
    repetition_stop: int = 32

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "max_turns": self.max_turns >= 1,
            "max_new_tokens": self.max_new_tokens >= 1,
            "max_response_tokens": self.max_response_tokens >= 1,
            "max_completion_tokens": self.max_completion_tokens is None or self.max_completion_tokens >= 1,
            "repetition_stop": self.repetition_stop >= 0,
            "topk": self.topk >= 1,
            "batch_size": self.batch_size >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise EvalError(f"bad evaluation setting {bad[0]}={getattr(self, bad[0])!r}")
        resolve_template(self.template)

    def agent(self, tokenizer: Any) -> AgentSettings:
        """These settings as the trainer's one source of episode rules and loop limits: the env's
        reward is Search-R1's EM (the prediction it extracts is what the metrics score); the chat
        template is used when asked, or by default when `tokenizer` has one."""
        protocol, prompt = resolve_template(self.template)
        chat = self.chat_template if self.chat_template is not None else bool(getattr(tokenizer, "chat_template", None))
        return AgentSettings(
            protocol=protocol,
            prompt_template=prompt,
            reward="em",
            max_turns=self.max_turns,
            topk=self.topk,
            max_obs_chars=self.max_obs_chars,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            max_response_tokens=self.max_response_tokens,
            chat_template=chat,
            max_concurrency=self.batch_size,
            max_completion_tokens=self.max_completion_tokens,
            repetition_stop=self.repetition_stop,
        )

    def episode(self) -> EpisodeConfig:
        """The episode rules of an evaluation."""
        return self.agent(None).episode()

    def loop(self, tokenizer: Any) -> LoopConfig:
        """The agent loop's limits for a policy with `tokenizer`."""
        return self.agent(tokenizer).loop()

    def most_model_tokens(self) -> int:
        """The most model tokens one question can take under these budgets."""
        bounds = [self.max_turns * self.max_new_tokens, self.max_response_tokens]
        return min(bounds + ([self.max_completion_tokens] if self.max_completion_tokens is not None else []))


def resolve_template(name: str) -> tuple[TagProtocol, str]:
    """(tag protocol, prompt template) of a name: a template of `pvpo.envs.templates` (e.g.
    `search_r1`, Search-R1's exact training prompt, with its protocol), else a tag protocol (e.g.
    `research`) with the default prompt (the protocol's instruction, then `Question: ...`)."""
    from pvpo.envs.templates import available_templates, get_template
    from pvpo.reward import available_protocols

    if name in available_templates():
        tpl = get_template(name)
        return get_protocol(tpl.protocol), tpl.prompt_template
    if name in available_protocols():
        return get_protocol(name), DEFAULT_PROMPT
    raise EvalError(
        f"unknown template {name!r}; known templates: {available_templates()}, tag protocols: {available_protocols()}"
    )
