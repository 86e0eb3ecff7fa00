"""`SearchEnv`: a Gymnasium environment where an agent answers a question by searching a corpus.

Observations and actions are text. `reset` returns the prompt; each `step(turn)` takes one agent
turn (text ending with a stop string such as `</search>`) and returns exactly the text to append
after it: the passages in the protocol's result block, a correction message, or "" at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from pvpo.envs.data import QAExample
from pvpo.envs.episode import DEFAULT_PROMPT, Episode, EpisodeConfig
from pvpo.envs.loaders import load_dataset
from pvpo.envs.retrieval import close_retriever, resolve_retriever
from pvpo.envs.spaces import UnicodeText
from pvpo.retriever.types import Searcher
from pvpo.reward import SEARCH_R1, RewardFn, TagProtocol

MAX_ACTION_CHARS = 1 << 16
MAX_OBSERVATION_CHARS = 1 << 20


def examples_from(
    dataset: str | Path | Sequence[QAExample] | None, dataset_kwargs: Mapping[str, Any] | None
) -> list[QAExample]:
    """The questions an env draws from: none (questions come with `reset(options=...)`), a
    registered dataset name, a file path, or QAExamples."""
    if dataset is None:
        return []
    return load_dataset(dataset, **dict(dataset_kwargs or {}))


ORDERS = ("random", "sequential")


def check_order(order: str) -> str:
    """`order` if it names a way to draw questions from the dataset, else a ValueError listing them."""
    if order not in ORDERS:
        raise ValueError(f"order={order!r} is not one of {list(ORDERS)}")
    return order


def question_from_options(options: Mapping[str, Any] | None) -> QAExample | None:
    if not options or options.get("question") is None:
        return None
    return QAExample.coerce(options["question"])


class EpisodeRules:
    """What `SearchEnv` and `SearchVectorEnv` hold from their keyword arguments (`set_up_episodes`)."""

    config: EpisodeConfig
    examples: list[QAExample]
    order: str
    retriever: Searcher
    _owns_retriever: bool
    _reward_fn: RewardFn


def set_up_episodes(
    env: EpisodeRules,
    dataset: str | Path | Sequence[QAExample] | None = "synthetic",
    *,
    retriever: Searcher | None = None,
    retriever_url: str | Sequence[str] | None = None,
    protocol: str | TagProtocol = SEARCH_R1,
    reward: str = "pvpo",
    reward_params: Mapping[str, Any] | None = None,
    max_turns: int = 6,
    topk: int = 3,
    max_obs_chars: int | None = 2000,
    prompt_template: str = DEFAULT_PROMPT,
    dataset_kwargs: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
    order: str = "random",
) -> None:
    """The keyword arguments of `SearchEnv` and `SearchVectorEnv`, applied to `env`: its episode
    rules (`config`), the questions it draws from (`examples`, in `order`), its retriever (a
    client of `retriever_url` it owns, or `retriever`) and reward function."""
    env.config = EpisodeConfig(
        protocol, reward, dict(reward_params or {}), max_turns, topk, max_obs_chars, prompt_template
    )
    env.order = check_order(order)
    env.examples = examples_from(dataset, dataset_kwargs)
    env.retriever, env._owns_retriever = resolve_retriever(retriever, retriever_url, topk=topk, timeout=timeout)
    env._reward_fn = env.config.reward_fn()


class SearchEnv(EpisodeRules, gym.Env[str, str]):
    """Multi-turn search QA as a Gymnasium env.

    `reset(seed=, options={"question": QAExample | mapping})` starts an episode on the given
    question; `options={"index": i}` on the dataset's question i; without either, on the next
    question of the dataset: drawn with `self.np_random` (`order="random"`), or the one after the
    last (`order="sequential"`, for evaluation: a walk over the dataset in file order, wrapping
    around at the end; `options={"index": i}` moves it to i). It returns the prompt and `info =
    {uid, question, golden_answers, index}` (`index`: the question's position in the dataset,
    None for a question given in options). `step(turn)` reads the turn with the tag protocol:
    a search queries the retriever and returns the top passages (`Doc i(Title: t) text`) in the
    result block, trimmed to `max_obs_chars`; an answer ends the episode (`terminated`) with the
    configured reward; anything else returns the correction message; after `max_turns` turns
    the episode is `truncated` (and scored as it stands). Each step's info holds `uid`, `action`,
    `num_turns`, `num_searches`, `queries` and `retrieved`, the passages this step's search
    returned as `[{id, title, score}]` (empty without a search); the final one adds `prediction`,
    `metrics` ({em, f1, cem}), `reward_components`, `format_ok`, `golden_answers`, `response`,
    `retrieved_ids` (per search, the ids returned) and `passages` (per search, `[{id, title, score}]`)).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": None}

    def __init__(
        self,
        dataset: str | Path | Sequence[QAExample] | None = "synthetic",
        *,
        render_mode: str | None = None,
        **options: Any,
    ) -> None:
        """A search env over `dataset`'s questions: a registered dataset name (`synthetic`, the
        embedded multi-hop world), a question file (HotpotQA, MuSiQue, 2WikiMultihopQA or FlashRAG,
        detected), QAExamples, or None (questions come with `reset(options={"question": ...})`).

        Args:
            dataset: where the questions come from (above).
            render_mode: `"ansi"` (`render()` returns the episode as text) or None.
            **options: the episode's options, below (the keywords of `set_up_episodes`).

        Keyword Args:
            retriever (Searcher | None): a `Searcher` to query in process (e.g.
                `pvpo.retriever.load_retriever(...)`).
            retriever_url (str | Sequence[str] | None): a Search-R1 `/retrieve` server, or several
                (round-robin); the env owns its client and closes it. One of `retriever` and
                `retriever_url` is required.
            protocol (str | TagProtocol): the tag protocol, `search_r1` (default: think / search /
                information / answer) or `research`, or a `TagProtocol`.
            reward (str): a registered reward, `pvpo` (default), `em`, `research_f1` or
                `search_r1_format`.
            reward_params (Mapping[str, Any] | None): keyword arguments of the reward (e.g. its
                format weights).
            max_turns (int): agent turns before the episode is truncated and scored as it stands
                (default 6).
            topk (int): passages a search returns (default 3).
            max_obs_chars (int | None): a search result trimmed to this many characters (default
                2000; None: whole).
            prompt_template (str): the prompt, with `{instruction}` (the protocol's) and
                `{question}` (default `pvpo.envs.DEFAULT_PROMPT`).
            dataset_kwargs (Mapping[str, Any] | None): keyword arguments of
                `pvpo.envs.load_dataset` (e.g. `name`, `limit`; a registered dataset's own, e.g.
                `split`).
            timeout (float): seconds a retriever request may take (default 30).
            order (str): `"random"` (default: drawn with the env's seed) or `"sequential"` (file
                order, for evaluation).
        """
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        set_up_episodes(self, dataset, **options)
        self._next_index = 0  # order="sequential": the question the next reset starts
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self.episode: Episode | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        example, index = question_from_options(options), None
        if example is None:
            if not self.examples:
                raise ValueError("no dataset: pass options={'question': QAExample(...)} to reset")
            index = self._pick_index(options)
            example = self.examples[index]
        self.episode = Episode(example, self.config, self._reward_fn)
        return self.episode.prompt, {**self.episode.reset_info(), "index": index}

    def _pick_index(self, options: Mapping[str, Any] | None) -> int:
        n = len(self.examples)
        if options and options.get("index") is not None:
            index = int(options["index"])
            if not 0 <= index < n:
                raise ValueError(f"options['index']={index} is outside the dataset's {n} questions (0..{n - 1})")
        elif self.order == "sequential":
            index = self._next_index % n
        else:
            return int(self.np_random.integers(n))
        self._next_index = index + 1
        return index

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        ep = self.episode
        if ep is None:
            raise RuntimeError("call reset() before step()")
        if ep.done:  # an ended episode stays ended: nothing to append, nothing earned
            return "", 0.0, ep.terminated, ep.truncated, {"uid": ep.example.uid}
        query = ep.begin_step(action)
        passages = self.retriever.search([query], self.config.topk)[0] if query is not None else None
        r = ep.finish_step(passages)
        return r.observation, r.reward, r.terminated, r.truncated, r.info

    def render(self) -> str | None:
        """The episode so far (prompt, then the agent's turns and the env's replies) as text."""
        if self.render_mode != "ansi" or self.episode is None:
            return None
        return self.episode.prompt + self.episode.response

    def close(self) -> None:
        if self._owns_retriever:
            close_retriever(self.retriever)
            self._owns_retriever = False
        super().close()
