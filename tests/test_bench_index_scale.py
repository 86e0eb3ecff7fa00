"""bench/retriever/index_scale.py: the 21M host-store figures it prints are computed from the vectors'
dimension, not written for 768-d."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.retriever import index_scale as index_scale  # noqa: E402


def test_the_hnsw_rows_state_the_fp16_store_of_the_vectors_dimension(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((600, 16)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    args = argparse.Namespace(hnsw_n=600, dim=16, budget=0.01, work_dir=tmp_path, seed=0)
    rows = index_scale.hnsw_rows(data, data[:20], args)
    reranked = [r for r in rows if "+ rerank" in r]
    store = index_scale.WIKI18 * 16 * 2 / 2**30  # 21M fp16 vectors of 16 components: 0.6 GiB
    assert reranked and all(f"+ {store:.1f} GiB fp16 mmap" in r for r in reranked)
    assert index_scale.fp16_store_gib(index_scale.WIKI18, 768) == index_scale.WIKI18 * 768 * 2 / 2**30  # 30.1 GiB
