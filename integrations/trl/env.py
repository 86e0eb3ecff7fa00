"""Our search episode as a TRL `GRPOTrainer(environment_factory=...)` environment, by tool calling.

TRL builds one environment per rollout and exposes its public methods as tools (name, type hints
and Google-style docstring become the tool's schema), calls `reset(**row)` with the dataset row's
columns before generating and `get_reward()` once when the rollout is over (TRL 1.16,
`GRPOTrainer.__init__` and `_generate_and_score_completions`). Here the tools are `search` and
`answer`, and each call is one turn of a `pvpo.envs.Episode`: the same turn budget (`max_turns`),
retriever (`topk`), passage rendering (`max_obs_chars`) and reward as `pvpo/SearchQA-v0`. The
reward judges the episode's transcript in the tag protocol's terms (each `search` call a search
block followed by its result block, the `answer` call the answer block), so PVPO's format gate
reads "answered exactly once", and a rollout that never calls `answer` scores as an unanswered
episode (0 under `pvpo`).

This module imports nothing of TRL: an environment is a plain object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pvpo.envs import EpisodeConfig, QAExample, format_passages, load_dataset, resolve_retriever
from pvpo.envs.episode import Episode
from pvpo.envs.retrieval import close_retriever
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind, TagProtocol

TOOL_INSTRUCTION = (
    "Answer the question. Call the `search` tool to look up facts in the corpus, as many times as you need; "
    "each call returns the top passages. When you know the answer, call the `answer` tool once with a short answer."
)

ENDED = "The episode is over: no more tool calls are read."


def tool_prompt(question: str, instruction: str = TOOL_INSTRUCTION) -> str:
    """The user message of a tool-calling episode: the instruction, then the question."""
    return f"{instruction} Question: {question.strip()}"


def example_from_row(row: Mapping[str, Any]) -> QAExample | None:
    """The question a TRL dataset row carries (`uid`, `question`, `golden_answers` columns, as
    `search_dataset` writes them), or None for a row without a question."""
    if row.get("question") is None:
        return None
    return QAExample.coerce(
        {
            "uid": row.get("uid", row["question"]),
            "question": row["question"],
            "golden_answers": row.get("golden_answers", ()),
        }
    )


def _strip_tags(text: str, protocol: TagProtocol) -> str:
    """`text` without the protocol's tags, so a tool argument cannot open or close a block."""
    for tag in (protocol.think, protocol.search, protocol.result, protocol.answer):
        text = text.replace(protocol.open_tag(tag), " ").replace(protocol.close_tag(tag), " ")
    return text.strip()


class SearchToolEnv:
    """One rollout of search QA for TRL: `reset(**row)` starts an episode on the row's question;
    `search(query)` and `answer(answer)` are the model's tools; `get_reward()` scores the episode
    with the configured reward. After `get_reward`, `info` holds the finished episode's
    `prediction`, `metrics` ({em, f1, cem}), `reward_components`, `format_ok`, `queries` and
    `retrieved_ids` (as `SearchEnv`'s last step info)."""

    def __init__(self, factory: SearchEnvFactory) -> None:
        self._factory = factory
        self._episode: Episode | None = None
        self.info: dict[str, Any] = {}
        self.reward: float | None = None

    # ---- reserved methods (not tools) --------------------------------------------------------------
    def reset(self, **row: Any) -> str | None:
        """Start an episode on the row's question and return None (the row's `prompt` is the
        prompt); a row without one (TRL's placeholder rows when the environment owns the data)
        takes the factory's next question and returns its prompt."""
        example = example_from_row(row)
        prompt: str | None = None
        if example is None:
            example = self._factory._next_example()
            prompt = tool_prompt(example.question, self._factory.instruction)
        self._episode = Episode(example, self._factory.config, self._factory.reward_fn)
        self.info, self.reward = {}, None
        return prompt

    def get_reward(self) -> float:
        """The episode's reward; an episode still running (the model stopped calling tools without
        answering, or TRL's tool-call budget ran out) is ended first and scored as it stands."""
        ep = self._require_episode()
        if not ep.done:
            self._finish(ep.end())
        assert self.reward is not None  # an episode ended by a tool call was scored there
        return self.reward

    # ---- tools ------------------------------------------------------------------------------------
    def search(self, query: str) -> str:
        """
        Search the corpus for passages about a query.

        Args:
            query: What to look up, as a short search query.

        Returns:
            The top passages, one per line, each as `Doc i(Title: title) text`.
        """
        ep = self._require_episode()
        if ep.done:
            return ENDED
        cfg = self._factory.config
        protocol = cfg.tag_protocol
        turn = (
            protocol.open_tag(protocol.search) + _strip_tags(str(query), protocol) + protocol.close_tag(protocol.search)
        )
        q = ep.begin_step(turn)
        passages = self._factory.retriever.search([q], cfg.topk)[0] if q is not None else None
        result = ep.finish_step(passages)
        if ep.done:
            self._finish(result)
            return f"The turn budget ({cfg.max_turns}) is spent: the episode ended without an answer."
        if result.info["action"] != ActionKind.SEARCH.value:
            return "The query was empty: give a non-empty `query`."
        return format_passages(passages or [], cfg.max_obs_chars) or "No passages found."

    def answer(self, answer: str) -> str:
        """
        Give the final answer to the question and end the episode.

        Args:
            answer: The answer, as a short span (a name, a date, a number).

        Returns:
            A confirmation that the answer was recorded.
        """
        ep = self._require_episode()
        if ep.done:
            return ENDED
        protocol = self._factory.config.tag_protocol
        text = _strip_tags(str(answer), protocol)
        content = f"\\boxed{{{text}}}" if protocol.boxed_answer and text else text
        ep.begin_step(protocol.open_tag(protocol.answer) + content + protocol.close_tag(protocol.answer))
        result = ep.finish_step()  # an answer turn searches nothing
        if ep.done:
            self._finish(result)
            return "Answer recorded. The episode is over." if ep.terminated else ENDED
        return "The answer was empty: give a non-empty `answer`."

    # ---- helpers ----------------------------------------------------------------------------------
    def _require_episode(self) -> Episode:
        if self._episode is None:
            raise RuntimeError("reset() the environment before calling its tools")
        return self._episode

    def _finish(self, result: Any) -> None:
        self.reward = float(result.reward)
        self.info = dict(result.info)
        self._factory._record(self)


class SearchEnvFactory:
    """`environment_factory` for TRL's `GRPOTrainer`: each call builds a `SearchToolEnv`; all of
    them share one retriever client (`retriever_url`, one URL or several, round-robin; or any
    `retriever` object with `search(queries, topk)`) and one episode configuration (protocol,
    reward and its parameters, `max_turns`, `topk`, `max_obs_chars`, as `pvpo/SearchQA-v0`).

    Questions come with the dataset rows (`train_dataset=search_dataset(...)`, which PVPO needs
    for its per-prompt anchor). Without a train dataset the environment owns the data: give
    `dataset` here and `group_size` = GRPO's `num_generations`, so the G rollouts of one group
    (reset one after the other, as TRL does) answer the same question.

    `finished` keeps the last `keep` finished episodes' infos (uid, reward, prediction, metrics,
    queries), for inspection and tests."""

    def __init__(
        self,
        retriever_url: str | Sequence[str] | None = None,
        *,
        retriever: Searcher | None = None,
        reward: str = "pvpo",
        reward_params: Mapping[str, Any] | None = None,
        protocol: str | TagProtocol = "search_r1",
        max_turns: int = 6,
        topk: int = 3,
        max_obs_chars: int | None = 2000,
        dataset: str | Path | Sequence[QAExample] | None = None,
        dataset_kwargs: Mapping[str, Any] | None = None,
        group_size: int = 1,
        instruction: str = TOOL_INSTRUCTION,
        timeout: float = 30.0,
        keep: int = 4096,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.config = EpisodeConfig(protocol, reward, dict(reward_params or {}), max_turns, topk, max_obs_chars)
        self.reward_fn = self.config.reward_fn()
        self.retriever, self._owns_retriever = resolve_retriever(retriever, retriever_url, topk=topk, timeout=timeout)
        self.examples = load_dataset(dataset, **dict(dataset_kwargs or {})) if dataset is not None else []
        self.group_size = group_size
        self.instruction = instruction
        self.keep = keep
        self.finished: list[dict[str, Any]] = []
        self._resets = 0

    def __call__(self) -> SearchToolEnv:
        return SearchToolEnv(self)

    def close(self) -> None:
        """Close the retriever client this factory opened (not one it was given)."""
        if self._owns_retriever:
            close_retriever(self.retriever)
            self._owns_retriever = False

    def _next_example(self) -> QAExample:
        if not self.examples:
            raise ValueError(
                "the dataset row has no question and this SearchEnvFactory has no dataset: pass "
                "train_dataset=search_dataset(...) to GRPOTrainer, or SearchEnvFactory(dataset=..., group_size=G)"
            )
        example = self.examples[(self._resets // self.group_size) % len(self.examples)]
        self._resets += 1
        return example

    def _record(self, env: SearchToolEnv) -> None:
        self.finished.append({"reward": env.reward, **env.info})
        del self.finished[: -self.keep]
