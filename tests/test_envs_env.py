"""SearchEnv and SearchVectorEnv against an in-process BM25 retriever over the synthetic world."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import bm25s
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import pvpo.envs  # noqa: F401  (registers pvpo/SearchQA-v0)
from pvpo.envs import QAExample, SearchEnv, SearchVectorEnv, SyntheticWorld, info_at
from pvpo.retriever.types import Passage
from pvpo.reward import RESEARCH, SEARCH_R1


class BM25Searcher:
    """A Searcher over a passage list, counting its calls and the queries it was sent."""

    def __init__(self, passages: Sequence[Passage], topk: int = 3) -> None:
        self.passages = list(passages)
        self.topk = topk
        self.index = bm25s.BM25()
        self.index.index(
            bm25s.tokenize([p.contents for p in self.passages], stopwords=None, show_progress=False),
            show_progress=False,
        )
        self.calls: list[list[str]] = []

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        self.calls.append(list(queries))
        k = min(topk or self.topk, len(self.passages))
        docs, scores = self.index.retrieve(
            bm25s.tokenize(list(queries), stopwords=None, show_progress=False), k=k, show_progress=False
        )
        return [
            [Passage(self.passages[d].id, self.passages[d].contents, float(s)) for d, s in zip(row, srow)]
            for row, srow in zip(docs, scores)
        ]


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld.generate(seed=3, n_entities=40, questions_per_hop=30)


@pytest.fixture()
def searcher(world: SyntheticWorld) -> BM25Searcher:
    return BM25Searcher(world.passages)


def make_env(world: SyntheticWorld, searcher: BM25Searcher, **kw) -> SearchEnv:
    return SearchEnv(world.questions("test"), retriever=searcher, **kw)


def test_gymnasium_make_builds_a_search_env_that_passes_check_env(searcher: BM25Searcher) -> None:
    env = gym.make(
        "pvpo/SearchQA-v0",
        dataset="synthetic",
        dataset_kwargs={"seed": 3, "n_entities": 40, "questions_per_hop": 30},
        retriever=searcher,
    )
    assert isinstance(env.unwrapped, SearchEnv)
    check_env(env.unwrapped)  # samples random (garbage) text actions too
    obs, info = env.reset(seed=1)
    assert obs in env.observation_space and info["question"] in obs and info["uid"].startswith("synthetic-s3/")
    env.close()


@pytest.mark.parametrize("protocol", [SEARCH_R1, RESEARCH], ids=lambda p: p.name)
def test_oracle_trajectory_reaches_the_answer_with_full_pvpo_reward(world, searcher, protocol) -> None:
    env = make_env(world, searcher, protocol=protocol, reward="pvpo")
    for ex in world.questions("test"):
        prompt, info = env.reset(options={"question": ex})
        assert info["uid"] == ex.uid and info["golden_answers"] == list(ex.golden_answers)
        turns = world.oracle_trajectory(ex, protocol)
        for turn, support in zip(turns, ex.paragraphs):
            assert turn.endswith(protocol.stop_strings[0])
            obs, reward, term, trunc, _ = env.step(turn)
            assert not (term or trunc) and reward == 0.0
            assert obs.startswith(f"\n\n<{protocol.result}>Doc 1(Title: ") and support.text in obs
        obs, reward, term, trunc, info = env.step(turns[-1])
        assert (obs, reward, term, trunc) == ("", 1.0, True, False)
        assert info["prediction"] == ex.golden_answers[0] and info["metrics"] == {"em": 1.0, "f1": 1.0, "cem": 1.0}
        assert info["num_searches"] == ex.metadata["hops"] and len(info["queries"]) == ex.metadata["hops"]
        assert info["reward_components"] == {"format": 1.0, "r_acc": 1.0} and info["format_ok"]


def test_search_observation_is_search_r1_docs_trimmed_to_the_budget(world, searcher) -> None:
    env = make_env(world, searcher, max_obs_chars=60)
    env.reset(seed=0)
    obs, *_ = env.step("<search>the mentor of " + world.entities[0] + "</search>")
    body = obs.removeprefix("\n\n<information>").removesuffix("</information>\n\n")
    assert body.startswith(f"Doc 1(Title: {world.entities[0]}) The mentor of {world.entities[0]} is")
    assert len(body) <= 60 and body.endswith("...")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "hello",
        "<search></search>",
        "<answer>",
        "</search>",
        "<think>only thinking</think>",
        None,
        42,
        b"<answer>x</answer>",
        "\x00\udcff" * 50,
        "<search>" * 5000,
    ],
)
def test_bad_actions_get_the_correction_message_and_never_raise(world, searcher, bad) -> None:
    env = make_env(world, searcher, max_turns=3)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(bad)
    assert obs == SEARCH_R1.correction_message() and reward == 0.0 and not term and not trunc
    assert info["action"] == "invalid" and info["num_searches"] == 0


def test_random_text_actions_never_raise_and_episodes_end_by_max_turns(world, searcher) -> None:
    env = make_env(world, searcher, max_turns=4)
    env.action_space.seed(0)
    for episode in range(20):
        env.reset(seed=episode)
        for _ in range(4):
            obs, reward, term, trunc, info = env.step(env.action_space.sample())
            assert obs in env.observation_space and 0.0 <= reward <= 1.0
            if term or trunc:
                break
        assert term or trunc


def test_max_turns_truncates_and_scores_the_unanswered_episode_zero(world, searcher) -> None:
    env = make_env(world, searcher, max_turns=2)
    env.reset(seed=0)
    assert env.step("<search>the rival of x</search>")[2:4] == (False, False)
    obs, reward, term, trunc, info = env.step("<search>the rival of y</search>")
    assert (obs, reward, term, trunc) == ("", 0.0, False, True)
    assert info["prediction"] is None and info["metrics"]["em"] == 0.0 and info["num_searches"] == 1
    assert env.step("<answer>late</answer>")[1:4] == (0.0, False, True)  # an ended episode stays ended


def test_wrong_answer_gets_the_pvpo_format_floor(world, searcher) -> None:
    env = make_env(world, searcher)
    env.reset(seed=0)
    _, reward, term, _, info = env.step("<think>guess</think><answer>Nobody</answer>")
    assert term and reward == pytest.approx(0.1) and info["metrics"]["em"] == 0.0 and info["format_ok"]


def test_reset_seed_draws_the_same_question_and_options_choose_one(world, searcher) -> None:
    env = make_env(world, searcher)
    uids = [env.reset(seed=s)[1]["uid"] for s in (5, 5, 6)]
    assert uids[0] == uids[1]
    mine = QAExample("mine/1", "Who is the rival of Zaro?", ("Kel",))
    prompt, info = env.reset(
        options={"question": {"uid": "mine/1", "question": mine.question, "golden_answers": "Kel"}}
    )
    assert info == {"uid": "mine/1", "question": mine.question, "golden_answers": ["Kel"], "index": None}
    assert prompt.endswith("Question: Who is the rival of Zaro?\n") and prompt.startswith("Answer the given question.")


def test_render_ansi_shows_prompt_and_transcript(world, searcher) -> None:
    env = make_env(world, searcher, render_mode="ansi")
    prompt, _ = env.reset(seed=0)
    env.step("<search>the rival of Zaro</search>")
    assert env.render().startswith(prompt + "<search>the rival of Zaro</search>\n\n<information>")


# ---- vector env ------------------------------------------------------------------------------------
def test_vector_env_sends_all_searches_of_a_step_in_one_call_and_replays_oracles(world, searcher) -> None:
    qs = world.questions("test")[:8]
    env = SearchVectorEnv(len(qs), None, retriever=searcher)
    prompts, infos = env.reset(options={"reset_mask": np.ones(len(qs), bool), "questions": qs})
    assert list(infos["uid"]) == [q.uid for q in qs] and all(q.question in p for q, p in zip(qs, prompts))
    plans = [world.oracle_trajectory(q) for q in qs]
    ended_at = {}
    for t in range(max(map(len, plans))):
        turns = tuple(p[t] if t < len(p) else "" for p in plans)
        n_calls = len(searcher.calls)
        obs, rewards, term, trunc, infos = env.step(turns)
        expect_search = any(t < len(p) - 1 for p in plans)
        assert len(searcher.calls) - n_calls == (1 if expect_search else 0)
        for i in np.flatnonzero(infos.get("_prediction", np.zeros(len(qs), bool))):
            ended_at[i] = t
            assert rewards[i] == 1.0 and obs[i] == "" and info_at(infos, i)["metrics"]["em"] == 1.0
    assert ended_at == {i: len(p) - 1 for i, p in enumerate(plans)} and env.done.all()
    assert env.retriever_calls == len(searcher.calls) == max(map(len, plans)) - 1


def test_vector_env_dedupes_queries_and_leaves_finished_episodes_alone(world, searcher) -> None:
    env = SearchVectorEnv(3, world.questions("train"), retriever=searcher)
    env.reset(seed=0)
    obs, rewards, term, trunc, infos = env.step(
        ("<search>the rival of Zaro</search>", "<search>the rival of Zaro</search>", "<answer>x</answer>")
    )
    assert searcher.calls == [["the rival of Zaro"]] and obs[0] == obs[1] != "" and obs[2] == ""
    assert term.tolist() == [False, False, True] and list(infos["_prediction"]) == [False, False, True]
    obs, rewards, term, trunc, infos = env.step(("<answer>y</answer>", "bad", "<search>ignored</search>"))
    assert obs[2] == "" and rewards[2] == 0.0 and not term[2] and env.done[2] and len(searcher.calls) == 1
    assert list(infos["_uid"]) == [True, True, False] and obs[1] == SEARCH_R1.correction_message()


def test_vector_reset_mask_restarts_only_the_chosen_episodes_on_the_chosen_questions(world, searcher) -> None:
    qs = world.questions("train")
    env = SearchVectorEnv(4, qs, retriever=searcher)
    first, infos = env.reset(seed=7)
    again, _ = SearchVectorEnv(4, qs, retriever=searcher).reset(seed=7)
    assert first == again
    env.step(("<answer>a</answer>",) * 4)
    mask = np.array([True, False, True, False])
    obs, infos = env.reset(options={"reset_mask": mask, "questions": [qs[10], None, None, None]})
    assert obs[0] == env.episodes[0].prompt and qs[10].question in obs[0]
    assert obs[1] == "" and list(infos["_uid"]) == mask.tolist() and infos["uid"][0] == qs[10].uid
    assert env.done.tolist() == [False, True, False, True]


def test_make_vec_uses_the_batched_vector_env(searcher) -> None:
    env = gym.make_vec(
        "pvpo/SearchQA-v0",
        num_envs=3,
        dataset="synthetic",
        dataset_kwargs={"seed": 3, "n_entities": 40, "questions_per_hop": 30},
        retriever=searcher,
    )
    assert isinstance(env, SearchVectorEnv) and env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.DISABLED
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    env.close()


def test_importing_envs_stays_light() -> None:
    code = "import sys, pvpo.envs; print(sorted(m for m in ('torch', 'faiss', 'transformers', 'pvpo.trainer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_step_info_holds_the_retrieved_ids_titles_and_scores(world, searcher) -> None:
    env = make_env(world, searcher, topk=2)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>the rival of Zaro</search>")
    hits = searcher.search(["the rival of Zaro"], 2)[0]
    assert info["retrieved"] == [{"id": p.id, "title": p.title, "score": p.score} for p in hits]
    _, _, _, _, info = env.step("bad turn")
    assert info["retrieved"] == []
    _, _, term, _, info = env.step("<answer>x</answer>")
    assert term and info["retrieved_ids"] == [[p.id for p in hits]]


def test_the_last_steps_info_holds_each_searchs_passages_with_ids_titles_and_scores(world, searcher) -> None:
    env = make_env(world, searcher, topk=2)
    env.reset(seed=0)
    queries = ["the rival of Zaro", "the home of Zaro"]
    for q in queries:
        env.step(f"<search>{q}</search>")
    _, _, term, _, info = env.step("<answer>x</answer>")
    hits = searcher.search(queries, 2)
    assert term and info["passages"] == [[{"id": p.id, "title": p.title, "score": p.score} for p in h] for h in hits]


def test_sequential_order_walks_the_dataset_in_file_order_for_evaluation(world, searcher) -> None:
    questions = world.questions("test")[:3]
    env = SearchEnv(questions, retriever=searcher, order="sequential")
    seen = [env.reset()[1] for _ in range(4)]
    assert [(i["index"], i["uid"]) for i in seen] == [(k % 3, questions[k % 3].uid) for k in range(4)]
    assert env.reset(options={"index": 2})[1]["uid"] == questions[2].uid
    assert env.reset()[1]["index"] == 0  # continues after the question chosen
    with pytest.raises(ValueError, match=r"options\['index'\]=3 is outside the dataset's 3 questions"):
        env.reset(options={"index": 3})
    with pytest.raises(ValueError, match=r"order='shuffled' is not one of \['random', 'sequential'\]"):
        SearchEnv(questions, retriever=searcher, order="shuffled")
    venv = SearchVectorEnv(2, questions, retriever=searcher, order="sequential")
    _, infos = venv.reset()
    assert list(infos["index"]) == [0, 1]
    _, infos = venv.reset(options={"reset_mask": np.array([False, True])})
    assert info_at(infos, 1)["index"] == 2 and info_at(infos, 1)["uid"] == questions[2].uid
