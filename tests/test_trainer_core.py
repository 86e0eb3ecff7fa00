"""Trainer core: config loading, the HF engine, token-exact trajectories, zero gradient on env
tokens, and exact resume after a crash."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
import torch

from pvpo.envs.synthetic import SyntheticWorld
from pvpo.retriever.types import Passage
from pvpo.trainer.config.schema import ConfigError, TinyModelConfig, load_config
from pvpo.trainer.model.policy import build_tiny_policy
from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.hf_engine import HFEngine

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


# ---- config ------------------------------------------------------------------------------------
def test_config_unknown_key_fails_naming_it():
    with pytest.raises(ConfigError, match=r"optim\.lrr: unknown key"):
        load_config(None, ["optim.lrr=0.1"])


def test_config_bad_value_and_unknown_estimator_name_the_key():
    with pytest.raises(ConfigError, match=r"rollout\.temperature"):
        load_config(None, ["rollout.temperature=-1"])
    with pytest.raises(ConfigError, match=r"algorithm\.estimator.*unknown advantage estimator"):
        load_config(None, ["algorithm.estimator=nope"])


def test_config_overrides_parse_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 0.5}\nrun: {steps: 3}\n")
    cfg = load_config(path, ["run.steps=7", "algorithm.anchor.refresh_from=current"])
    assert (cfg.optim.lr, cfg.run.steps, cfg.algorithm.anchor.refresh_from) == (0.5, 7, "current")


# ---- engine ------------------------------------------------------------------------------------
def test_engine_logprobs_match_recomputation_with_left_padding(policy):
    from pvpo.trainer.algorithms.losses import token_logprobs

    eng = HFEngine(policy.model, policy.tokenizer)
    prompts = [policy.tokenizer.encode("Who is the rival of"), policy.tokenizer.encode("Q")]
    for temp in (1.0, 0.7):
        outs = eng.generate(prompts, SamplingConfig(temperature=temp, max_new_tokens=12, seed=3))
        for p, c in zip(prompts, outs):
            ids = torch.tensor([list(p) + c.token_ids])
            with torch.no_grad():
                logits = policy.model(ids).logits[:, len(p) - 1 : -1]
            ref = token_logprobs(logits, torch.tensor([c.token_ids]), temp)[0]
            assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-4)


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


def test_engine_stops_after_stop_string_or_eos_and_keeps_sampled_ids(policy):
    tok = policy.tokenizer
    search = tok.encode("<think>hm</think><search>the mentor of Zaro</search> junk after", add_special_tokens=False)
    answer = tok.encode("<answer>Kelmo", add_special_tokens=False) + [tok.eos_token_id] + tok.encode(" more")
    eng = HFEngine(ScriptedLM([search, answer, search], len(tok)), tok)
    out = eng.generate(
        [[1, 2], [3], [4, 5, 6]], SamplingConfig(max_new_tokens=40, seed=0, stop=("</search>", "</answer>"))
    )
    end = search.index(tok.convert_tokens_to_ids("</search>")) + 1
    assert out[0].token_ids == search[:end] and out[0].finish_reason == "stop" and out[0].stop_string == "</search>"
    assert out[1].token_ids == answer[: answer.index(tok.eos_token_id) + 1] and out[1].finish_reason == "eos"
    eng = HFEngine(ScriptedLM([search], len(tok)), tok)
    short = eng.generate([[1]], SamplingConfig(max_new_tokens=3, seed=0, stop=("</search>",)))[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3


def test_engine_is_seeded(policy):
    eng = HFEngine(policy.model, policy.tokenizer)
    prompts = [policy.tokenizer.encode("The mentor of")] * 4
    s = SamplingConfig(max_new_tokens=20, seed=11)
    assert [c.token_ids for c in eng.generate(prompts, s)] == [c.token_ids for c in eng.generate(prompts, s)]
