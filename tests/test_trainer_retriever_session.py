"""The trainer's loopback retriever takes `retriever.encoder_backend` (issue 14: the encoder runtime
selectable from a run's config, not only from the serve/build CLIs)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from pvpo.retriever import encoder as enc
from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.setup import retriever_session


def test_an_unknown_encoder_backend_is_refused_at_config_load_listing_the_options() -> None:
    with pytest.raises(ConfigError, match=r"retriever\.encoder_backend:.*unknown encoder backend 'onx'.*onnx-int8"):
        load_config(None, ["retriever.encoder_backend=onx"])


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                    reason="encoder backend 'onnx' needs onnxruntime (pip install 'pvpo-search[onnx]')")  # fmt: skip
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
