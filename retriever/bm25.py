"""Lexical retrieval backend: BM25 (bm25s) over the same corpus store as the dense backend."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.retriever.corpus import CorpusStore
from pvpo.retriever.index import DEFAULT_TOPK, Retriever, open_corpus, register_backend
from pvpo.retriever.types import Passage

BM25_DIR = "bm25"
STOPWORDS = "en"


@functools.cache
def import_bm25s() -> Any:
    """`bm25s`, imported without letting JAX take the GPU: where JAX is installed, `import bm25s` runs
    a JAX op, and JAX's default is to preallocate 75% of the GPU's memory at its first op. Measured
    on an H200 (143,771 MiB) with the image's JAX: nvidia-smi read 108,197 MiB used as soon as
    bench/training/rollout.py's eval loaded its BM25 index, and the policy on the same GPU ran out of memory.
    A user's own XLA_PYTHON_CLIENT_PREALLOCATE wins; top-k selection runs in numpy
    (`backend_selection="numpy"` below), so JAX does no work after the import. Cached: searches
    call it and pay nothing."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


def build_bm25(corpus: CorpusStore, out_dir: Path, *, show_progress: bool = True) -> None:
    """Indexes every passage of the corpus (title and text) with BM25 into out_dir/bm25."""
    show_progress = show_progress and sys.stderr.isatty()  # bm25s draws tqdm bars: none off a terminal
    bm25s = import_bm25s()

    tokens = bm25s.tokenize([contents for _, contents in corpus], stopwords=STOPWORDS, show_progress=show_progress)
    model = bm25s.BM25()
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir / BM25_DIR), show_progress=False)


class BM25Retriever(Retriever):
    """BM25 over the corpus; passages with no query term in common are not returned."""

    backend = "bm25"

    def __init__(self, model: Any, corpus: CorpusStore) -> None:
        self.model = model
        self.corpus = corpus

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        bm25s = import_bm25s()

        if len(queries) != len(topks):
            raise ValueError("one topk per query")
        n = len(self.corpus)
        if not queries or n == 0:
            return [[] for _ in queries]
        k = min(max(topks), n)
        tokens = bm25s.tokenize(list(queries), stopwords=STOPWORDS, return_ids=False, show_progress=False)
        docs, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=1, backend_selection="numpy")
        out = []
        for i, want in enumerate(topks):
            keep = scores[i][:want] > 0
            out.append(self.corpus.passages(docs[i][:want][keep], scores[i][:want][keep]))
        return out

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": "bm25",
            "index_type": "bm25",
            "size": len(self.corpus),
            "dim": 0,
            "device": "cpu",
            "index_device": "cpu",
        }


@register_backend("bm25")
def _load_bm25(index_dir: Path, meta: dict[str, Any], device: str | None) -> BM25Retriever:
    bm25s = import_bm25s()

    model = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=True, show_progress=False)
    retriever = BM25Retriever(model, open_corpus(index_dir, meta))
    retriever.default_topk = int(meta.get("default_topk", DEFAULT_TOPK))
    return retriever
