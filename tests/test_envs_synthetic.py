"""The synthetic multi-hop world: determinism, splits, passages and oracle trajectories."""

from __future__ import annotations

import pytest

from pvpo.envs import SyntheticWorld, load_dataset
from pvpo.reward import RESEARCH, SEARCH_R1


def test_same_seed_same_world_other_seed_other_world() -> None:
    a, b, c = SyntheticWorld.generate(5), SyntheticWorld.generate(5), SyntheticWorld.generate(6)
    assert a.passages == b.passages and [q.uid for q in a.questions("test")] == [q.uid for q in b.questions("test")]
    assert a.passages != c.passages


def test_train_and_test_share_no_question_and_cover_one_to_four_hops() -> None:
    w = SyntheticWorld.generate(0)
    train, test = w.questions("train"), w.questions("test")
    assert not {q.question for q in train} & {q.question for q in test}
    assert {q.metadata["hops"] for q in test} == {1, 2, 3, 4} == {q.metadata["hops"] for q in train}
    assert len({q.uid for q in train + test}) == len(train) + len(test)
    with pytest.raises(ValueError):
        w.questions("dev")


def test_each_passage_states_one_relation_of_its_titled_entity() -> None:
    w = SyntheticWorld.generate(1, n_entities=30, n_relations=3)
    assert len(w.passages) == 30 * 3 and len(set(w.entities)) == 30
    for p in w.passages:
        entity, relation = p.id.rsplit("-", 1)
        assert p.title == entity and p.text == f"The {relation} of {entity} is {w.facts[(entity, relation)]}."
        assert w.facts[(entity, relation)] != entity


def test_golden_answer_is_the_end_of_the_relation_chain() -> None:
    w = SyntheticWorld.generate(2)
    for q in w.questions("train")[::25]:
        chain, rels = q.metadata["chain"], q.metadata["relations"]
        assert q.golden_answers == (w.follow(chain[0], rels)[-1],) and len(set(chain)) == len(chain)
        assert q.question == "Who is " + " of ".join(f"the {r}" for r in reversed(rels)) + f" of {chain[0]}?"


@pytest.mark.parametrize("protocol", [SEARCH_R1, RESEARCH], ids=lambda p: p.name)
def test_oracle_turns_search_every_hop_then_answer(protocol) -> None:
    w = SyntheticWorld.generate(0)
    q = next(q for q in w.questions("test") if q.metadata["hops"] == 3)
    turns = w.oracle_trajectory(q, protocol)
    assert len(turns) == 4 and all(t.endswith(protocol.stop_strings[0]) for t in turns[:-1])
    assert turns[-1].endswith(protocol.stop_strings[1])
    chain, rels = q.metadata["chain"], q.metadata["relations"]
    assert [protocol.parse_action(t).content for t in turns[:-1]] == [f"the {r} of {e}" for e, r in zip(chain, rels)]
    assert protocol.parse_action(turns[-1]).content == chain[-1]


def test_oracle_refuses_a_question_from_another_world() -> None:
    q = SyntheticWorld.generate(0).questions("test")[-1]
    with pytest.raises(ValueError, match="does not belong"):
        SyntheticWorld.generate(1).oracle_trajectory(q)


def test_synthetic_is_a_registered_dataset() -> None:
    qs = load_dataset("synthetic", split="test", seed=4, n_entities=20, questions_per_hop=10)
    assert [q.uid for q in qs] == [
        q.uid for q in SyntheticWorld.generate(4, 20, questions_per_hop=10).questions("test")
    ]
