"""A synthetic multi-hop world, deterministic per seed and built without downloads: made-up people
linked by a handful of relations, one relation per passage ("The mentor of Zaro is Kelmo."),
1- to 4-hop questions that chain relations ("Who is the mentor of the rival of Zaro?"), and for
each question the oracle trajectory (search each hop, read the passage, answer) in any tag protocol.

The vocabulary is short and regular on purpose: a tiny transformer trained from scratch on CPU can
learn it, and a query written like the passage ("the mentor of Zaro") finds it with MiniLM.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from pvpo.envs.corpus import write_corpus
from pvpo.envs.data import Paragraph, QAExample
from pvpo.envs.loaders import register_dataset
from pvpo.retriever.types import Passage
from pvpo.reward.protocol import SEARCH_R1, TagProtocol

SYLLABLES = ("za", "ro", "vi", "kel", "mo", "dar", "fen", "lu", "qui", "sa", "bor", "tin", "pe", "gra", "nox", "we")
RELATIONS = ("mentor", "rival", "employer", "neighbor", "partner", "student")
SPLITS = ("train", "test")


def _names(rng: np.random.Generator, n: int) -> list[str]:
    """`n` distinct names of two syllables (three once two run out), capitalised."""
    pool = ["".join(p).capitalize() for p in itertools.permutations(SYLLABLES, 2)]
    rng.shuffle(pool)
    if n > len(pool):
        extra = ["".join(p).capitalize() for p in itertools.permutations(SYLLABLES, 3)]
        rng.shuffle(extra)
        pool += extra
    if n > len(pool):
        raise ValueError(f"at most {len(pool)} entities, asked for {n}")
    return pool[:n]


def relation_phrase(relation: str, subject: str) -> str:
    """The noun phrase naming one hop, also the oracle's search query: 'the mentor of Zaro'."""
    return f"the {relation} of {subject}"


@dataclass(frozen=True)
class SyntheticWorld:
    """Entities, their relations (`facts[(entity, relation)] = other entity`) and questions."""

    seed: int
    entities: tuple[str, ...]
    relations: tuple[str, ...]
    facts: dict[tuple[str, str], str]
    _questions: dict[str, tuple[QAExample, ...]]

    @classmethod
    def generate(
        cls,
        seed: int = 0,
        n_entities: int = 60,
        *,
        n_relations: int = 4,
        max_hops: int = 4,
        questions_per_hop: int = 150,
        test_fraction: float = 0.2,
    ) -> SyntheticWorld:
        """A world from `seed`: each entity has one partner entity per relation (never itself);
        up to `questions_per_hop` questions per hop count 1..`max_hops` whose chain never revisits
        an entity, split so that train and test share no question."""
        if not 1 <= n_relations <= len(RELATIONS):
            raise ValueError(f"n_relations must be in 1..{len(RELATIONS)}")
        if not 1 <= max_hops <= 4:
            raise ValueError("max_hops must be in 1..4")
        if n_entities < max_hops + 2:
            raise ValueError(f"need at least {max_hops + 2} entities for {max_hops}-hop questions")
        rng = np.random.default_rng(seed)
        entities = tuple(_names(rng, n_entities))
        relations = RELATIONS[:n_relations]
        facts: dict[tuple[str, str], str] = {}
        for e in entities:
            for r in relations:
                others = [o for o in entities if o != e]
                facts[(e, r)] = others[int(rng.integers(len(others)))]
        world = cls(seed, entities, relations, facts, {})
        world._questions.update(world._make_questions(rng, max_hops, questions_per_hop, test_fraction))
        return world

    # ---- corpus ------------------------------------------------------------------------------
    @property
    def passages(self) -> list[Passage]:
        """One passage per fact, title = the subject: 'Zaro\\nThe mentor of Zaro is Kelmo.'"""
        return [Passage(f"{e}-{r}", f"{e}\n{self.fact_sentence(e, r)}") for e in self.entities for r in self.relations]

    def fact_sentence(self, entity: str, relation: str) -> str:
        return f"The {relation} of {entity} is {self.facts[(entity, relation)]}."

    def write_corpus(self, path: str | Path) -> Path:
        """Write the passages as retriever corpus jsonl (`{"id","contents"}`); returns the path."""
        write_corpus(self.passages, path)
        return Path(path)

    # ---- questions ---------------------------------------------------------------------------
    def _make_questions(
        self, rng: np.random.Generator, max_hops: int, per_hop: int, test_fraction: float
    ) -> dict[str, tuple[QAExample, ...]]:
        out: dict[str, list[QAExample]] = {s: [] for s in SPLITS}
        for hops in range(1, max_hops + 1):
            chains: dict[tuple[str, tuple[str, ...]], None] = {}
            for _ in range(per_hop * 20):
                if len(chains) >= per_hop:
                    break
                start = self.entities[int(rng.integers(len(self.entities)))]
                rels = tuple(self.relations[int(i)] for i in rng.integers(len(self.relations), size=hops))
                path = self.follow(start, rels)
                if len(set(path)) == len(path):  # no entity twice: every hop is informative
                    chains.setdefault((start, rels), None)
            ordered = list(chains)
            n_test = int(round(len(ordered) * test_fraction))
            for i, (start, rels) in enumerate(ordered):
                split = "test" if i < n_test else "train"
                out[split].append(self._example(start, rels, f"synthetic-s{self.seed}/{split}-{hops}hop-{i}"))
        return {s: tuple(v) for s, v in out.items()}

    def follow(self, start: str, relations: Sequence[str]) -> list[str]:
        """The entities visited from `start` following `relations` in order (start included)."""
        path = [start]
        for r in relations:
            path.append(self.facts[(path[-1], r)])
        return path

    def _example(self, start: str, rels: tuple[str, ...], uid: str) -> QAExample:
        path = self.follow(start, rels)
        phrase = start
        for r in rels:
            phrase = relation_phrase(r, phrase)
        paragraphs = tuple(Paragraph(e, self.fact_sentence(e, r), True) for e, r in zip(path, rels))
        return QAExample(
            uid=uid,
            question=f"Who is {phrase}?",
            golden_answers=(path[-1],),
            paragraphs=paragraphs,
            metadata={"hops": len(rels), "chain": tuple(path), "relations": rels},
        )

    def questions(self, split: str = "train") -> list[QAExample]:
        """The questions of `split` ("train" or "test"); the two share no question."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return list(self._questions[split])

    # ---- oracle ------------------------------------------------------------------------------
    def oracle_trajectory(self, example: QAExample, protocol: TagProtocol = SEARCH_R1) -> list[str]:
        """The agent turns that solve `example`: one search per hop with the hop's phrase as query,
        each turn first restating what the last passage said, then the answer. Every turn ends
        with its stop string, so a caller replays it with `env.step(turn)` turn by turn."""
        chain, rels = example.metadata["chain"], example.metadata["relations"]
        if self.follow(chain[0], rels) != list(chain):
            raise ValueError(f"{example.uid} does not belong to the world of seed {self.seed}")
        t, s, a = protocol.think, protocol.search, protocol.answer
        turns, known = [], ""
        for i, r in enumerate(rels):
            need = f"I need to find {relation_phrase(r, chain[i])}."
            turns.append(f"<{t}>{known}{need}</{t}>\n<{s}>{relation_phrase(r, chain[i])}</{s}>")
            phrase = relation_phrase(rels[i], chain[i])
            known = f"{phrase[0].upper()}{phrase[1:]} is {chain[i + 1]}. "
        answer = f"\\boxed{{{chain[-1]}}}" if protocol.boxed_answer else chain[-1]
        turns.append(f"<{t}>{known}So the answer is {chain[-1]}.</{t}>\n<{a}>{answer}</{a}>")
        return turns


@lru_cache(maxsize=8)
def _cached_world(
    seed: int, n_entities: int, n_relations: int, max_hops: int, questions_per_hop: int, test_fraction: float
) -> SyntheticWorld:
    return SyntheticWorld.generate(
        seed,
        n_entities,
        n_relations=n_relations,
        max_hops=max_hops,
        questions_per_hop=questions_per_hop,
        test_fraction=test_fraction,
    )


def synthetic_world(
    seed: int = 0,
    n_entities: int = 60,
    *,
    n_relations: int = 4,
    max_hops: int = 4,
    questions_per_hop: int = 150,
    test_fraction: float = 0.2,
) -> SyntheticWorld:
    """`SyntheticWorld.generate` with the result cached (worlds are immutable)."""
    return _cached_world(seed, n_entities, n_relations, max_hops, questions_per_hop, test_fraction)


@register_dataset("synthetic")
def synthetic_dataset(
    split: str = "train", seed: int = 0, n_entities: int = 60, **world_kwargs: int | float
) -> list[QAExample]:
    """The questions of one split of the synthetic world with these parameters."""
    return synthetic_world(seed, n_entities, **world_kwargs).questions(split)  # type: ignore[arg-type]
