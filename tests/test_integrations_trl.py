"""Our search environment and PVPO's anchor inside TRL's GRPOTrainer, for real: a tiny
Qwen2 built from a config (byte-level BPE trained here, Qwen2.5's tool-calling chat template from
TRL), warm-started in a few seconds to call the tools, then trained 2 GRPO steps on CPU against the
tiny retriever served on loopback. Installs nothing (trl is in the dev extra)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl", reason="trl is in the dev extra (Python >= 3.11): pip install -e '.[dev]'")

import torch  # noqa: E402
from retriever_support import CountingRetriever  # noqa: E402

from pvpo.envs import QAExample  # noqa: E402
from pvpo.envs.episode import Episode  # noqa: E402
from pvpo.integrations.trl import (  # noqa: E402
    PVPOGRPOTrainer,
    SearchEnvFactory,
    SearchRollout,
    search_dataset,
    search_reward,
    tool_prompt,
)
from pvpo.retriever.server import BackgroundServer  # noqa: E402
from pvpo.reward import get_reward  # noqa: E402
from pvpo.trainer.reference.anchor import AnchorStore  # noqa: E402

# (question, golden answer, the query and the answer the warm-started policy learns): the first
# answer is right (pvpo reward 1.0), the second misses the gold's first name (cover-EM 0, pvpo's
# floor 0.1 for a well-formed answer; em would give 0)
QUESTIONS = [
    ("What is the capital of Germany?", "Berlin", "capital of Germany", "Berlin"),
    ("Who discovered penicillin?", "Alexander Fleming", "who discovered penicillin", "Fleming"),
]
EXAMPLES = [QAExample(f"q{i}", q, (gold,)) for i, (q, gold, _, _) in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def served(tiny):
    counting = CountingRetriever(tiny)
    with BackgroundServer(counting) as server:
        yield server.url, counting


def environment(url: str) -> SearchEnvFactory:
    return SearchEnvFactory(url, reward="pvpo", topk=1, max_obs_chars=200, max_turns=4)


@pytest.fixture(scope="module")
def warm_policy(served):
    factory = environment(served[0])
    yield tool_calling_policy(factory)
    factory.close()


@pytest.fixture
def policy(warm_policy):
    """A fresh copy of the warm-started policy for each test (training changes its weights)."""
    model, tok = warm_policy
    return copy.deepcopy(model), tok


def tool_calling_policy(factory: SearchEnvFactory) -> tuple[Any, Any]:
    """A tiny Qwen2 and its tokenizer (Qwen2.5's chat template, so TRL parses its tool calls),
    trained for a few seconds on the tool-calling conversation of each question."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    env = factory()
    tools = [env.answer, env.search]  # TRL lists an environment's tools by name (inspect.getmembers)
    conversations = []
    for (question, _, query, answer), ex in zip(QUESTIONS, EXAMPLES):
        env.reset(uid=ex.uid, question=question, golden_answers=list(ex.golden_answers))
        conversations.append(
            [
                {"role": "user", "content": tool_prompt(question)},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": query}}}],
                },
                {"role": "tool", "name": "search", "content": env.search(query)},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "answer", "arguments": {"answer": answer}}}
                    ],
                },
                {"role": "tool", "name": "answer", "content": env.answer(answer)},
                {"role": "assistant", "content": "Done."},
            ]
        )
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen2_5_chat_template
    texts = [tok.apply_chat_template(c, tools=tools, tokenize=False) for c in conversations]
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=special,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tok.chat_template, tok.padding_side = qwen2_5_chat_template, "left"
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    batch = tok(
        [tok.apply_chat_template(c, tools=tools, tokenize=False) for c in conversations],
        return_tensors="pt",
        padding=True,
    )
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(300):  # measured: loss < 0.01 well before the end
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"the warm start did not fit its two conversations (loss {loss.item():.3f})"
    return model, tok


def grpo_config(tmp_path: Path) -> Any:
    return trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=400,
        max_tool_calling_iterations=4,
        temperature=0.2,
        learning_rate=1e-5,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )


def rewards_logged(trainer: Any, source: str) -> list[float]:
    return [entry[f"rewards/{source}/mean"] for entry in trainer.state.log_history if f"rewards/{source}/mean" in entry]


@pytest.mark.slow
def test_grpo_trainer_trains_two_steps_with_our_environment_retriever_and_reward(served, policy, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    url, counting = served
    factory, (model, tok) = environment(url), policy
    warm_queries = len(counting.queries)

    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tok,
        args=grpo_config(tmp_path),
        train_dataset=search_dataset(EXAMPLES),
        environment_factory=factory,
    )
    trainer.train()

    # the searches reached the retriever, over HTTP through our client and server
    searched = counting.queries[warm_queries:]
    assert searched, "no search reached the retriever during training"
    assert sum(len(ep["queries"]) for ep in factory.finished) == len(searched)
    # 2 steps x 2 prompts x 2 generations episodes, each scored by our pvpo reward ...
    assert len(factory.finished) == 8
    for ep in factory.finished:
        recomputed = get_reward("pvpo")(ep["judged_response"], ep["golden_answers"])
        assert ep["reward"] == pytest.approx(recomputed.total)
    assert any(ep["reward"] > 0 for ep in factory.finished), "the warm-started policy never answered"
    # ... and those are the rewards TRL trained on (the environment's reward source, per step)
    logged = rewards_logged(trainer, "SearchToolEnv")
    assert len(logged) == 2
    for step, value in enumerate(logged):
        ours = [ep["reward"] for ep in factory.finished[4 * step : 4 * step + 4]]
        assert value == pytest.approx(sum(ours) / 4, abs=1e-6)
    factory.close()


@pytest.mark.slow
def test_pvpo_trainer_builds_the_anchor_from_reference_rollouts_and_trains_on_r_minus_anchor(
    served, policy, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    factory, (model, tok) = environment(served[0]), policy
    anchor_file = tmp_path / "anchor.json"

    trainer = PVPOGRPOTrainer(
        model=model,
        processing_class=tok,
        args=grpo_config(tmp_path),
        train_dataset=search_dataset(EXAMPLES),
        environment_factory=factory,
        anchors=anchor_file,
        anchor_rollouts=2,
    )
    trainer.train()

    # the anchor: 2 reference rollouts per prompt (the first 4 episodes), their mean reward per uid, saved
    reference, training = factory.finished[:4], factory.finished[4:]
    assert len(training) == 8
    store = AnchorStore.load(anchor_file)
    assert set(store) == {"q0", "q1"} and store.num_rollouts == 2
    for uid in ("q0", "q1"):
        mine = [ep["reward"] for ep in reference if ep["uid"] == uid]
        assert len(mine) == 2 and store[uid].n == 2
        assert store[uid].mean_reward == pytest.approx(sum(mine) / 2)
        assert store[uid].accuracy == pytest.approx(
            sum(ep["metrics"]["em"] for ep in reference if ep["uid"] == uid) / 2
        )
    assert json.loads(anchor_file.read_text())["source"] == "initial"
    # the advantages that trained are r - anchor[uid], not GRPO's normalised ones
    logged = [e["pvpo/advantage_mean"] for e in trainer.state.log_history if "pvpo/advantage_mean" in e]
    assert len(logged) == 2
    for step, value in enumerate(logged):
        batch = training[4 * step : 4 * step + 4]
        expected = sum(ep["reward"] - store[ep["uid"]].mean_reward for ep in batch) / 4
        assert value == pytest.approx(expected, abs=1e-6)
    assert not any(math.isnan(e.get("pvpo/anchor_mean", 0.0)) for e in trainer.state.log_history)
    factory.close()


@pytest.mark.slow
def test_pvpo_trainer_with_a_given_anchor_trains_on_r_minus_anchor_where_grpo_would_give_zero(
    served, policy, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    factory, (model, tok) = environment(served[0]), policy
    store = AnchorStore(tmp_path / "anchor.json")  # as `pvpo train` writes it
    store.update("q0", [0.25], [0.0])
    store.update("q1", [0.6], [1.0])
    store.save()

    trainer = PVPOGRPOTrainer(
        model=model,
        processing_class=tok,
        args=grpo_config(tmp_path),
        train_dataset=search_dataset(EXAMPLES),
        environment_factory=factory,
        anchors=tmp_path / "anchor.json",
    )
    trainer.train()

    assert len(factory.finished) == 8  # no reference rollouts: the anchor was given
    logged = [e["pvpo/advantage_mean"] for e in trainer.state.log_history if "pvpo/advantage_mean" in e]
    anchors = {"q0": 0.25, "q1": 0.6}
    for step, value in enumerate(logged):
        batch = factory.finished[4 * step : 4 * step + 4]
        expected = sum(ep["reward"] - anchors[ep["uid"]] for ep in batch) / 4
        assert value == pytest.approx(expected, abs=1e-6)
    # (measured: the warm-started policy answers each question the same way every time, so GRPO's
    # groups have zero spread and advantage 0; PVPO's static baseline still gives a signal)
    assert len(logged) == 2 and all(abs(v) > 0.01 for v in logged)
    factory.close()


# ---- the tag protocol: rollout_func ---------------------------------------------------------------


def tag_policy(rollout: SearchRollout) -> tuple[Any, Any]:
    """A tiny Qwen2 and a BPE whose tags are whole tokens, trained for a few seconds on the
    Search-R1-style text of each question (its observation from the real retriever)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    episodes = []
    for (_, _, query, answer), ex in zip(QUESTIONS, EXAMPLES):
        ep = Episode(ex, rollout.config, rollout.config.reward_fn())
        turn1, turn2 = f"<think>look it up</think><search> {query} </search>", f"<answer> {answer} </answer>"
        passages = rollout.retriever.search([ep.begin_step(turn1)], rollout.config.topk)[0]
        episodes.append((ep.prompt, turn1, ep.finish_step(passages).observation, turn2))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ["".join(e) for e in episodes],
        trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=["<|endoftext|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_tokens([f"<{c}{t}>" for t in ("think", "search", "information", "answer") for c in ("", "/")])
    tok.padding_side = "left"
    rows = [
        tok(p)["input_ids"]
        + sum((tok.encode(t, add_special_tokens=False) for t in (t1, o, t2)), [])
        + [tok.eos_token_id]
        for p, t1, o, t2 in episodes
    ]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"the warm start did not fit its two episodes (loss {loss.item():.3f})"
    return model, tok


@pytest.mark.slow
def test_the_tag_protocol_rollout_trains_pvpo_with_masked_observations_and_our_reward(served, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    url, counting = served
    rollout = SearchRollout(EXAMPLES, url, reward="pvpo", topk=1, max_obs_chars=200, max_turns=4, max_turn_tokens=64)
    model, tok = tag_policy(rollout)
    before = len(counting.queries)

    trainer = PVPOGRPOTrainer(
        model=model,
        processing_class=tok,
        args=grpo_config(tmp_path),
        reward_funcs=search_reward,
        train_dataset=rollout.dataset(),
        rollout_func=rollout,
        anchors=tmp_path / "anchor.json",
        anchor_rollouts=2,
    )
    trainer.train()

    assert len(counting.queries) > before, "no search reached the retriever"
    reference, training = rollout.finished[:4], rollout.finished[4:]
    assert len(training) == 8
    for ep in rollout.finished:  # every reward is our pvpo reward of the episode's transcript
        assert ep["reward"] == pytest.approx(get_reward("pvpo")(ep["judged_response"], ep["golden_answers"]).total)
    assert any(ep["reward"] == 1.0 for ep in training)
    logged = rewards_logged(trainer, "search_reward")
    assert [round(v, 6) for v in logged] == [
        round(sum(ep["reward"] for ep in training[4 * s : 4 * s + 4]) / 4, 6) for s in range(2)
    ]
    store = AnchorStore.load(tmp_path / "anchor.json")  # accuracy: the episodes' exact match
    assert store["q0"].accuracy == pytest.approx(sum(ep["metrics"]["em"] for ep in reference if ep["uid"] == "q0") / 2)
    # the last batch: model tokens as generated, the retriever's text tokenized and masked out
    last = rollout.last
    for ids, env_mask in zip(last["completion_ids"], last["env_mask"]):
        assert len(ids) == len(env_mask) and env_mask[0] == 1
        observed = [t for t, m in zip(ids, env_mask) if m == 0]
        if observed:
            assert tok.decode(observed).startswith("\n\n<information>Doc 1(Title:")
    assert all(len(lp) == len(ids) for lp, ids in zip(last["logprobs"], last["completion_ids"]))
    rollout.close()
