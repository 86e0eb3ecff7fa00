"""What a run builds before its first step: the loopback retriever with `retriever.encoder_backend`,
and a saved HF model folder as the policy, with Search-R1's prompt and chat template."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from pvpo.retriever import encoder as enc
from pvpo.trainer.config.schema import ConfigError, TinyModelConfig, load_config
from pvpo.trainer.setup import retriever_session


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

    from pvpo.trainer.loop import train
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy
    from pvpo.trainer.setup import episode_config

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
        episode_config(cfg)
        .prompt(ex)
        .startswith("Answer the given question. You must conduct reasoning inside <think>")
    )
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "checkpoints" / "step_000001" / "policy"))
    assert saved.config.num_hidden_layers == 1
