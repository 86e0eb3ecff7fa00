"""Exported encoder runtimes: a sentence-transformers model (transformer + pooling + normalise)
exported once to ONNX from the local weights, then run by ONNX Runtime (fp32, or int8 with
dynamic quantisation) or by OpenVINO. Exports are cached per model in a cache directory
(`PVPO_CACHE_DIR`, default ~/.cache/pvpo/encoders), never inside the package; nothing is
downloaded.

sentence-transformers' own `backend="onnx"` / `"openvino"` go through `optimum`, whose releases
pin transformers < 4.58 (this project runs transformers 5.x) and, for optimum-intel, pull a CUDA
torch: rejected for that reason. The export here is torch.onnx's TorchScript tracer on a wrapper
of the loaded model, so it needs only `onnx` (plus `onnxruntime` or `openvino` to run)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pvpo.retriever.thread_budget import cpu_cores, thread_budget

log = logging.getLogger(__name__)

RUNTIMES = ("onnx", "onnx-int8", "openvino")
# the dtypes each runtime computes in (the vectors it returns are float32 either way)
RUNTIME_DTYPES = {"onnx": ("float32",), "onnx-int8": ("float32",), "openvino": ("float32", "bfloat16")}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ONNX_OPSET = 17
OPENVINO_DIR = "openvino-f32"  # the OpenVINO export's folder in a model's cache (float32 weights)
# what installs each backend's packages (onnxruntime and onnx are dependencies of the project)
INSTALL_HINT = {
    "onnx": "pip install onnxruntime onnx",
    "onnx-int8": "pip install onnxruntime onnx",
    "openvino": "pip install 'pvpo-search[openvino]'",
}
# The exported graph materialises each layer's attention scores (batch x heads x len^2): one batch
# of 256 musique passages grew ONNX Runtime and OpenVINO to 5.5 GB RSS (a bench run of 4 backends
# was OOM-killed at 17 GB); 32 rows at a time stay under 1 GB and encode as fast on CPU.
MAX_RUNTIME_BATCH = 32


class MissingRuntime(ImportError):
    """The packages an encoder backend needs are not installed."""


def cache_root() -> Path:
    """Where exported models are kept: $PVPO_CACHE_DIR/encoders or ~/.cache/pvpo/encoders."""
    base = os.environ.get("PVPO_CACHE_DIR")
    return Path(base) / "encoders" if base else Path.home() / ".cache" / "pvpo" / "encoders"


def _model_key(model_path: str, max_length: int) -> str:
    """A name for a model's exports that changes when its weight files change."""
    p = Path(model_path)
    stamp: list[Any] = [str(p.resolve()) if p.exists() else model_path, max_length]
    if p.is_dir():
        for f in sorted(p.rglob("*")):
            if f.is_file() and f.suffix in {".safetensors", ".bin", ".json", ".txt"}:
                st = f.stat()
                stamp.append((str(f.relative_to(p)), st.st_size, st.st_mtime_ns))
    digest = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]
    return f"{p.name or 'model'}-{digest}"


def _require(module: str, backend: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingRuntime(
            f"encoder backend {backend!r} needs the {module} package ({e}); "
            f"install it with: {INSTALL_HINT[backend]}, or use backend 'torch'"
        ) from None


def _export_onnx(st_model: Any, target: Path) -> None:
    """Traces transformer + pooling + normalisation of a loaded SentenceTransformer into one
    ONNX graph with dynamic batch and sequence axes, written atomically to `target`."""
    import torch

    _require("onnx", "onnx")

    class Pipeline(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out = self.model(
                {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            )["sentence_embedding"]
            return torch.nn.functional.normalize(out.float(), dim=-1)

    cpu_model = st_model.to("cpu").float().eval()
    # Two rows of different lengths, so padding is part of the traced example.
    feats = st_model.tokenizer(["an example query for the trace", "short"], padding=True, return_tensors="pt")
    args = tuple(feats.get(name, torch.zeros_like(feats["input_ids"])) for name in INPUTS)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        path = Path(tmp) / target.name
        # The tracer warns (TracerWarning) at every Python branch on a tensor's shape in
        # transformers' masks and sentence-transformers' pooling: 6 lines on each first build. The
        # traced example has two rows of different lengths, and tests/test_retriever_encoder.py
        # checks the exported model's vectors against torch's, so they say nothing to a user.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(
                Pipeline(cpu_model),
                args,
                str(path),
                input_names=list(INPUTS),
                output_names=["embedding"],
                opset_version=ONNX_OPSET,
                dynamo=False,
                dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in INPUTS}, "embedding": {0: "batch"}},
            )
        os.replace(path, target)


def _quantize_int8(src: Path, target: Path) -> None:
    """Dynamic (weights int8, activations quantised at run time) quantisation of an ONNX model."""
    _require("onnxruntime", "onnx-int8")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        path = Path(tmp) / target.name
        quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8)
        os.replace(path, target)


def exported_model(st_model: Any, model_path: str, backend: str, *, cache_dir: Path | None = None) -> Path:
    """The cached export of a model for a runtime backend, made on first use."""
    if backend not in RUNTIMES:
        raise ValueError(f"unknown encoder runtime {backend!r}; options: {', '.join(RUNTIMES)}")
    folder = (cache_dir or cache_root()) / _model_key(model_path, int(st_model.max_seq_length or 0))
    onnx_file = folder / "model.onnx"
    if not onnx_file.exists():
        log.info("exporting %s to ONNX in %s", model_path, folder)
        _export_onnx(st_model, onnx_file)
    if backend == "onnx":
        return onnx_file
    if backend == "onnx-int8":
        q = folder / "model.int8.onnx"
        if not q.exists():
            _quantize_int8(onnx_file, q)
        return q
    xml = folder / OPENVINO_DIR / "model.xml"
    if not xml.exists():
        ov = _require("openvino", "openvino")
        tmp = Path(tempfile.mkdtemp(dir=folder))
        try:
            # float32 weights: save_model's default halves them to float16, which put the vectors
            # 1.7e-4 off ONNX Runtime's (the folder "openvino" of earlier exports); now 1e-7.
            ov.save_model(ov.convert_model(str(onnx_file)), str(tmp / "model.xml"), compress_to_fp16=False)
            os.replace(tmp, folder / OPENVINO_DIR)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return xml


class ExportedEncoderModel:
    """Runs an exported model: tokenised batches in, unit-length float32 embeddings out (computed
    in float32, or in bfloat16 by OpenVINO when `dtype` asks for it). Each
    call computes with the calling thread's budget (`thread_budget`, else `threads`): one ONNX
    Runtime session, or OpenVINO compiled model, per thread count, made on first use. Calls from
    several threads run at once: an ONNX Runtime session runs concurrent calls as they come; an
    OpenVINO compiled model runs as many at once as it has streams, one per caller its first
    `runner` call announced (each calling thread has its own infer request)."""

    def __init__(self, path: Path, backend: str, *, threads: int | None = None, dtype: str = "float32") -> None:
        if dtype not in RUNTIME_DTYPES[backend]:
            raise ValueError(
                f"encoder runtime {backend!r} computes {' or '.join(RUNTIME_DTYPES[backend])} only, not {dtype!r}"
            )
        self.backend = backend
        self.path = path
        self.dtype = dtype
        self.threads = threads or cpu_cores()
        self._runtime = _require("openvino" if backend == "openvino" else "onnxruntime", backend)
        self._runners: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._names: list[str] = []
        self.runner(self.threads)  # a model that does not load fails here, not at the first query

    def runner(self, threads: int, callers: int = 1) -> Any:
        """The session (compiled model) computing a call with `threads` threads, made on first use;
        `callers`: how many threads will call it at once (OpenVINO: its streams), as the first call
        for this thread count said."""
        runner = self._runners.get(threads)
        if runner is None:
            with self._lock:
                runner = self._runners.get(threads)
                if runner is None:
                    runner = self._runners[threads] = self._load(threads, max(1, callers))
        return runner

    def _load(self, threads: int, streams: int) -> Any:
        if self.backend == "openvino":
            core = self._runtime.Core()
            model = core.read_model(str(self.path))
            self._names = [p.get_any_name() for p in model.inputs]
            # One stream runs one call at a time: two search workers calling one single-stream
            # model used 1.1 of 2 cores at 8-64 clients (bench/retriever/retriever.py, bf16); a stream
            # per worker, each with the worker's threads.
            stream_config = {"PERFORMANCE_HINT": "LATENCY"} if streams == 1 else {"NUM_STREAMS": streams}
            return core.compile_model(
                model,
                "CPU",
                {
                    "INFERENCE_NUM_THREADS": threads * streams,
                    **stream_config,
                    # On AMX CPUs (this one) OpenVINO would run bf16 by default: 1e-3 off
                    # torch's vectors; f32 keeps it exact, bf16 only when asked for (a MiniLM
                    # query at batch 1: 2.3 ms on one thread against f32's 5.0 and ONNX
                    # Runtime's 4.6; max |diff| 1.2e-3; 2026-11-28, Sapphire Rapids, quiet).
                    "INFERENCE_PRECISION_HINT": "bf16" if self.dtype == "bfloat16" else "f32",
                },
            )
        opts = self._runtime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.enable_cpu_mem_arena = False  # the arena keeps its peak (one per input shape) for good
        session = self._runtime.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        self._names = [i.name for i in session.get_inputs()]
        return session

    def __call__(self, features: dict[str, np.ndarray]) -> np.ndarray:
        runner = self.runner(thread_budget() or self.threads)
        feeds = {n: np.ascontiguousarray(features[n], dtype=np.int64) for n in self._names}
        if self.backend == "openvino":
            requests: dict[int, Any] = self._local.__dict__.setdefault("requests", {})
            request = requests.get(id(runner))
            if request is None:  # an infer request serves one thread at a time
                request = requests[id(runner)] = runner.create_infer_request()
            out = request.infer(feeds)
            return np.asarray(next(iter(out.values())), dtype=np.float32)
        return np.asarray(runner.run(None, feeds)[0], dtype=np.float32)


class LocalTokenizer:
    """A sentence-transformers model's tokenizer read from its own `tokenizer.json` by the
    `tokenizers` library: the ids sentence-transformers gives (texts stripped, lower-cased where
    the model asks, truncated to `max_length`, padded to the batch's longest) without importing
    transformers. Configured once and never changed, so threads may share it (a transformers
    tokenizer re-applies its settings on each call, which fails in concurrent threads)."""

    def __init__(self, model_dir: Path, max_length: int, *, lower_case: bool = False) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.lower_case = lower_case
        pad = _pad_token(model_dir)
        pad_id = self._tok.token_to_id(pad) if pad is not None else None
        if pad is None or pad_id is None:
            raise ValueError(f"{model_dir}: the tokenizer names no pad token it knows")
        self._tok.enable_truncation(max_length)
        self._tok.enable_padding(pad_id=pad_id, pad_token=pad)

    def __call__(self, texts: Sequence[str], **_: Any) -> dict[str, np.ndarray]:
        """input_ids, attention_mask and token_type_ids of the texts, int64 (n, longest)."""
        texts = [t.strip().lower() if self.lower_case else t.strip() for t in texts]
        enc = self._tok.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
        }


def _pad_token(model_dir: Path) -> str | None:
    """The pad token a Hugging Face tokenizer folder names (tokenizer_config.json, then
    special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = model_dir / name
        if f.is_file():
            pad = json.loads(f.read_text()).get("pad_token")
            if isinstance(pad, dict):
                pad = pad.get("content")
            if isinstance(pad, str):
                return pad
    return None


def local_model_config(model_dir: Path) -> dict[str, Any] | None:
    """A local sentence-transformers folder's `sentence_bert_config.json` when it names the
    model's `max_seq_length` and the folder has a `tokenizer.json` (all a runtime needs to encode
    without loading the model); None otherwise."""
    cfg_file = model_dir / "sentence_bert_config.json"
    if not (cfg_file.is_file() and (model_dir / "tokenizer.json").is_file()):
        return None
    cfg = json.loads(cfg_file.read_text())
    return cfg if isinstance(cfg, dict) and isinstance(cfg.get("max_seq_length"), int) else None


def cached_export(model_path: str, max_length: int, backend: str, *, cache_dir: Path | None = None) -> Path | None:
    """The export `exported_model` made earlier for this model, sequence length and backend,
    found without loading the model; None when there is none yet."""
    folder = (cache_dir or cache_root()) / _model_key(model_path, max_length)
    path = {
        "onnx": folder / "model.onnx",
        "onnx-int8": folder / "model.int8.onnx",
        "openvino": folder / OPENVINO_DIR / "model.xml",
    }[backend]
    return path if path.is_file() else None


def encode_sorted(
    run: ExportedEncoderModel, tokenizer: Any, texts: Sequence[str], *, batch_size: int, max_length: int
) -> np.ndarray:
    """Encodes texts in batches of similar length (longest first, as sentence-transformers does,
    so each batch is padded only to its own longest text; at most MAX_RUNTIME_BATCH rows) and
    returns rows in input order."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    batch_size = min(batch_size, MAX_RUNTIME_BATCH)
    parts = []
    for start in range(0, len(texts), batch_size):
        batch = [texts[i] for i in order[start : start + batch_size]]
        feats = tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        if "token_type_ids" not in feats:
            feats["token_type_ids"] = np.zeros_like(feats["input_ids"])
        parts.append(run(dict(feats)))
    emb = np.concatenate(parts)
    out = np.empty_like(emb)
    out[order] = emb
    return out
