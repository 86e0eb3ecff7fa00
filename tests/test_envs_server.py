"""The environment against the real retriever: synthetic corpus -> MiniLM + FAISS index -> HTTP
server on loopback -> `gymnasium.make(..., retriever_url=...)`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import pvpo.envs  # noqa: F401
from pvpo.envs import SearchEnv, SyntheticWorld, info_at

pytestmark = pytest.mark.slow
SEED, N_ENTITIES, PER_HOP = 11, 30, 20


@pytest.fixture(scope="session")
def world() -> SyntheticWorld:
    return SyntheticWorld.generate(SEED, N_ENTITIES, questions_per_hop=PER_HOP)


@pytest.fixture(scope="session")
def server_url(world: SyntheticWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.build import build_index
    from pvpo.retriever.server import BackgroundServer

    tmp = tmp_path_factory.mktemp("synthetic_index")
    index_dir = build_index(world.write_corpus(tmp / "corpus.jsonl"), tmp / "index", show_progress=False)
    with BackgroundServer(index_dir) as server:
        yield server.url


class CountingClient:
    """The HTTP client, counting its search() calls (each is one POST /retrieve)."""

    def __init__(self, url: str) -> None:
        from pvpo.retriever.client import RetrieverClient

        self.client = RetrieverClient(url, topk=3)
        self.calls = 0

    def search(self, queries: Sequence[str], topk: int | None = None):
        self.calls += 1
        return self.client.search(queries, topk)


def _dataset_kwargs() -> dict:
    return {"seed": SEED, "n_entities": N_ENTITIES, "questions_per_hop": PER_HOP, "split": "test"}


def test_make_with_a_server_url_passes_check_env(server_url: str) -> None:
    env = gym.make("pvpo/SearchQA-v0", dataset="synthetic", dataset_kwargs=_dataset_kwargs(), retriever_url=server_url)
    check_env(env.unwrapped)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("<search>anything at all</search>")
    assert obs.startswith("\n\n<information>Doc 1(Title: ") and info["num_searches"] == 1
    env.close()


def test_oracle_episode_through_the_server_earns_full_pvpo_reward(world: SyntheticWorld, server_url: str) -> None:
    env = SearchEnv(world.questions("test"), retriever_url=server_url, reward="pvpo")
    solved = 0
    for ex in world.questions("test"):
        env.reset(options={"question": ex})
        for turn in world.oracle_trajectory(ex):
            obs, reward, term, trunc, info = env.step(turn)
        solved += reward == 1.0 and term and info["prediction"] == ex.golden_answers[0]
    # MiniLM top-3 misses a hop now and then; the oracle still answers from its own chain, so
    # every episode must score 1.0 - the check is that the whole path through HTTP works.
    assert solved == len(world.questions("test"))
    env.close()


def test_oracle_searches_find_the_hop_passage_through_minilm(world: SyntheticWorld, server_url: str) -> None:
    env = SearchEnv(world.questions("test"), retriever_url=server_url)
    hits = total = 0
    for ex in world.questions("test"):
        env.reset(options={"question": ex})
        for turn, support in zip(world.oracle_trajectory(ex), ex.paragraphs):
            obs = env.step(turn)[0]
            hits += support.text in obs
            total += 1
    assert hits / total >= 0.95, f"{hits}/{total}"
    env.close()


def test_vector_env_makes_one_retriever_call_per_step(world: SyntheticWorld, server_url: str) -> None:
    qs = world.questions("test")[-8:]
    client = CountingClient(server_url)
    env = gym.make_vec("pvpo/SearchQA-v0", num_envs=len(qs), dataset=None, retriever=client)
    env.reset(options={"reset_mask": np.ones(len(qs), bool), "questions": qs})
    plans = [world.oracle_trajectory(q) for q in qs]
    rewards_at_end = {}
    for t in range(max(map(len, plans))):
        before = client.calls
        obs, rewards, term, trunc, infos = env.step(tuple(p[t] if t < len(p) else "" for p in plans))
        assert client.calls - before == int(any(t < len(p) - 1 for p in plans))
        for i in np.flatnonzero(infos.get("_prediction", np.zeros(len(qs), bool))):
            rewards_at_end[int(i)] = (rewards[i], info_at(infos, int(i))["reward_components"])
    assert rewards_at_end == {i: (1.0, {"format": 1.0, "r_acc": 1.0}) for i in range(len(qs))}
    env.reset(options={"reset_mask": np.ones(len(qs), bool), "questions": qs})
    garbage = ("<search>", None, "</answer>", "\udcff", "<search>x</search>", "<answer>", "", 5)
    obs, rewards, term, trunc, _ = env.step(garbage)
    correction = env.config.protocol.correction_message()
    assert [o == correction for o in obs] == [True] * 4 + [False] + [True] * 3 and obs[4].startswith(
        "\n\n<information>"
    )
    assert not (term.any() or trunc.any()) and client.calls == max(map(len, plans))
    client.client.close()
