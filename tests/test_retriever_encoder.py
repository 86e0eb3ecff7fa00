"""Encoder backends: ONNX Runtime / OpenVINO exports give torch's vectors (int8 close to them),
exports are cached outside the package, backend and dtype names are checked, and fp16 / bf16 on
GPU stay close to fp32."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from pvpo.retriever import encoder as encoder_mod
from pvpo.retriever.encoder import (
    Encoder,
    check_backend,
    check_dtype,
    default_backend,
    set_default_backend,
    set_default_dtype,
)
from pvpo.retriever.runtimes import ExportedEncoderModel
from pvpo.retriever.testing import TINY_CORPUS, TINY_QUERIES

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUERIES = [q for q, _ in TINY_QUERIES] + ["x", "a much longer query " * 40]  # 1 token to truncated
PASSAGES = [f'"{d["title"]}"\n{d["text"]}' for d in TINY_CORPUS]


def _needs(module: str, backend: str) -> None:
    from pvpo.retriever.runtimes import INSTALL_HINT

    if importlib.util.find_spec(module) is None:  # `make test` (CI) installs every backend's packages
        pytest.skip(f"encoder backend {backend!r} needs {module}, not installed here ({INSTALL_HINT[backend]})")


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    enc = Encoder(device="cpu", backend="torch")
    return enc.encode_queries(QUERIES), enc.encode_passages(PASSAGES, batch_size=4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encoder-cache")


@pytest.mark.parametrize(
    "backend,module,tol", [("onnx", "onnxruntime", 1e-5), ("openvino", "openvino", 1e-5)]
)  # OpenVINO f32 with its weights saved as float16 (save_model's default): 2.5e-4
def test_exported_backend_matches_torch(backend: str, module: str, tol: float, reference, cache: Path) -> None:
    _needs(module, backend)
    enc = Encoder(device="cpu", backend=backend, cache_dir=cache)
    assert enc.backend == backend
    q, p = enc.encode_queries(QUERIES), enc.encode_passages(PASSAGES, batch_size=4)
    assert q.dtype == np.float32 and q.shape == reference[0].shape
    assert np.abs(q - reference[0]).max() < tol and np.abs(p - reference[1]).max() < tol
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert any(cache.rglob("model.onnx")) and not any(Path(encoder_mod.__file__).parent.rglob("*.onnx"))


def test_int8_backend_stays_close_and_ranks_the_same(reference, cache: Path) -> None:
    _needs("onnxruntime", "onnx-int8")
    enc = Encoder(device="cpu", backend="onnx-int8", cache_dir=cache)
    q, p = enc.encode_queries(QUERIES[:8]), enc.encode_passages(PASSAGES)
    assert float(np.min(np.sum(q * reference[0][:8], axis=1))) > 0.9  # cosine to the fp32 vector
    assert ((q @ p.T).argmax(1) == (reference[0][:8] @ reference[1].T).argmax(1)).all()


def test_unknown_backend_and_dtype_are_named_with_the_options(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"unknown encoder backend 'onx'; options: torch, onnx, onnx-int8, openvino"):
        check_backend("onx")
    with pytest.raises(ValueError, match=r"unknown encoder dtype 'fp8'; options: float32, float16, bfloat16"):
        check_dtype("fp8")
    monkeypatch.setenv(encoder_mod.BACKEND_ENV, "tensorrt")
    with pytest.raises(ValueError, match=r"\$PVPO_ENCODER_BACKEND: unknown encoder backend 'tensorrt'"):
        default_backend("cpu")
    with pytest.raises(ValueError, match="runs on CPU only"):
        Encoder(device="cuda", backend="onnx")


def test_backend_precedence_process_then_env_then_default(monkeypatch) -> None:
    monkeypatch.delenv(encoder_mod.BACKEND_ENV, raising=False)
    assert default_backend("cpu") == (encoder_mod.DEFAULT_BACKEND, False)
    assert default_backend("cuda") == ("torch", False)
    monkeypatch.setenv(encoder_mod.BACKEND_ENV, "openvino")
    assert default_backend("cpu") == ("openvino", True)
    set_default_backend("onnx-int8")
    try:
        assert default_backend("cpu") == ("onnx-int8", True)
    finally:
        set_default_backend(None)


def test_missing_runtime_falls_back_to_torch_only_for_the_default(monkeypatch, caplog, cache: Path) -> None:
    from pvpo.retriever import runtimes

    def missing(module: str, backend: str):  # the package is not installed (the export may be cached)
        raise runtimes.MissingRuntime(f"encoder backend {backend!r} needs the {module} package")

    monkeypatch.setattr(runtimes, "_require", missing)
    monkeypatch.delenv(encoder_mod.BACKEND_ENV, raising=False)
    monkeypatch.setattr(encoder_mod, "DEFAULT_QUERY_BACKEND", "onnx")
    assert Encoder(device="cpu", cache_dir=cache, queries=True).backend == "torch"
    assert "encoding with torch instead" in caplog.text
    with pytest.raises(runtimes.MissingRuntime, match="needs the onnxruntime package"):
        Encoder(device="cpu", backend="onnx", cache_dir=cache)


def test_process_dtype_applies_and_half_precision_output_is_unit_float32(reference) -> None:
    import torch

    set_default_dtype("bfloat16")
    try:
        enc = Encoder(device="cpu", backend="torch")
    finally:
        set_default_dtype(None)
    assert enc.dtype == "bfloat16" and next(enc.model.parameters()).dtype == torch.bfloat16
    q = enc.encode_queries(QUERIES)
    assert q.dtype == np.float32 and np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(q * reference[0], axis=1))) > 0.98
    assert Encoder(device="cpu", backend="torch").dtype == "float32"
    with pytest.raises(ValueError, match="encoder dtype 'float16' needs backend 'torch'"):
        Encoder(device="cpu", backend="onnx", dtype="float16")


def test_openvino_computes_bfloat16_when_asked_and_refuses_float16(reference, cache: Path) -> None:
    """`--encoder-backend openvino --encoder-dtype bfloat16`: OpenVINO's bf16 precision hint
    (on a CPU without native bf16 OpenVINO computes f32 instead); the vectors stay unit-length
    float32 and rank the passages as torch's float32 ones do. float16 is torch's alone."""
    _needs("openvino", "openvino")
    enc = Encoder(device="cpu", backend="openvino", dtype="bfloat16", cache_dir=cache)
    assert enc.backend == "openvino" and enc.dtype == "bfloat16" and enc.runtime is not None
    assert enc.runtime.dtype == "bfloat16"
    q, p = enc.encode_queries(QUERIES), enc.encode_passages(PASSAGES, batch_size=4)
    assert q.dtype == np.float32 and np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(q * reference[0], axis=1))) > 0.99  # cosine to torch's float32 vector
    assert ((q @ p.T).argmax(1) == (reference[0] @ reference[1].T).argmax(1)).all()
    with pytest.raises(ValueError, match="encoder dtype 'float16' needs backend 'torch' .or 'openvino' for bfloat16"):
        Encoder(device="cpu", backend="openvino", dtype="float16", cache_dir=cache)
    with pytest.raises(ValueError, match="'onnx' computes float32 only"):
        ExportedEncoderModel(cache / "none.onnx", "onnx", dtype="bfloat16")


def test_openvino_gives_each_announced_caller_a_stream(cache: Path) -> None:
    """Two search workers calling one single-stream OpenVINO model ran one call at a time (1.1 of 2
    cores served); the workers' model now has a stream per worker, each with the worker's threads,
    and a lone caller's keeps one stream. The count a thread count was first made with stays."""
    _needs("openvino", "openvino")
    enc = Encoder(device="cpu", backend="openvino", cache_dir=cache)
    runtime = enc.runtime
    assert runtime is not None
    shared = runtime.runner(1, callers=2)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # OpenVINO makes no more streams than the process may use cores (one under `taskset -c 0`)
    assert int(shared.get_property("NUM_STREAMS")) == min(2, usable)
    assert runtime.runner(1) is shared  # made once, for as many callers as first announced
    alone = runtime.runner(2)
    assert int(alone.get_property("NUM_STREAMS")) == 1


def test_a_half_dtype_with_no_backend_named_encodes_queries_with_torch(reference) -> None:
    """A loaded index's query encoder defaults to ONNX (float32 only): with the process dtype at
    bfloat16 (the multi-hop recipe's `encoder_dtype: auto` on an AVX512-BF16 CPU) and no backend
    named, building it once stopped every such run with "needs backend 'torch'"."""
    set_default_dtype("bfloat16")
    try:
        enc = Encoder(device="cpu", queries=True)
    finally:
        set_default_dtype(None)
    assert enc.backend == "torch" and enc.dtype == "bfloat16"
    assert float(np.min(np.sum(enc.encode_queries(QUERIES) * reference[0], axis=1))) > 0.98
    assert Encoder(device="cpu", queries=True, backend="torch").dtype == "float32"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_on_gpu_stays_close_to_fp32(dtype: str, reference) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    enc = Encoder(device="cuda", dtype=dtype, query_batch_size=512)
    assert enc.backend == "torch" and next(enc.model.parameters()).dtype == getattr(torch, dtype)
    q = enc.encode_passages(PASSAGES * 64, batch_size=1024)[: len(PASSAGES)]
    assert q.dtype == np.float32
    assert float(np.min(np.sum(q * reference[1], axis=1))) > 0.99


def test_local_tokenizer_gives_the_ids_sentence_transformers_gives() -> None:
    from pvpo.retriever.runtimes import LocalTokenizer, local_model_config

    enc = Encoder(device="cpu", backend="torch")
    folder = Path(enc.path)
    config = local_model_config(folder)
    assert config is not None
    texts = [*QUERIES, "  Leading and TRAILING spaces  ", "Ünïcödé naïve café", "", "tab\tseparated\nlines"]
    texts.append("a passage of many words " * 100)  # past max_seq_length: truncated
    ours = LocalTokenizer(folder, enc.max_seq_length, lower_case=bool(config.get("do_lower_case")))(texts)
    theirs = (enc.model.preprocess if hasattr(enc.model, "preprocess") else enc.model.tokenize)(texts)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert ours[name].tolist() == theirs[name].tolist(), name
    assert ours["input_ids"].shape[1] == enc.max_seq_length  # the long text is truncated as theirs


def test_a_cached_export_encodes_queries_without_importing_torch(cache: Path, reference) -> None:
    import subprocess
    import sys

    Encoder(device="cpu", backend="onnx", cache_dir=cache)  # exports into the cache once
    code = (
        "import sys, numpy as np\n"
        "from pvpo.retriever.encoder import Encoder\n"
        f"enc = Encoder(device='cpu', queries=True, cache_dir={str(cache)!r})\n"
        f"np.save(sys.argv[1], enc.encode_queries({QUERIES!r}))\n"
        "print(enc.backend, sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules))\n"
    )
    out = cache / "queries.npy"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, env={**os.environ}, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "onnx []"
    assert np.abs(np.load(out) - reference[0]).max() < 1e-5


def test_served_query_vectors_rank_as_search_r1s_mean_pooled_encoder(reference) -> None:
    """Search-R1's retrieval_server.py encodes a query with transformers' AutoModel, mean pooling
    over the attention mask and L2 normalisation, in float32, one request at a time: the served
    encoder (the exported runtime) must give the same top-k passages."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    enc = Encoder(device="cpu", queries=True)
    assert enc.backend == encoder_mod.DEFAULT_QUERY_BACKEND
    model, tok = AutoModel.from_pretrained(enc.path).eval(), AutoTokenizer.from_pretrained(enc.path)
    theirs = []
    with torch.no_grad():
        for q in QUERIES:
            inputs = tok([q], max_length=256, padding=True, truncation=True, return_tensors="pt")
            hidden = model(**inputs).last_hidden_state.masked_fill(~inputs["attention_mask"][..., None].bool(), 0.0)
            pooled = hidden.sum(dim=1) / inputs["attention_mask"].sum(dim=1)[..., None]
            theirs.append(torch.nn.functional.normalize(pooled, dim=-1)[0].numpy())
    ours = np.stack([enc.encode_queries([q])[0] for q in QUERIES])
    passages = reference[1]
    assert np.abs(ours - np.stack(theirs)).max() < 1e-5

    def top5(queries: np.ndarray) -> np.ndarray:
        return np.argsort(-(queries @ passages.T), axis=1)[:, :5]

    assert (top5(ours) == top5(np.stack(theirs))).all()
