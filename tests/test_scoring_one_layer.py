"""`pvpo eval` and the trainer's held-out evaluation score the same episodes through the one scoring
layer (`pvpo.reward.scoring`) and report the same figures, bit for bit, equal to what the held-out
evaluation reported before it used that layer."""

from __future__ import annotations

import pytest

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.evaluation.policies import _outcome
from pvpo.evaluation.run import prediction_item, summarize_items
from pvpo.recipes.heldout_table import per_dataset_table
from pvpo.retriever.types import Passage, make_contents
from pvpo.reward import SEARCH_R1
from pvpo.reward.scoring import item_score, read_score
from pvpo.stats import standard_error
from pvpo.trainer.heldout.scoring import eval_metrics, question_scores
from pvpo.trainer.rollout.replay import oracle_trajectories
from pvpo.trainer.rollout.trajectory import summarize

PASSAGES = [
    Passage("0", make_contents("Berlin", "Berlin is the capital of Germany.")),
    Passage("1", make_contents("Paris", "Paris is the capital of France.")),
]

# (question, golds, hops, the agent's turns): right, wrong, a gold inside a longer answer (CEM 1,
# EM 0, F1 between), a yes/no answer, two searches, no answer tag at all (format not ok)
CASES = [
    ("capital of Germany?", ("Berlin",), 1, ["<search> capital of Germany </search>", "<answer> Berlin </answer>"]),
    ("capital of France?", ("Paris",), 1, ["<search> capital of France </search>", "<answer> Lyon </answer>"]),
    ("where is the Reichstag?", ("Berlin",), 2, ["<answer> in the city of Berlin </answer>"]),
    ("is Paris in France?", ("yes",), 2, ["<search> Paris France </search>", "<answer> yes </answer>"]),
    (
        "which capital is older?",
        ("Paris", "Lutetia"),
        2,
        ["<search> Paris </search>", "<search> Berlin </search>", "<answer> Paris </answer>"],
    ),
    ("capital of Spain?", ("Madrid",), 3, ["I do not know, Madrid maybe"]),
]


class FixedSearcher:
    """Both passages for every query."""

    def search(self, queries, topk=None):
        return [list(PASSAGES) for _ in queries]


@pytest.fixture(scope="module")
def episodes():
    from pvpo.trainer.model.policy import train_tokenizer

    tags = [f"<{t}>" for t in ("think", "search", "information", "answer")]
    tags += [f"</{t}>" for t in ("think", "search", "information", "answer")]
    texts = [p.contents for p in PASSAGES] + [turn for *_, turns in CASES for turn in turns]
    tok = train_tokenizer(texts, vocab_size=400, extra_tokens=tags)
    examples = [
        QAExample(f"{'hotpotqa' if i % 2 else 'musique'}/{i}", q, golds, metadata={"hops": hops})
        for i, (q, golds, hops, _) in enumerate(CASES)
    ]
    turns = {ex.question: t for ex, (*_, t) in zip(examples, CASES, strict=True)}
    episode = EpisodeConfig(protocol=SEARCH_R1, topk=2, max_turns=4)
    trajs = oracle_trajectories(examples, lambda ex: turns[ex.question], tok, FixedSearcher(), episode, eos=False)
    return examples, trajs


def test_pvpo_eval_and_the_held_out_evaluation_give_the_same_figures_for_the_same_episodes(episodes):
    examples, trajs = episodes
    held_out = eval_metrics(trajs, examples)
    items = [prediction_item(ex, _outcome("prompt", t, SEARCH_R1)) for ex, t in zip(examples, trajs, strict=True)]
    evaluated = summarize_items(items)
    pairs = {"accuracy": "em", "accuracy_se": "em_se", "f1": "f1", "cem": "acc", "format_ok": "format_ok"}
    pairs["searches_per_traj"] = "searches"
    for trainer_name, eval_name in pairs.items():
        assert held_out[f"eval/{trainer_name}"] == evaluated[eval_name], trainer_name  # bit for bit
    assert held_out["eval/n"] == evaluated["n"] == len(CASES)
    # the episodes cover what the figures distinguish: EM, CEM without EM, a malformed answer
    assert 0 < evaluated["em"] < evaluated["acc"] < 1 and 0 < evaluated["format_ok"] < 1
    # each question: the trainer's kept scores equal the scores `pvpo eval` wrote in its items
    kept = question_scores(trajs, examples)
    for mine, item in zip(kept, items, strict=True):
        theirs = item_score(item).as_dict()
        assert {k: mine[k] for k in theirs} == theirs
        assert read_score(mine) == read_score({**theirs, "reward": mine["reward"]})


def test_the_held_out_figures_equal_the_formulas_they_had_before_the_scoring_layer(episodes):
    # before: EM was each trajectory's env verdict (`accuracy`), the format rate its reward's
    # `format` part, the reward and searches `summarize`'s means, F1 / CEM recomputed per answer
    examples, trajs = episodes
    m = eval_metrics(trajs, examples)
    s = summarize(trajs)
    assert m["eval/accuracy"] == s["accuracy"]
    assert m["eval/accuracy_se"] == standard_error([t.accuracy for t in trajs])
    assert m["eval/format_ok"] == s["format_ok"]
    assert m["eval/reward"] == s["reward/mean"] and 0 < s["reward/mean"]
    assert m["eval/searches_per_traj"] == s["searches_per_traj"]
    assert m["eval/accuracy_1hop"] == 0.5 and m["eval/accuracy_2hop"] == pytest.approx(2 / 3)
    assert m["eval/accuracy_3hop"] == 0.0
    assert list(m)[:8] == [
        "eval/accuracy",
        "eval/accuracy_se",
        "eval/f1",
        "eval/cem",
        "eval/reward",
        "eval/format_ok",
        "eval/searches_per_traj",
        "eval/n",
    ]


def test_the_recipe_table_reads_pvpo_evals_items_and_the_runs_kept_scores_alike(episodes):
    examples, trajs = episodes
    uids = [ex.uid for ex in examples]
    kept = question_scores(trajs, examples)
    items = [prediction_item(ex, _outcome("prompt", t, SEARCH_R1)) for ex, t in zip(examples, trajs, strict=True)]
    from_items = [item_score(it).as_dict() for it in items]
    table = per_dataset_table(uids, {"before": kept, "after": kept})
    assert table and table == per_dataset_table(uids, {"before": from_items, "after": from_items})
