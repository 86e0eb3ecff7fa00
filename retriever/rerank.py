"""Exact re-ranking of a compressed index's shortlist from full vectors kept in fp16 in a
memory-mapped `.npy` file: the GPU (or RAM) holds only the small codes of an IVF-PQ / SQ index,
and the top `depth` candidates it returns are re-scored with exact inner products.

The recipe is the "compressed-domain search + re-ranking" of Jégou et al., "Searching in one
billion vectors: re-rank with source coding" (ICASSP 2011), also FAISS's `IndexRefine`; here the
refinement vectors live in a file mapped by the OS (page cache, shared across processes, not
counted as the process's own memory) instead of in the index, so they never reach the GPU and a
21M x 768 store (32 GB in fp16) costs no resident memory until its pages are read."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

VECTORS_FILE = "vectors.f16.npy"
DEFAULT_RERANK_DEPTH = 100
GPU_MAX_DEPTH = 2048  # faiss GPU search returns at most 2048 neighbours a query
# Queries re-scored per numpy batch: 64 x depth 100 x 768 floats = 20 MB of gathered rows at a time.
_QUERY_BLOCK = 64


def write_fp16_store(path: str | Path, chunks: Iterable[np.ndarray], n: int, dim: int) -> Path:
    """Writes `n` rows of `dim` floats, given in consecutive chunks, as an fp16 `.npy` file
    (written to a temporary name, then renamed: a partial file is never left under `path`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(n, dim))
        row = 0
        for chunk in chunks:
            chunk = np.asarray(chunk)
            if chunk.ndim != 2 or chunk.shape[1] != dim:
                raise ValueError(f"vector chunk of shape {chunk.shape}, expected (rows, {dim})")
            if row + len(chunk) > n:
                raise ValueError(f"more than the declared {n} vectors")
            out[row : row + len(chunk)] = chunk
            row += len(chunk)
        if row != n:
            raise ValueError(f"{row} vectors written, {n} declared")
        out.flush()
        del out
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class Fp16Store:
    """Row -> vector lookup over an fp16 `.npy` file, memory-mapped (read-only): opening it reads
    only the header."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"re-ranking vector file {self.path} does not exist")
        vectors = np.load(self.path, mmap_mode="r")
        if vectors.dtype != np.float16 or vectors.ndim != 2:
            raise ValueError(f"{self.path} holds {vectors.dtype} of shape {vectors.shape}, expected 2-D float16")
        self.vectors: np.memmap = vectors

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def rerank(store: Fp16Store, queries: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k), best first: the `k` candidates of each query with the
    highest exact inner product against the stored vectors. Candidate ids of -1 (a shortlist
    shorter than asked) and rows past `k` valid candidates come back as id -1, score -inf."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    candidates = np.asarray(candidates, dtype=np.int64)
    nq, depth = candidates.shape
    scores_out = np.full((nq, k), -np.inf, dtype=np.float32)
    ids_out = np.full((nq, k), -1, dtype=np.int64)
    if nq == 0 or depth == 0 or k == 0:
        return scores_out, ids_out
    valid = candidates >= 0
    uniq, inverse = np.unique(np.where(valid, candidates, 0), return_inverse=True)
    inverse = inverse.reshape(candidates.shape)
    # One read of each distinct row for the whole batch (queries of one batch share candidates).
    vectors = store.vectors[uniq].astype(np.float32)
    keep = min(k, depth)
    for start in range(0, nq, _QUERY_BLOCK):
        block = slice(start, min(nq, start + _QUERY_BLOCK))
        exact = np.matmul(vectors[inverse[block]], queries[block, :, None])[..., 0]
        exact[~valid[block]] = -np.inf
        top = (
            np.argpartition(-exact, keep - 1, axis=1)[:, :keep]
            if keep < depth
            else np.broadcast_to(np.arange(depth), (exact.shape[0], depth))
        )
        top_scores = np.take_along_axis(exact, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        top_scores = np.take_along_axis(top_scores, order, axis=1)
        top_ids = np.take_along_axis(candidates[block], top, axis=1)
        top_ids[~np.isfinite(top_scores)] = -1
        scores_out[block, :keep] = top_scores
        ids_out[block, :keep] = top_ids
    return scores_out, ids_out


class RerankedIndex:
    """A FAISS index (CPU or GPU) whose top `depth` hits are re-scored exactly from an
    `Fp16Store`; searched like a FAISS index (`search(x, k) -> (scores, ids)`, `ntotal`, `d`).

    Search cost: the coarse search at k = max(k, depth), plus reading depth x batch rows of
    2 x dim bytes from the mapped file (a random read each on a cold page cache)."""

    def __init__(
        self, index: Any, store: Fp16Store, depth: int = DEFAULT_RERANK_DEPTH, *, max_depth: int | None = None
    ) -> None:
        if len(store) != index.ntotal or store.dim != index.d:
            raise ValueError(
                f"re-ranking store {store.path} holds {len(store)} x {store.dim} vectors, "
                f"the index {index.ntotal} x {index.d}: they must be the same rows"
            )
        self.index = index
        self.store = store
        self.max_depth = max_depth  # GPU_MAX_DEPTH for an index on GPU, None on CPU
        self.depth = 0
        self.set_depth(depth)

    def set_depth(self, depth: int) -> None:
        """How many candidates the coarse index returns for re-scoring (at least the k asked)."""
        if int(depth) < 1:
            raise ValueError(f"rerank_depth must be >= 1, got {depth!r}")
        if self.max_depth is not None and int(depth) > self.max_depth:
            raise ValueError(f"rerank_depth {depth} is more than this index returns ({self.max_depth} on GPU)")
        self.depth = int(depth)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def d(self) -> int:
        return int(self.index.d)

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k inner products among the coarse index's top max(k, depth)."""
        shortlist = min(max(k, self.depth), self.ntotal)
        if self.max_depth is not None:
            shortlist = min(shortlist, max(k, self.max_depth))
        _, candidates = self.index.search(np.ascontiguousarray(x, dtype=np.float32), shortlist)
        return rerank(self.store, x, candidates, k)
