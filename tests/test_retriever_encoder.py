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
from pvpo.retriever.testing import TINY_CORPUS, TINY_QUERIES

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUERIES = [q for q, _ in TINY_QUERIES] + ["x", "a much longer query " * 40]  # 1 token to truncated
PASSAGES = [f'"{d["title"]}"\n{d["text"]}' for d in TINY_CORPUS]


def _needs(module: str, backend: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"encoder backend {backend!r} needs {module}, not installed here (pip install 'pvpo-search[onnx]')")


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    enc = Encoder(device="cpu", backend="torch")
    return enc.encode_queries(QUERIES), enc.encode_passages(PASSAGES, batch_size=4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encoder-cache")


@pytest.mark.parametrize(
    "backend,module,tol", [("onnx", "onnxruntime", 1e-5), ("openvino", "openvino", 1e-3)]
)  # OpenVINO f32: 2.5e-4 measured
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

    def missing(*a, **k):
        raise runtimes.MissingRuntime("encoder backend 'onnx' needs the onnxruntime package")

    monkeypatch.setattr(runtimes, "exported_model", missing)
    monkeypatch.delenv(encoder_mod.BACKEND_ENV, raising=False)
    monkeypatch.setattr(encoder_mod, "DEFAULT_BACKEND", "onnx")
    assert Encoder(device="cpu", cache_dir=cache).backend == "torch"
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
