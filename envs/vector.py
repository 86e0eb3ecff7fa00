"""`SearchVectorEnv`: many search episodes stepped together, all the searches of one step sent to
the retriever in one call. Autoreset is disabled (Gymnasium 1.x `AutoresetMode.DISABLED`): the
caller resets finished episodes itself, choosing their questions, as an RL trainer does.

    env = SearchVectorEnv(8, "synthetic", retriever_url=url)
    prompts, infos = env.reset(seed=0, options={"reset_mask": np.ones(8, bool),
                                                "questions": [example_or_None, ...]})
    obs, rewards, terminated, truncated, infos = env.step(turns)   # tuple of 8 turn texts

Observations are tuples of strings: after reset the prompts, after a step the text to append
after each turn. Infos follow Gymnasium's vector convention (a dict of per-episode arrays with
`_key` masks); `info_at(infos, i)` gives episode i's plain dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pvpo.envs.data import QAExample
from pvpo.envs.episode import Episode
from pvpo.envs.retrieval import close_retriever
from pvpo.envs.search_env import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, EpisodeRules, set_up_episodes
from pvpo.envs.spaces import UnicodeText
from pvpo.retriever.types import Passage


class SearchVectorEnv(EpisodeRules, VectorEnv):
    """`num_envs` search episodes stepped in lockstep; one retriever call per step.

    `reset(seed=, options=)` options:
      - `reset_mask`: bool array (num_envs,), which episodes to (re)start; default all. Episodes
        not in the mask keep their state and their last observation.
      - `questions`: a sequence of num_envs entries, each a QAExample (or a mapping with uid,
        question, golden_answers) to start that episode on, or None to take one from the dataset:
        drawn with that episode's random generator (`order="random"`), or the dataset's next
        question in file order, shared by all episodes and wrapping around (`order="sequential"`,
        for evaluation). Entries outside the mask are ignored. Reset infos hold `index`, the
        question's position in the dataset (None for a given question).
    `step(turns)` takes one turn per episode. A finished episode ignores its turn: it returns "",
    reward 0, `terminated` and `truncated` False and adds nothing to infos, so the end flags and
    `infos["_prediction"]` mark exactly the episodes that ended at this step (each episode ends
    once, as Gymnasium's vector wrappers such as `RecordEpisodeStatistics` count them; `done`
    tells which episodes have ended). `finish(i, text)` ends episode i from the
    agent's side (EOS without an answer, a token budget) and scores it as it stands.
    """

    metadata = {"autoreset_mode": AutoresetMode.DISABLED, "render_modes": []}

    def __init__(
        self, num_envs: int, dataset: str | Path | Sequence[QAExample] | None = "synthetic", **options: Any
    ) -> None:
        """`options`: the keywords of `SearchEnv` (`pvpo.envs.search_env.set_up_episodes`)."""
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self.num_envs = num_envs
        set_up_episodes(self, dataset, **options)
        self._next_index = 0  # order="sequential": the question the next drawn episode starts
        self.single_observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.single_action_space = UnicodeText(MAX_ACTION_CHARS)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.episodes: list[Episode | None] = [None] * num_envs
        self._obs: list[str] = [""] * num_envs
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self.retriever_calls = 0

    # ---- reset ---------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        options = dict(options or {})
        mask = np.asarray(options.get("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"reset_mask must have shape ({self.num_envs},), got {mask.shape}")
        questions = options.get("questions")
        if questions is not None and len(questions) != self.num_envs:
            raise ValueError(f"questions must have {self.num_envs} entries (None to draw one), got {len(questions)}")
        seeds = self._seeds(seed)
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seeds[0] if isinstance(seeds[0], int) else None)
        infos: dict[str, Any] = {}
        for i in map(int, np.flatnonzero(mask)):
            if seeds[i] is not None:
                self._rngs[i] = np.random.default_rng(seeds[i])
            given = questions is not None and questions[i] is not None
            index = None if given else self._draw(i)
            example = QAExample.coerce(questions[i]) if given else self.examples[index]  # type: ignore[index]
            ep = Episode(example, self.config, self._reward_fn)
            self.episodes[i] = ep
            self._obs[i] = ep.prompt
            infos = self._add_info(infos, {**ep.reset_info(), "index": index}, int(i))
        return tuple(self._obs), infos

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"need {self.num_envs} seeds, got {len(seed)}")
        return list(seed)

    def _draw(self, i: int) -> int:
        """The dataset position of episode i's next question."""
        if not self.examples:
            raise ValueError("no dataset: pass options={'questions': [...]} to reset")
        if self.order == "sequential":
            index = self._next_index % len(self.examples)
            self._next_index = index + 1
            return index
        return int(self._rngs[i].integers(len(self.examples)))

    # ---- step ----------------------------------------------------------------------------------
    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"need {self.num_envs} actions, got {len(actions)}")
        if any(ep is None for ep in self.episodes):
            raise RuntimeError("reset() every episode before step()")
        episodes: list[Episode] = self.episodes  # type: ignore[assignment]
        active = [i for i, ep in enumerate(episodes) if not ep.done]
        queries = {i: episodes[i].begin_step(actions[i]) for i in active}
        found = self._search_once([q for q in queries.values() if q is not None])

        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        for i, ep in enumerate(episodes):
            if i not in queries:
                self._obs[i] = ""
                continue
            q = queries[i]
            r = ep.finish_step(found[q] if q is not None else None)
            self._obs[i] = r.observation
            rewards[i], terminated[i], truncated[i] = r.reward, r.terminated, r.truncated
            infos = self._add_info(infos, r.info, i)
        return tuple(self._obs), rewards, terminated, truncated, infos

    def finish(self, i: int, text: str = "") -> tuple[float, dict[str, Any]]:
        """End episode i now, truncated, for a reason on the agent's side (it stopped without an
        answer, or ran out of its token budget): `text` (its last, partial turn, not read as an
        action) is appended to the response, which is scored as it stands. Returns (reward,
        info), the info shaped as a finished step's."""
        ep = self.episodes[i]
        if ep is None or ep.done:
            raise RuntimeError(f"finish({i}) on an episode that is not running")
        res = ep.end(text)
        self._obs[i] = ""
        return res.reward, res.info

    def _search_once(self, queries: list[str]) -> dict[str, list[Passage]]:
        """All queries of a step in a single retriever call (duplicates asked once)."""
        unique = list(dict.fromkeys(queries))
        if not unique:
            return {}
        self.retriever_calls += 1
        results = self.retriever.search(unique, self.config.topk)
        if len(results) != len(unique):
            raise RuntimeError(f"retriever answered {len(results)} of {len(unique)} queries")
        return dict(zip(unique, results))

    # ---- views ---------------------------------------------------------------------------------
    @property
    def responses(self) -> list[str]:
        """Each episode's agent turns and env observations so far (what the reward judges)."""
        return [ep.response if ep is not None else "" for ep in self.episodes]

    @property
    def done(self) -> np.ndarray:
        """Which episodes have ended (terminated or truncated); never-started ones count as done."""
        return np.array([ep is None or ep.done for ep in self.episodes], dtype=bool)

    def close_extras(self, **kwargs: Any) -> None:
        if self._owns_retriever:
            close_retriever(self.retriever)
            self._owns_retriever = False


def info_at(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Episode i's info as a plain dict, from Gymnasium's batched vector infos (masks respected)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, Mapping):
            out[key] = info_at(value, i)
        else:
            item = value[i]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out
