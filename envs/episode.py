"""One search episode as pure state: the rules shared by `SearchEnv` and `SearchVectorEnv`.

A step is split in two so a batch of episodes can send all its searches in one retriever call:
`begin_step(turn)` reads the turn and says which query (if any) to search, `finish_step(passages)`
turns the search result (or no result) into the observation, reward, end flags and info.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.retrieval import format_passages, trim
from pvpo.retriever.types import MAX_QUERY_CHARS, Passage
from pvpo.reward import SEARCH_R1, Action, ActionKind, RewardFn, TagProtocol, answer_metrics, get_protocol, get_reward

log = logging.getLogger(__name__)
_CUT_QUERIES = [0]  # queries cut in this process, for the warning's count

DEFAULT_PROMPT = "{instruction} Question: {question}\n"
# The longest question put in a prompt, in characters: about 4 characters a token (English BPE)
# times 1024 prompt tokens. A 1 MB question once ran for 5+ minutes (1.6 GB) in `pvpo eval`
# and a 10 MB one was OOM-killed at 23.5 GB; cut, it costs what any question costs.
MAX_QUESTION_CHARS = 4 * 1024
# An untrimmed search result (`max_obs_chars=None`, FlashRAG's eval) still stops here: 3 Wikipedia
# passages of 100 words are ~2,000 characters; only a damaged corpus reaches this.
OBS_CHARS_CAP = 32 * 1024


def bounded_query(query: str) -> str:
    """A search query as the environment runs it: cut at a word to MAX_QUERY_CHARS, the longest a
    retriever of ours answers (`Episode` warns and counts when it cuts one)."""
    return trim(query, MAX_QUERY_CHARS)


@dataclass(frozen=True)
class EpisodeConfig:
    """The rules of an episode. `max_turns` counts agent turns (a turn is one `step`);
    `max_obs_chars` is the character budget of one search result's passages; `max_question_chars`
    bounds the question put in the prompt (longer ones are cut at a word: `bound_questions` warns
    when loading, the prompt cuts any that arrive another way)."""

    protocol: TagProtocol | str = SEARCH_R1
    reward: str = "pvpo"
    reward_params: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = 6
    topk: int = 3
    max_obs_chars: int | None = 2000
    prompt_template: str = DEFAULT_PROMPT
    max_question_chars: int | None = MAX_QUESTION_CHARS

    def __post_init__(self) -> None:
        if isinstance(self.protocol, str):  # a protocol may be named, as in configs
            object.__setattr__(self, "protocol", get_protocol(self.protocol))
        if self.max_turns < 1 or self.topk < 1:
            raise ValueError("max_turns and topk must be >= 1")
        # unknown reward names and parameters it does not take fail here, not as a 0 for every answer
        get_reward(self.reward, **dict(self.reward_params))

    @property
    def tag_protocol(self) -> TagProtocol:
        """`protocol` as the TagProtocol it names (a name given to the constructor is resolved there)."""
        assert isinstance(self.protocol, TagProtocol)
        return self.protocol

    def reward_fn(self) -> RewardFn:
        return get_reward(self.reward, **dict(self.reward_params))

    def passages_text(self, passages: Sequence[Passage]) -> str:
        """What a search result shows the agent inside the observation tags: the passages rendered
        and cut to `max_obs_chars` (a passage past the budget is shown in part or not at all)."""
        return format_passages(passages, self.max_obs_chars or OBS_CHARS_CAP)

    def prompt(self, example: QAExample) -> str:
        """`prompt_template`: a name in `pvpo.envs.templates` (`default`, `search_r1`) or a format string."""
        from pvpo.envs.templates import render_prompt

        return render_prompt(self.prompt_template, self.tag_protocol, trim(example.question, self.max_question_chars))


@dataclass
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Episode:
    """The state of one question being answered: the agent's text and the env's replies so far."""

    def __init__(self, example: QAExample, config: EpisodeConfig, reward_fn: RewardFn) -> None:
        self.example = example
        self.config = config
        self._reward_fn = reward_fn
        self.prompt = config.prompt(example)
        self.response = ""  # agent turns + env observations: the transcript the agent saw
        # What the reward judges: agent turns and search results, without the env's correction
        # messages, whose literal <search>/<answer> tags would otherwise be read as the agent's.
        self.judged = ""
        self.turns = 0
        self.queries: list[str] = []
        self.queries_cut = 0  # queries longer than the retriever takes, searched cut
        self.retrieved_ids: list[list[str]] = []  # per search, the ids of the passages returned
        self.passages: list[list[dict[str, Any]]] = []  # per search, each passage's id, title and score
        self.terminated = False
        self.truncated = False
        self._action: Action | None = None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def reset_info(self) -> dict[str, Any]:
        ex = self.example
        return {"uid": ex.uid, "question": ex.question, "golden_answers": list(ex.golden_answers)}

    def begin_step(self, turn: Any) -> str | None:
        """Record the agent's turn (anything that is not text counts as an empty, invalid turn);
        return the query to search now, or None when this turn needs no search."""
        if self.done:
            raise RuntimeError("begin_step on a finished episode")
        text = turn if isinstance(turn, str) else ""
        self.response += text
        self.judged += text
        self.turns += 1
        self._action = self.config.tag_protocol.parse_action(text)
        if self._action.kind is ActionKind.SEARCH and self.turns < self.config.max_turns:
            self._action = replace(self._action, content=self._bounded_query(self._action.content))
            return self._action.content
        return None

    def _bounded_query(self, query: str) -> str:
        """`query` cut to MAX_QUERY_CHARS (the retriever refuses a longer one): a policy's query is
        the model's output, not the user's, so it is searched cut, counted (`num_queries_cut` in
        the info) and warned about, never an error that ends the run."""
        if len(query) <= MAX_QUERY_CHARS:
            return query
        self.queries_cut += 1
        _CUT_QUERIES[0] += 1
        n = _CUT_QUERIES[0]
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th, ... of this process: a warning, not a flood
            log.warning(
                "%s: a search query of %d characters was cut to %d (the retriever's limit); %d cut so far",
                self.example.uid,
                len(query),
                MAX_QUERY_CHARS,
                n,
            )
        return bounded_query(query)

    def finish_step(self, passages: Sequence[Passage] | None = None) -> StepResult:
        """Complete the step begun by `begin_step`, with the passages found for its query."""
        action, cfg = self._action, self.config
        if action is None:
            raise RuntimeError("finish_step without begin_step")
        self._action = None
        observation = ""
        retrieved: list[dict[str, Any]] = []
        if action.kind is ActionKind.ANSWER:
            self.terminated = True
        elif self.turns >= cfg.max_turns:
            self.truncated = True
        elif action.kind is ActionKind.SEARCH:
            self.queries.append(action.content)
            retrieved = [{"id": p.id, "title": p.title, "score": p.score} for p in passages or []]
            self.retrieved_ids.append([p.id for p in passages or []])
            self.passages.append(retrieved)
            observation = cfg.tag_protocol.wrap_observation(cfg.passages_text(passages or []))
            self.judged += observation
        else:
            observation = cfg.tag_protocol.correction_message()
        self.response += observation
        info = self._step_info(action.kind.value)
        info["retrieved"] = retrieved
        reward = self._score(info) if self.done else 0.0
        return StepResult(observation, reward, self.terminated, self.truncated, info)

    def end(self, text: str = "") -> StepResult:
        """End the episode now, truncated, for a reason on the agent's side (it stopped without
        an answer, or ran out of tokens): `text`, its last partial turn, is appended unread and the
        response is scored as it stands."""
        if self.done:
            raise RuntimeError("end on a finished episode")
        self.response += text
        self.judged += text
        self.truncated = True
        info = self._step_info("finish")
        return StepResult("", self._score(info), self.terminated, self.truncated, info)

    def _step_info(self, action: str) -> dict[str, Any]:
        return {
            "uid": self.example.uid,
            "action": action,
            "num_turns": self.turns,
            "num_searches": len(self.queries),
            "num_queries_cut": self.queries_cut,
            "queries": list(self.queries),
        }

    def _score(self, info: dict[str, Any]) -> float:
        """Score the finished response; add the prediction, metrics and reward parts to `info`."""
        golds = list(self.example.golden_answers)
        result = self._reward_fn(self.judged, golds, self.config.tag_protocol)
        info.update(
            prediction=result.prediction,
            metrics=answer_metrics(result.prediction, golds),
            reward_components={k: float(v) for k, v in result.components.items()},
            format_ok=bool(result.format_ok),
            golden_answers=golds,
            response=self.response,
            judged_response=self.judged,
            retrieved_ids=[list(ids) for ids in self.retrieved_ids],
            passages=[[dict(p) for p in found] for found in self.passages],
        )
        return float(result.total)
