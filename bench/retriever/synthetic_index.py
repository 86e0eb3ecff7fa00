"""Synthetic stand-ins for a wiki-18-sized retriever, shared by the index benches
(`index_scale.py`, `corpus_store.py`, `server_startup.py`): seeded unit vectors shaped like dense
passage embeddings, a Search-R1-shaped corpus file, and the sizes the extrapolations to wiki-18
use.

Vectors (`clustered_vectors`): a two-level Gaussian mixture. `n // 2000` topic centres; `n // 500`
cluster centres, each a topic centre plus its own offset; cluster sizes lognormal (sigma 1.2: a
few clusters hold many passages, most hold few); within a cluster, spread along the cluster's own
random 24-dimensional basis with a decaying spectrum and a per-cluster scale (anisotropic), plus
isotropic noise; a common mean direction shared by all vectors (contrastive text encoders'
vectors occupy a narrow cone: mean cosine of two random passages 0.5-0.7), then unit length.
Queries: a random data point plus a fresh draw of its cluster's spread and isotropic noise, unit
length (cosine to that point about 0.8), so they sit near the data as real queries do, not
uniformly at random (which makes every index look either perfect or hopeless).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


WIKI18 = 21_015_324  # passages in Search-R1's wiki-18.jsonl


def fp16_store_gib(n: int, dim: int) -> float:
    """GiB of the fp16 re-ranking store of `n` vectors of `dim` (2 bytes a component)."""
    return n * dim * 2 / 2**30


def load_average() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


@dataclass
class Mixture:
    """Parameters of the two-level anisotropic Gaussian mixture (see the module docstring)."""

    centres: np.ndarray  # (clusters, dim)
    bases: np.ndarray  # (clusters, rank, dim), orthonormal rows
    scales: np.ndarray  # (clusters, rank)
    weights: np.ndarray  # (clusters,)
    iso: float

    @classmethod
    def make(cls, n: int, dim: int, seed: int, rank: int = 24) -> Mixture:
        rng = np.random.default_rng(seed)
        topics = max(4, n // 2000)
        clusters = max(16, n // 500)
        mean_dir = rng.normal(size=dim)
        mean_dir /= np.linalg.norm(mean_dir)
        topic_c = rng.normal(size=(topics, dim)) / np.sqrt(dim)
        centres = (
            1.6 * mean_dir
            + topic_c[rng.integers(0, topics, clusters)]
            + 0.6 * rng.normal(size=(clusters, dim)) / np.sqrt(dim)
        ).astype(np.float32)
        bases = np.linalg.qr(rng.normal(size=(clusters, dim, rank)))[0].transpose(0, 2, 1).astype(np.float32)
        spectrum = np.arange(1, rank + 1) ** -0.5
        scales = (0.45 * spectrum[None, :] * rng.lognormal(0.0, 0.3, size=(clusters, 1))).astype(np.float32)
        weights = rng.lognormal(0.0, 1.2, size=clusters)
        return cls(centres, bases, scales, weights / weights.sum(), 0.35 / np.sqrt(dim))

    def spread(self, members: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One draw of each member cluster's anisotropic spread plus isotropic noise."""
        z = rng.standard_normal((len(members), self.scales.shape[1]), dtype=np.float32) * self.scales[members]
        out = np.empty((len(members), self.bases.shape[2]), dtype=np.float32)
        order = np.argsort(members, kind="stable")
        bounds = np.flatnonzero(np.diff(members[order])) + 1
        for group in np.split(order, bounds):  # one GEMM per cluster (a batched 1-row matmul was 4x slower)
            out[group] = z[group] @ self.bases[members[group[0]]]
        out += self.iso * rng.standard_normal(out.shape, dtype=np.float32)
        return out


def _unit(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def clustered_vectors(n: int, dim: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(data (n, dim), queries (n_queries, dim)) float32 unit vectors from `Mixture` (seeded)."""
    mix = Mixture.make(n, dim, seed)
    rng = np.random.default_rng(seed + 1)
    labels = rng.choice(len(mix.weights), size=n, p=mix.weights)
    data = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65536):
        part = labels[start : start + 65536]
        data[start : start + len(part)] = _unit(mix.centres[part] + mix.spread(part, rng))
    anchors = rng.choice(n, size=n_queries, replace=False)
    queries = _unit(data[anchors] + 0.9 * mix.spread(labels[anchors], rng))
    return data, queries


def nlist_for(n: int) -> int:
    """IVF lists for n vectors: the power of two nearest sqrt(n) (faiss's guideline is 4-16 x
    sqrt(n); on 2 cores, k-means for 4 x sqrt(n) lists at 1M x 768 takes several minutes per
    candidate, so the bench stays at the low end; at 21M the recipe uses 65536 = 14 x sqrt(N))."""
    return int(2 ** round(np.log2(np.sqrt(n))))


def write_corpus(path: Path, lines: int, seed: int) -> None:
    """A Search-R1-shaped jsonl ({"id", "contents": "\\"Title\\"\\ntext"}), about 100 words a
    passage like wiki-18, from a seeded pool of 4,096 passages with distinct ids and titles."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(30000)])
    pool = [" ".join(vocab[rng.integers(0, len(vocab), int(rng.integers(80, 120)))]) for _ in range(4096)]
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, lines, 100_000):
            f.write(
                "".join(
                    f'{{"id": "{i}", "contents": "\\"Title {i}\\"\\n{pool[i % 4096]}"}}\n'
                    for i in range(start, min(lines, start + 100_000))
                )
            )


def run_alone(
    section: Callable[[argparse.Namespace], object], args: argparse.Namespace, packages: tuple[str, ...]
) -> None:
    """Run one section of the index benches as a bench of its own: the machine, the command and the
    load average before and after around it (its table prints as it finishes)."""
    from pvpo.machine import machine_line

    args.work_dir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine_line(packages)}")
    print(f"command: {shlex.join([Path(sys.executable).name] + sys.argv)}")
    print(f"load average at start (1/5/15 min): {load_average()}", flush=True)
    t0 = time.perf_counter()
    section(args)
    print(f"\nload average at end: {load_average()}; run took {time.perf_counter() - t0:.0f} s")
