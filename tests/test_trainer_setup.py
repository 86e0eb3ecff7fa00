"""What a run builds before its first step: the loopback retriever with `retriever.encoder_backend`,
and a saved HF model folder as the policy, with Search-R1's prompt and chat template."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pvpo.retriever import encoder as enc
from pvpo.trainer.config.policy import TinyModelConfig
from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.data import retriever_session


def test_an_unknown_encoder_backend_is_refused_at_config_load_listing_the_options() -> None:
    with pytest.raises(ConfigError, match=r"retriever\.encoder_backend:.*unknown encoder backend 'onx'.*onnx-int8"):
        load_config(None, ["retriever.encoder_backend=onx"])


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason="encoder backend 'onnx' needs onnxruntime (pip install 'pvpo-search[onnx]')",
)
def test_the_loopback_server_encodes_with_the_configured_backend_then_restores_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(enc.BACKEND_ENV, raising=False)
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": str(i), "contents": f'"Title {i}"\npassage number {i} about topic {i % 3}'} for i in range(12)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ["retriever.encoder_backend=onnx", "retriever.topk=2"])
    with retriever_session(cfg, tmp_path, corpus) as client:
        assert enc.default_backend("cpu") == ("onnx", True)
        info = httpx.get(f"{client.urls[0]}/info", timeout=30).json()
        assert info["encoder"]["backend"] == "onnx"
        [hits] = client.search(["passage number 4 about topic 1"])
        assert [p.id for p in hits][0] == "4"
    assert enc.default_backend("cpu") == (enc.DEFAULT_BACKEND, False)


def test_a_saved_hf_model_folder_trains_with_search_r1s_prompt_and_chat_template(tmp_path):
    from trainer_support import TINY as TINY_RUN
    from trainer_support import WORLD, OverlapSearcher
    from transformers import AutoModelForCausalLM

    from pvpo.trainer.data import agent_settings
    from pvpo.trainer.loop import train
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy

    texts = [p.contents for p in WORLD.passages] + [q.question for q in WORLD.questions("train")]
    policy = build_tiny_policy(
        texts,
        TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=400
        ),
        tags=("think", "search", "information", "answer"),
    )
    policy.tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    folder = tmp_path / "hf_model"
    save_policy(policy, folder)
    over = [
        *TINY_RUN,
        f"model.path={folder}",
        "model.chat_template=true",
        "env.prompt_template=search_r1",
        "run.steps=1",
    ]
    cfg = load_config(None, over)
    ex = WORLD.questions("train")[0]
    assert (
        agent_settings(cfg)
        .episode()
        .prompt(ex)
        .startswith("Answer the given question. You must conduct reasoning inside <think>")
    )
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "checkpoints" / "step_000001" / "policy"))
    assert saved.config.num_hidden_layers == 1


def _qa_file(folder: Path, n: int, tag: str) -> str:
    """A HotpotQA-format file of `n` questions with one paragraph each, in a folder named `tag`."""
    folder.mkdir(parents=True)
    rows = [
        {
            "_id": str(i),
            "question": f"{tag} question {i}?",
            "answer": f"{tag} answer {i}",
            "context": [[f"{tag} title {i}", [f"{tag} answer {i} is the answer."]]],
            "supporting_facts": [[f"{tag} title {i}", 0]],
            "type": "bridge",
        }
        for i in range(n)
    ]
    (folder / "questions.json").write_text(json.dumps(rows))
    return str(folder / "questions.json")


def test_a_list_of_qa_files_is_one_pool_indexed_from_the_questions_paragraphs_with_the_held_out_set_written(
    tmp_path: Path,
) -> None:
    from pvpo.envs.corpus import read_corpus
    from pvpo.envs.loaders import load_dataset
    from pvpo.trainer.data import load_data

    a, b = _qa_file(tmp_path / "alpha", 6, "alpha"), _qa_file(tmp_path / "beta", 4, "beta")
    cfg = load_config(
        None, [f"data.source=[{a}, {b}]", "data.corpus=questions", "data.held_out_examples=3", "data.shuffle_seed=0"]
    )
    run = tmp_path / "run"
    data = load_data(cfg, run)
    uids = {ex.uid for ex in data.train} | {ex.uid for ex in data.eval}
    assert len(data.train) == 7 and len(data.eval) == 3 and len(uids) == 10
    assert {u.split("/")[0] for u in uids} == {"alpha", "beta"}
    # the corpus is every question's paragraph, the held-out questions' included
    assert data.corpus_path is not None and len(read_corpus(data.corpus_path)) == 10
    held = load_dataset(run / "held_out.jsonl")
    assert [q.question for q in held] == [q.question for q in data.eval]
    assert [q.golden_answers for q in held] == [q.golden_answers for q in data.eval]


def test_the_same_qa_file_given_twice_is_refused_naming_the_repeated_uid(tmp_path: Path) -> None:
    from pvpo.trainer.data import load_data

    a = _qa_file(tmp_path / "alpha", 2, "alpha")
    cfg = load_config(None, [f"data.source=[{a}, {a}]"])
    with pytest.raises(ValueError, match=r"uid 'alpha/0' occurs twice"):
        load_data(cfg, tmp_path / "run")


def test_data_corpus_questions_is_refused_for_questions_without_paragraphs(tmp_path: Path) -> None:
    from pvpo.trainer.data import load_data

    src = tmp_path / "nq" / "test.jsonl"
    src.parent.mkdir()
    src.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    cfg = load_config(None, [f"data.source={src}", "data.corpus=questions"])
    with pytest.raises(ValueError, match="data.corpus=questions: the questions ship no paragraphs"):
        load_data(cfg, tmp_path / "run")


def test_the_trained_policy_loads_a_float32_checkpoint_unrounded_when_the_run_computes_in_bf16(tmp_path: Path) -> None:
    """`model.dtype` is the compute dtype: the master weights load in float32, so a float32
    checkpoint (the catalog's SmolLM2) is not rounded through bf16, neither on a fresh run nor
    when a resumed run reloads its saved initial policy."""
    from types import SimpleNamespace

    import torch
    from trainer_support import TINY

    from pvpo.trainer.model.policy import policy_from_config, save_policy
    from pvpo.trainer.setup import initial_policy
    from pvpo.trainer.state.run_dir import RunDir

    texts = ["Berlin is the capital of Germany.", "Who wrote Faust?"]
    tags = ("think", "search", "information", "answer")
    saved = policy_from_config(load_config(None, TINY).model, corpus_texts=texts, tags=tags, seed=0)
    folder = tmp_path / "checkpoint"
    save_policy(saved, folder)
    stored = {k: v.clone() for k, v in saved.model.state_dict().items()}
    assert any(not torch.equal(v, v.bfloat16().float()) for v in stored.values())  # bf16 would round them

    cfg = load_config(None, [f"model.path={folder}", "model.dtype=bfloat16"])
    data: Any = SimpleNamespace(texts=[])
    run_dir = tmp_path / "run"
    for expect_fresh in (True, False):
        policy, fresh = initial_policy(cfg, data, run_dir)
        assert fresh is expect_fresh
        loaded = policy.model.state_dict()
        assert all(loaded[k].dtype == torch.float32 and torch.equal(loaded[k], v) for k, v in stored.items())
        save_policy(policy, RunDir(run_dir).initial_policy)  # what a fresh run leaves for a resume


def test_a_held_out_mapping_draws_that_many_questions_of_each_dataset_and_validation_apart(tmp_path: Path) -> None:
    from pvpo.envs.loaders import load_dataset
    from pvpo.trainer.data import load_data

    a, b, c = (_qa_file(tmp_path / n, k, n) for n, k in (("alpha", 8), ("beta", 6), ("gamma", 5)))
    cfg = load_config(
        None,
        [
            f"data.source=[{a}, {b}, {c}]",
            "data.corpus=questions",
            "data.held_out_examples={alpha: 3, beta: 2}",
            "data.validation_examples={alpha: 1, gamma: 5}",
            "data.max_eval_examples=null",
            "data.shuffle_seed=0",
        ],
    )
    run = tmp_path / "run"
    data = load_data(cfg, run)
    held = [q.uid.split("/")[0] for q in data.eval]
    assert sorted(held) == ["alpha"] * 3 + ["beta"] * 2
    # one file a dataset, for `pvpo eval --dataset` per column
    assert sorted(p.name for p in (run / "held_out").iterdir()) == ["alpha.jsonl", "beta.jsonl"]
    assert len(load_dataset(run / "held_out" / "alpha.jsonl")) == 3
    val = load_dataset(run / "validation.jsonl")
    assert sorted(q.question.split()[0] for q in val) == ["alpha"] + ["gamma"] * 5
    # no question in two splits: held-out, validation, the rest (RL prompts)
    assert not {q.question for q in data.eval} & {q.question for q in val}
    assert not ({q.question for q in data.eval} | {q.question for q in val}) & {q.question for q in data.train}
    assert len(data.train) == 19 - 5 - 6


def test_evaluate_on_validation_evaluates_the_validation_split_and_still_records_the_held_out_one(
    tmp_path: Path,
) -> None:
    from pvpo.envs.loaders import load_dataset
    from pvpo.trainer.data import load_data

    a, b = _qa_file(tmp_path / "alpha", 8, "alpha"), _qa_file(tmp_path / "beta", 8, "beta")
    base = [f"data.source=[{a}, {b}]", "data.corpus=questions", "data.shuffle_seed=0", "data.max_eval_examples=null"]
    split = ["data.held_out_examples={alpha: 2, beta: 2}", "data.validation_examples=3"]
    held = load_data(load_config(None, base + split), tmp_path / "h")
    val = load_data(load_config(None, [*base, *split, "data.evaluate_on=validation"]), tmp_path / "v")
    assert [q.question for q in val.eval] == [q.question for q in load_dataset(tmp_path / "v" / "validation.jsonl")]
    assert [q.question for q in load_dataset(tmp_path / "v" / "held_out.jsonl")] == [q.question for q in held.eval]
    assert not {q.uid for q in val.eval} & {q.uid for q in held.eval}
    assert [q.uid for q in val.train] == [q.uid for q in held.train]  # the same RL prompts either way


def test_a_held_out_mapping_naming_an_unknown_dataset_lists_the_pools_datasets(tmp_path: Path) -> None:
    from pvpo.trainer.data import load_data

    a = _qa_file(tmp_path / "alpha", 4, "alpha")
    with pytest.raises(
        ValueError, match=r"data.held_out_examples: no question of dataset\(s\) \['beta'\].*\['alpha'\]"
    ):
        load_data(load_config(None, [f"data.source=[{a}]", "data.held_out_examples={beta: 1}"]), tmp_path / "r")
    with pytest.raises(ConfigError, match="evaluate_on=validation needs data.validation_examples"):
        load_config(None, [f"data.source=[{a}]", "data.evaluate_on=validation"])


def test_a_validation_run_and_a_held_out_run_search_one_corpus_holding_every_splits_paragraphs(tmp_path: Path) -> None:
    from pvpo.envs.corpus import read_corpus
    from pvpo.trainer.data import load_data

    a, b = _qa_file(tmp_path / "alpha", 8, "alpha"), _qa_file(tmp_path / "beta", 8, "beta")
    base = [f"data.source=[{a}, {b}]", "data.corpus=questions", "data.shuffle_seed=0", "data.max_eval_examples=null"]
    split = ["data.held_out_examples={alpha: 2, beta: 2}", "data.validation_examples=3"]
    held = load_data(load_config(None, base + split), tmp_path / "h")
    val = load_data(load_config(None, [*base, *split, "data.evaluate_on=validation"]), tmp_path / "v")
    corpus_h, corpus_v = (read_corpus(d.corpus_path) for d in (held, val) if d.corpus_path is not None)
    # all 16 questions' paragraphs in both: the held-out run's index holds the validation questions' and back
    assert len(corpus_h) == len(corpus_v) == 16
    assert [p.contents for p in corpus_h] == [p.contents for p in corpus_v]
    # the split watched every run.eval_every steps is the validation one in both modes
    assert [q.uid for q in held.validation] == [q.uid for q in val.validation] == [q.uid for q in val.eval]
    assert not {q.uid for q in held.validation} & {q.uid for q in held.eval}
