"""Our env under Gymnasium's own vector classes and wrappers: `AsyncVectorEnv`
(shared memory included) and `make_vec(..., "async")` with non-ASCII text, `SyncVectorEnv`, and
`RecordEpisodeStatistics` counting each episode of `SearchVectorEnv` once."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import pvpo.envs  # noqa: F401  (registers pvpo/SearchQA-v0)
from pvpo.envs import QAExample, SearchEnv, SearchVectorEnv, UnicodeText
from pvpo.retriever.types import Passage

QUESTIONS = [
    QAExample("q-é", "Où est né Émile Zola ?", ["Paris"]),
    QAExample("q-ü", "Wer schrieb Faust — Goethe?", ["Goethe"]),
]


class AccentSearcher:
    """Returns one non-ASCII passage per query (picklable: it crosses into the worker processes)."""

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        return [[Passage("d1", '"Zola"\nÉmile Zola est né à Paris, 日本語 ✓', 1.0)] for _ in queries]


def _env() -> SearchEnv:
    return SearchEnv(QUESTIONS, retriever=AccentSearcher(), max_turns=3)


def test_unicode_text_round_trips_through_shared_memory() -> None:
    space = UnicodeText(32)
    mem = create_shared_memory(space, n=2)
    write_to_shared_memory(space, 0, "Émile — 日本 ✓ 🙂", mem)
    view = read_from_shared_memory(space, mem, n=2)
    assert view == ("Émile — 日本 ✓ 🙂", "")
    write_to_shared_memory(space, 0, "ab", mem)  # a shorter text leaves no tail of the longer one
    assert view[0] == "ab"  # a live view: AsyncVectorEnv reads its shared memory only once
    assert copy.deepcopy(view) == ("ab", "") and type(copy.deepcopy(view)) is tuple


@pytest.mark.parametrize("shared_memory", [True, False])
def test_async_vector_env_carries_non_ascii_questions_actions_and_passages(shared_memory: bool) -> None:
    envs = AsyncVectorEnv([_env, _env], shared_memory=shared_memory)
    try:
        obs, infos = envs.reset(options={"question": QUESTIONS[0]})
        assert all("Où est né Émile Zola ?" in o for o in obs)
        obs, rewards, term, trunc, infos = envs.step(("<search>Émile Zola né</search>", "<search>Zola ✓</search>"))
        assert all("日本語 ✓" in o for o in obs) and not term.any()
        obs, rewards, term, trunc, infos = envs.step(("<answer>Paris</answer>", "<answer>Lyon</answer>"))
        assert term.tolist() == [True, True] and rewards[0] > rewards[1]
    finally:
        envs.close()


def test_make_vec_async_and_sync_build_gymnasiums_vector_envs() -> None:
    for mode, cls in (("async", gym.vector.AsyncVectorEnv), ("sync", gym.vector.SyncVectorEnv)):
        envs = gym.make_vec(
            "pvpo/SearchQA-v0", num_envs=2, vectorization_mode=mode, dataset=QUESTIONS, retriever=AccentSearcher()
        )
        try:
            assert isinstance(envs, cls)
            obs, _ = envs.reset(seed=0)
            assert all(o in envs.single_observation_space for o in obs)
            obs, *_ = envs.step(("<search>Émile</search>", "<search>Zola</search>"))
            assert all("Émile Zola est né à Paris" in o for o in obs)
        finally:
            envs.close()


def test_record_episode_statistics_counts_each_episode_once() -> None:
    envs = RecordEpisodeStatistics(SearchVectorEnv(3, QUESTIONS, retriever=AccentSearcher(), max_turns=4))
    envs.reset(seed=0, options={"questions": [QUESTIONS[0]] * 3})
    turns = [
        ("<answer>Paris</answer>", "<search>a</search>", "<search>a</search>"),  # episode 0 ends
        ("x", "<answer>Lyon</answer>", "<search>b</search>"),  # episode 1 ends
        ("x", "x", "<search>c</search>"),
        ("x", "x", "<answer>Paris</answer>"),  # episode 2 ends
        ("x", "x", "x"),
    ]
    seen: list[tuple[int, float, int]] = []
    for step in turns:
        _, _, term, trunc, infos = envs.step(step)
        if "episode" in infos:
            for i in np.flatnonzero(infos["_episode"]):
                seen.append((int(i), float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
    assert [(i, length) for i, _, length in seen] == [(0, 1), (1, 2), (2, 4)]
    assert seen[0][1] == 1.0 and seen[2][1] == 1.0 and seen[1][1] < 1.0
    assert len(envs.return_queue) == 3
