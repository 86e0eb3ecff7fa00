"""Shared by the trainer's tests: a small synthetic world, an in-memory searcher over it, a tiny
policy fixture, the overrides of a tiny training run, and a scripted stand-in model."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import pytest
import torch

from pvpo.envs.synthetic import SyntheticWorld
from pvpo.retriever.types import Passage
from pvpo.trainer.config.policy import TinyModelConfig
from pvpo.trainer.model.policy import build_tiny_model, build_tiny_policy, train_tokenizer
from pvpo.trainer.rollout.trajectory import Trajectory

TAGS = ("think", "search", "information", "answer")
WORLD = SyntheticWorld.generate(0, 12, n_relations=2, max_hops=2, questions_per_hop=6)


class OverlapSearcher:
    """In-memory Searcher: passages ranked by word overlap with the query."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        def words(s: str) -> set[str]:
            return set(re.findall(r"\w+", s.lower()))

        return [sorted(self.passages, key=lambda p: -len(words(q) & words(p.contents)))[: topk or 2] for q in queries]


@pytest.fixture(scope="module")
def policy():
    texts = [p.contents for p in WORLD.passages] + [q.question for q in WORLD.questions("train")]
    return build_tiny_policy(
        texts,
        TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=400
        ),
        tags=TAGS,
        seed=0,
    )


TINY = [
    "data.synthetic.n_entities=12",
    "data.synthetic.n_relations=2",
    "data.synthetic.max_hops=2",
    "data.synthetic.questions_per_hop=6",
    "model.tiny.vocab_size=400",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "rollout.n=2",
    "data.prompts_per_step=2",
    "rollout.max_new_tokens=10",
    "rollout.max_turns=2",
    "rollout.max_response_tokens=120",
    "algorithm.anchor.num_rollouts=2",
    "data.max_eval_examples=2",
    "run.tensorboard=false",
]


class ScriptedLM(torch.nn.Module):
    """A 'model' whose next token is scripted per row (logit 30 on it), to test the sampler's
    stopping rules independently of what a random model would write."""

    def __init__(self, scripts: list[list[int]], vocab: int) -> None:
        super().__init__()
        self.scripts, self.vocab, self.calls = scripts, vocab, 0
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        from types import SimpleNamespace

        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for i, script in enumerate(self.scripts[: input_ids.shape[0]]):
            logits[i, -1, script[min(self.calls, len(script) - 1)]] = 30.0
        self.calls += 1
        return SimpleNamespace(logits=logits, past_key_values=None)


# ---- a small model over a toy vocabulary, and random multi-turn trajectories for it -------------
SMALL_MODEL = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=300
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], vocab_size=300)


def small_model(tok):
    return build_tiny_model(tok, SMALL_MODEL, seed=1)


def random_trajectories(n: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories of very different lengths, env tokens between model turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = Trajectory(uid=f"q{i // 2}", prompt_ids=[rng.randrange(1, vocab) for _ in range(rng.randint(3, 12))])
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(2, 30)
            t.append_model([rng.randrange(1, vocab) for _ in range(k)], [-rng.random() * 3 for _ in range(k)])
            t.append_env([rng.randrange(1, vocab) for _ in range(rng.randint(0, 9))])
        t.reward = rng.random()
        out.append(t)
    return out


def gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]
