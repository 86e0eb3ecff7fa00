"""Index recipes for a wiki-18-sized retriever (21M passages, e5-base 768-d), measured at a size
this machine holds and extrapolated to 21M on paper.

Measures, in one run: for each candidate FAISS index (Flat; IVF + SQ8 / SQ4 / PQ, with and
without exact re-ranking of a shortlist from fp16 vectors in a memory-mapped file, which is what
`pvpo retriever build --rerank-depth` builds; HNSW32,SQ8 as the CPU-only option) the build time,
bytes per vector, recall@5 against exact Flat search, and queries/s at batch 1 / 64 / 512; the
same recipe at a quarter of the size (how recall moves with N); the corpus store on a generated
JSON-lines file (first open with the offset scan, cached reopen, RSS, fetch latency of 512 ids);
and the whole server's startup to first answer (`pvpo retriever serve` in its own process, the
packaged MiniLM encoder, 384-d, over an index of the corpus's size built by our build code).
With faiss GPU support, the IVF rows are measured again on the GPUs (fp16, sharded, our
`to_device`); elsewhere those rows are marked skipped. Prints the machine, the command and a
markdown table, and writes them to runs/bench/index_scale-<time>.md (git-ignored).

Synthetic vectors (seeded; `clustered_vectors`): a two-level Gaussian mixture shaped like dense
passage embeddings. `n // 2000` topic centres; `n // 500` cluster centres, each a topic centre
plus its own offset; cluster sizes lognormal (sigma 1.2: a few clusters hold many passages, most
hold few); within a cluster, spread along the cluster's own random 24-dimensional basis with a
decaying spectrum and a per-cluster scale (anisotropic), plus isotropic noise; a common mean
direction shared by all vectors (contrastive text encoders' vectors occupy a narrow cone: mean
cosine of two random passages 0.5-0.7; the run prints this set's), then unit length. Queries: a random data point plus
a fresh draw of its cluster's spread and isotropic noise, unit length (cosine to that point about
0.8), so they sit near the data as real queries do, not uniformly at random (which makes every
index look either perfect or hopeless).

    .venv/bin/python bench/index_scale.py [--n 1000000] [--dim 768] [--quick]

Timings share the box's cores with whatever else runs; the load average is printed at start and
end. Compare rows within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WIKI18 = 21_015_324  # passages in Search-R1's wiki-18.jsonl
RECALL_K = 5


def fp16_store_gib(n: int, dim: int) -> float:
    """GiB of the fp16 re-ranking store of `n` vectors of `dim` (2 bytes a component)."""
    return n * dim * 2 / 2**30


def load_average() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


# --- synthetic data ---------------------------------------------------------------------------


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


# --- timing helpers ---------------------------------------------------------------------------


def qps(index: Any, queries: np.ndarray, batch: int, k: int, budget_s: float) -> float:
    """Queries/s of index.search in batches of `batch`, over as many batches as fit in budget_s
    (at least one)."""
    done, t0 = 0, time.perf_counter()
    while True:
        start = done % len(queries)
        block = queries[start : start + batch]
        if len(block) < batch:
            block = np.concatenate([block, queries[: batch - len(block)]])
        index.search(block, k)
        done += batch
        if time.perf_counter() - t0 > budget_s:
            return done / (time.perf_counter() - t0)


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of the exact top-k found in the returned top-k."""
    return float(np.mean([len(set(a[a >= 0]) & set(b)) / len(b) for a, b in zip(ids, truth)]))


def search_all(index: Any, queries: np.ndarray, k: int, batch: int = 512) -> np.ndarray:
    return np.concatenate([index.search(queries[i : i + batch], k)[1] for i in range(0, len(queries), batch)])


def file_bytes(index: Any, path: Path) -> int:
    import faiss

    faiss.write_index(index, str(path))
    size = path.stat().st_size
    path.unlink()
    return size


# --- index candidates -------------------------------------------------------------------------


@dataclass
class Candidate:
    name: str  # shown in the table
    factory: str  # index_factory string ("IVF{nlist}" is filled in)
    params: dict[str, Any]
    rerank_depth: int = 0
    gpu: bool = True  # has a faiss GPU implementation


def candidates(nlist: int) -> list[Candidate]:
    ivf = f"IVF{nlist}"
    # PQ with 64 / 96 bytes and SQ8 / SQ4 are the code sizes faiss GPU IVF implements for 768-d
    # (IVF-PQ: bytes per code in {.., 48, 56, 64, 96}); PQ128 has no GPU kernel, so it is not a candidate.
    return [
        Candidate("Flat (exact, fp32)", "Flat", {}),
        Candidate(f"{ivf},SQ8", f"{ivf},SQ8", {"nprobe": 32}),
        Candidate(f"{ivf},SQ4", f"{ivf},SQ4", {"nprobe": 32}),
        Candidate(f"{ivf},SQ4 + rerank 100", f"{ivf},SQ4", {"nprobe": 32}, 100),
        Candidate(f"{ivf},SQ4 + rerank 100, nprobe 16", f"{ivf},SQ4", {"nprobe": 16}, 100),
        Candidate(f"{ivf},PQ64", f"{ivf},PQ64", {"nprobe": 32}),
        Candidate(f"{ivf},PQ64 + rerank 100", f"{ivf},PQ64", {"nprobe": 32}, 100),
        Candidate(f"{ivf},PQ64 + rerank 100, nprobe 16", f"{ivf},PQ64", {"nprobe": 16}, 100),
        Candidate(f"{ivf},PQ64 + rerank 200, nprobe 64", f"{ivf},PQ64", {"nprobe": 64}, 200),
        Candidate(f"{ivf},PQ96 + rerank 100", f"{ivf},PQ96", {"nprobe": 32}, 100),
    ]


def nlist_for(n: int) -> int:
    """IVF lists for n vectors: the power of two nearest sqrt(n) (faiss's guideline is 4-16 x
    sqrt(n); on 2 cores, k-means for 4 x sqrt(n) lists at 1M x 768 takes several minutes per
    candidate, so the bench stays at the low end; at 21M the recipe uses 65536 = 14 x sqrt(N))."""
    return int(2 ** round(np.log2(np.sqrt(n))))


def train_quantizer(data: np.ndarray, nlist: int, seed: int) -> tuple[np.ndarray, float]:
    """IVF centroids trained once on a seeded sample of 64 x nlist points (faiss wants >= 39 x),
    shared by every IVF candidate so each build pays only for its codes."""
    import faiss

    t0 = time.perf_counter()
    rows = np.sort(np.random.default_rng(seed).choice(len(data), size=min(len(data), 64 * nlist), replace=False))
    km = faiss.Kmeans(data.shape[1], nlist, niter=20, seed=seed, spherical=True)
    km.train(data[rows])
    assert km.centroids is not None  # set by train
    return km.centroids, time.perf_counter() - t0


def build_candidate(
    c: Candidate,
    data: np.ndarray,
    centroids: np.ndarray | None,
    store: Any,
    seed: int,
    built: dict[str, tuple[Any, float, int, int]] | None = None,
) -> tuple[Any, float, int, int]:
    """(searchable index, build seconds, bytes per vector, fixed bytes (IVF centroids)) of one
    candidate, built with the retriever's own helpers; candidates of one factory string share
    one build through `built` (they differ only in search parameters)."""
    from pvpo.retriever.index import apply_search_params
    from pvpo.retriever.rerank import RerankedIndex

    if built is None or c.factory not in built:
        built = {} if built is None else built
        built.clear()  # one factory's index alive at a time
        built[c.factory] = _build(c.factory, data, centroids, store, seed)
    index, seconds, per_vector, fixed = built[c.factory]
    searchable = RerankedIndex(index, store, c.rerank_depth) if c.rerank_depth else index
    apply_search_params(searchable, c.params)
    return searchable, seconds, per_vector, fixed


def _build(
    factory: str, data: np.ndarray, centroids: np.ndarray | None, store: Any, seed: int
) -> tuple[Any, float, int, int]:
    import faiss

    from pvpo.retriever.index import make_faiss_index, train_if_needed

    dim = data.shape[1]
    t0 = time.perf_counter()
    index = make_faiss_index(dim, factory)
    fixed = 0
    if factory.startswith("IVF") and centroids is not None:
        ivf = faiss.extract_index_ivf(index)
        ivf.quantizer.add(centroids)  # a quantizer holding nlist vectors is not retrained
        fixed = centroids.nbytes
    # 65,536 training points: faiss's PQ k-means uses at most 256 per centroid (256 x 256) anyway.
    train_if_needed(index, data, max_train=65_536, seed=seed)
    for start in range(0, len(data), 131072):
        index.add(data[start : start + 131072])
    seconds = time.perf_counter() - t0
    if factory == "Flat":
        size = len(data) * dim * 4  # exactly its storage; not written out (3 GB at 1M x 768)
    else:
        with tempfile.TemporaryDirectory(dir=store.path.parent) as tmp:
            size = file_bytes(index, Path(tmp) / "i.faiss")
    return index, seconds, (size - fixed) // len(data), fixed


# --- corpus store and server startup (each in a fresh process, for clean RSS) -----------------


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


PROBE = """
import json, time, sys
import numpy as np
t0 = time.perf_counter()
from pvpo.retriever.corpus import CorpusStore
t_import = time.perf_counter() - t0
def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon:", "RssFile:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out
before = rss()
t0 = time.perf_counter()
store = CorpusStore(sys.argv[1], sys.argv[2])
opened = time.perf_counter() - t0
after = rss()
rng = np.random.default_rng(0)
lat = []
for _ in range(30):
    rows = rng.integers(0, len(store), 512)
    t0 = time.perf_counter()
    store.passages(rows)
    lat.append(time.perf_counter() - t0)
print(json.dumps({"n": len(store), "open_s": opened, "rss_before": before, "rss_after": after,
                  "fetch512_first_ms": lat[0] * 1e3, "fetch512_p50_ms": float(np.median(lat)) * 1e3,
                  "fetch512_p90_ms": float(np.percentile(lat, 90)) * 1e3, "rss_end": rss()}))
"""


def corpus_probe(corpus: Path, offsets: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(corpus), str(offsets)], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def server_startup(index_dir: Path) -> dict[str, Any]:
    """Seconds from spawning `pvpo retriever serve` to its first /retrieve answer, the CPU seconds
    the server had used by then (which a busy machine does not inflate as it does the wall time),
    with the server's own log of the index + corpus open."""
    import httpx
    from http_load import process_cpu

    from pvpo.retriever.testing import start_server, stop_server

    log_path = index_dir / "serve.log"
    t0 = time.perf_counter()
    proc, (url,) = start_server(index_dir, log_level="info", log=log_path, wait=False, cwd=REPO)
    try:
        first = cpu = None
        while time.perf_counter() - t0 < 600:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
            try:
                r = httpx.post(
                    url + "/retrieve",
                    json={"queries": ["who wrote Hamlet"], "topk": 5},
                    timeout=30,
                )
                if r.status_code == 200 and len(r.json()["result"][0]) == 5:
                    first = time.perf_counter() - t0
                    cpu = process_cpu(proc.pid)
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        rss = next(
            (
                int(line.split()[1]) / 1024
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                if line.startswith("RssAnon:")
            ),
            float("nan"),
        )
    finally:
        stop_server(proc)
    text = log_path.read_text()
    opened = next(
        (
            float(line.split(" opened in ")[1].split("s")[0])
            for line in text.splitlines()
            if "index + corpus opened in" in line
        ),
        float("nan"),
    )
    loaded = next(
        (float(line.rsplit(" in ", 1)[1].rstrip("s")) for line in text.splitlines() if "passages) in " in line),
        float("nan"),
    )
    return {
        "first_answer_s": first,
        "cpu_s": cpu,
        "index_corpus_open_s": opened,
        "load_retriever_s": loaded,
        "rss_anon_mb": rss,
    }


# --- main -------------------------------------------------------------------------------------


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="vectors (1M x 768 fits 24 GB with room)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument(
        "--hnsw-n",
        type=int,
        default=200_000,
        help="vectors for HNSW32,SQ8 (its build is the slowest: measured on a prefix)",
    )
    ap.add_argument("--corpus-lines", type=int, default=2_100_000)
    ap.add_argument(
        "--server-lines", type=int, default=None, help="passages of the startup test (default: corpus lines)"
    )
    ap.add_argument("--budget", type=float, default=4.0, help="seconds per queries/s measurement")
    ap.add_argument("--quick", action="store_true", help="smoke run: 60k vectors, 200k corpus lines, 1 s budgets")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "pvpo-index-scale")
    ap.add_argument("--results-dir", type=Path, default=REPO / "runs" / "bench")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[], choices=["indexes", "corpus", "server"])
    ap.add_argument(
        "--server-index",
        choices=["recipe", "Flat"],
        default="recipe",
        help="the startup test's index: the wiki-18 recipe (IVF,SQ4 + rerank 100) or exact Flat (memory-mapped)",
    )
    args = ap.parse_args()
    if args.quick:
        args.n, args.queries, args.hnsw_n, args.corpus_lines, args.budget = 60_000, 300, 20_000, 200_000, 1.0
    args.server_lines = args.server_lines or args.corpus_lines
    import faiss
    from machine import machine_line

    args.work_dir.mkdir(parents=True, exist_ok=True)
    out: list[str] = [
        f"machine: {machine_line(('faiss-cpu', 'numpy', 'onnxruntime'))}",
        f"command: {shlex.join([Path(sys.executable).name] + sys.argv)}",
        f"load average at start (1/5/15 min): {load_average()}; faiss threads {faiss.omp_get_max_threads()}",
        "",
    ]
    print("\n".join(out), flush=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"index_scale-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text("\n".join(out) + "\n")  # each section is appended as it finishes
    t_run = time.perf_counter()
    for name, section in (("indexes", index_section), ("corpus", corpus_section), ("server", server_section)):
        if name not in args.skip:
            lines = section(args)
            out += lines
            with path.open("a") as f:
                f.write("\n".join(lines) + "\n")
    tail = ["", f"load average at end: {load_average()}; run took {time.perf_counter() - t_run:.0f} s"]
    out += tail
    with path.open("a") as f:
        f.write("\n".join(tail) + "\n")
    print("\n".join(out[4:]))
    print(f"\nwritten to {path}")


def index_section(args: argparse.Namespace) -> list[str]:

    from pvpo.retriever.rerank import Fp16Store, write_fp16_store

    t0 = time.perf_counter()
    data, queries = clustered_vectors(args.n, args.dim, args.queries, args.seed)
    gen_s = time.perf_counter() - t0
    sample = data[np.random.default_rng(args.seed).choice(args.n, 2000, replace=False)]
    mean_cos = float(np.mean(sample[:1000] @ sample[1000:].T))
    store_path = args.work_dir / "vectors.f16.npy"
    write_fp16_store(store_path, [data[i : i + 131072] for i in range(0, args.n, 131072)], args.n, args.dim)
    store = Fp16Store(store_path)
    nlist = nlist_for(args.n)
    centroids, kmeans_s = train_quantizer(data, nlist, args.seed)
    lines = [
        "",
        f"## Index candidates: {args.n:,} x {args.dim} synthetic vectors, {args.queries} queries, "
        f"recall@{RECALL_K} vs exact Flat",
        "",
        f"data generated in {gen_s:.0f} s; mean cosine of random pairs {mean_cos:.2f}; IVF coarse k-means "
        f"({nlist} lists, {64 * nlist:,} points) {kmeans_s:.0f} s, once, shared (not in the build column); "
        f"fp16 re-ranking store {store_path.stat().st_size / 2**30:.2f} GiB, memory-mapped",
        "",
    ]
    print("\n".join(lines), flush=True)
    header = (
        "| index | build s | bytes/vector | recall@5 | q/s batch 1 | q/s batch 64 | q/s batch 512 "
        "| 21M: index memory | 21M: host fp16 store |"
    )
    rows = [header, "|" + "---|" * 9]
    truth = None
    gpu_rows: list[str] = []
    recalls: dict[str, float] = {}
    built: dict[str, tuple[Any, float, int, int]] = {}
    for c in candidates(nlist):
        index, build_s, per_vec, fixed = build_candidate(c, data, centroids, store, args.seed, built)
        t_search = time.perf_counter()
        ids = search_all(index, queries, RECALL_K)
        if truth is None:  # Flat is first: its answer is the truth
            truth = ids
        r = recalls[c.name] = recall(ids, truth)
        speeds = [qps(index, queries, b, RECALL_K, args.budget) for b in (1, 64, 512)]
        mem21 = per_vec * WIKI18 + (65536 * args.dim * 4 if fixed else 0)
        host21 = f"{fp16_store_gib(WIKI18, args.dim):.1f} GiB (mmap)" if c.rerank_depth else "-"
        row = (
            f"| {c.name} | {build_s:.0f} | {per_vec} | {r:.3f} | {speeds[0]:,.0f} | {speeds[1]:,.0f} | "
            f"{speeds[2]:,.0f} | {mem21 / 2**30:.1f} GiB | {host21} |"
        )
        rows.append(row)
        print(row, f"(search {time.perf_counter() - t_search:.0f} s, load {load_average()})", flush=True)
        if c.gpu and c.factory != "Flat":
            gpu_rows.append(gpu_row(c, index, queries, truth, args))
        del index
    built.clear()
    lines += rows
    lines += [
        "",
        "IVF rows: nprobe 32 unless named; rows of one factory string share one build (the build column "
        "repeats it); 21M index memory = bytes/vector x 21,015,324 + 65,536 "
        "centroids x dim x 4 (the list count the recipe uses at 21M); the fp16 store stays in host "
        "page cache (memory-mapped, not process memory).",
    ]
    lines += hnsw_rows(data, queries, args)
    lines += scaling_rows(data, queries, args, recalls, nlist)
    lines += ["", "### The same on GPU (faiss GPU, fp16, sharded over all GPUs)", ""]
    lines += (
        gpu_rows
        if any(not r.startswith("skipped") for r in gpu_rows)
        else ["skipped: no CUDA device / this faiss has no GPU support (faiss-cpu); no GPU figure is claimed."]
    )
    del data
    store_path.unlink()
    return lines


def gpu_row(c: Candidate, index: Any, queries: np.ndarray, truth: np.ndarray, args: argparse.Namespace) -> str:
    """The candidate moved to all GPUs by the retriever's own `to_device` (fp16, sharded)."""

    from pvpo.retriever.index import apply_search_params, faiss_gpus, to_device
    from pvpo.retriever.rerank import RerankedIndex

    if faiss_gpus() == 0:
        return "skipped"
    inner = index.index if isinstance(index, RerankedIndex) else index
    gpu_index, where = to_device(inner, "cuda")
    if where == "cpu":
        return f"| {c.name} | not movable to GPU |"
    searchable = RerankedIndex(gpu_index, index.store, index.depth) if isinstance(index, RerankedIndex) else gpu_index
    apply_search_params(searchable, c.params)
    r = recall(search_all(searchable, queries, RECALL_K), truth)
    speeds = [qps(searchable, queries, b, RECALL_K, args.budget) for b in (1, 64, 512)]
    return f"| {c.name} ({where}) | recall@5 {r:.3f} | q/s {speeds[0]:,.0f} / {speeds[1]:,.0f} / {speeds[2]:,.0f} |"


def hnsw_rows(data: np.ndarray, queries: np.ndarray, args: argparse.Namespace) -> list[str]:
    """HNSW32,SQ8 (CPU only: no faiss GPU implementation) on a prefix of the data, with its own
    exact truth over that prefix."""
    import faiss

    from pvpo.retriever.index import apply_search_params, make_faiss_index, train_if_needed
    from pvpo.retriever.rerank import Fp16Store, RerankedIndex, write_fp16_store

    n = min(args.hnsw_n, len(data))
    sub = data[:n]
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(sub)
    truth = search_all(flat, queries, RECALL_K)
    flat_speed = [qps(flat, queries, b, RECALL_K, args.budget) for b in (1, 64, 512)]
    del flat
    t0 = time.perf_counter()
    index = make_faiss_index(args.dim, "HNSW32,SQ8")
    train_if_needed(index, sub, max_train=100_000, seed=args.seed)
    index.add(sub)
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        per_vec = file_bytes(index, Path(tmp) / "h.faiss") // n
    lines = [
        "",
        f"### HNSW32,SQ8 (CPU only) on the first {n:,} vectors (its build dominates: "
        f"{build_s / n * 1e6:.0f} s per million here)",
        "",
        "| index | build s | bytes/vector | recall@5 | q/s batch 1 | q/s batch 64 | q/s batch 512 | 21M: RAM |",
        "|" + "---|" * 8,
        f"| Flat on the same {n:,} | - | {args.dim * 4} | 1.000 | {flat_speed[0]:,.0f} | {flat_speed[1]:,.0f} | "
        f"{flat_speed[2]:,.0f} | {args.dim * 4 * WIKI18 / 2**30:.1f} GiB |",
    ]
    store_path = args.work_dir / "hnsw.f16.npy"
    store = Fp16Store(write_fp16_store(store_path, [sub[i : i + 131072] for i in range(0, n, 131072)], n, args.dim))
    for ef, depth in ((64, 0), (128, 0), (256, 0), (128, 100)):
        searchable = RerankedIndex(index, store, depth) if depth else index
        apply_search_params(searchable, {"efSearch": ef})
        r = recall(search_all(searchable, queries, RECALL_K), truth)
        speeds = [qps(searchable, queries, b, RECALL_K, args.budget) for b in (1, 64, 512)]
        ram = per_vec * WIKI18 / 2**30
        lines.append(
            f"| HNSW32,SQ8 efSearch {ef}{f' + rerank {depth}' if depth else ''} | {build_s:.0f} | {per_vec} | "
            f"{r:.3f} | {speeds[0]:,.0f} | {speeds[1]:,.0f} | {speeds[2]:,.0f} | {ram:.1f} GiB"
            f"{f' + {fp16_store_gib(WIKI18, args.dim):.1f} GiB fp16 mmap' if depth else ''} |"
        )
        print(lines[-1], flush=True)
    del searchable, store
    store_path.unlink()
    return lines


def scaling_rows(
    data: np.ndarray, queries: np.ndarray, args: argparse.Namespace, full: dict[str, float], nlist_full: int
) -> list[str]:
    """The two re-ranked recipes on 1/16 and 1/4 of the vectors (lists ~ sqrt(N)), each against
    its own exact truth, beside the full-size rows (`full`: recall by candidate name): how recall
    at fixed nprobe / depth moves as N grows."""
    import faiss

    from pvpo.retriever.rerank import Fp16Store, write_fp16_store

    codes = ("PQ64", "SQ4")
    lines = [
        "",
        "### Recall@5 against N (nprobe 32, rerank depth 100; lists ~ sqrt(N); each N against its own exact search)",
        "",
        "| N | lists | " + " | ".join(f"{c} + rerank 100 | {c} alone" for c in codes) + " |",
        "|---|---|" + "---|---|" * len(codes),
    ]
    for n in (len(data) // 16, len(data) // 4):
        sub = data[:n]
        flat = faiss.IndexFlatIP(args.dim)
        flat.add(sub)
        truth = search_all(flat, queries, RECALL_K)
        del flat
        nlist = nlist_for(n)
        centroids, _ = train_quantizer(sub, nlist, args.seed)
        path = args.work_dir / f"scale-{n}.f16.npy"
        sub_store = Fp16Store(write_fp16_store(path, [sub[i : i + 131072] for i in range(0, n, 131072)], n, args.dim))
        cells = []
        for code in codes:
            c = Candidate("", f"IVF{nlist},{code}", {"nprobe": 32}, 100)
            index, *_ = build_candidate(c, sub, centroids, sub_store, args.seed)
            cells += [
                recall(search_all(index, queries, RECALL_K), truth),
                recall(search_all(index.index, queries, RECALL_K), truth),
            ]
            del index
        lines.append(f"| {n:,} | {nlist} | " + " | ".join(f"{r:.3f}" for r in cells) + " |")
        print(lines[-1], flush=True)
        del sub_store
        path.unlink(missing_ok=True)
    ivf = f"IVF{nlist_full}"
    cells = [full[f"{ivf},{c}{suffix}"] for c in codes for suffix in (" + rerank 100", "")]
    lines.append(f"| {len(data):,} | {nlist_full} | " + " | ".join(f"{r:.3f}" for r in cells) + " |")
    return lines


def corpus_section(args: argparse.Namespace) -> list[str]:
    corpus = args.work_dir / "corpus.jsonl"
    offsets = args.work_dir / "corpus.offsets.npy"
    t0 = time.perf_counter()
    write_corpus(corpus, args.corpus_lines, args.seed)
    write_s = time.perf_counter() - t0
    offsets.unlink(missing_ok=True)
    first = corpus_probe(corpus, offsets)
    again = corpus_probe(corpus, offsets)
    size = corpus.stat().st_size
    scale = WIKI18 / args.corpus_lines
    lines = [
        "",
        f"## Corpus store: {args.corpus_lines:,}-line JSON-lines file ({size / 2**30:.2f} GiB, "
        f"{size / args.corpus_lines:.0f} bytes a passage; written in {write_s:.0f} s, so in page cache)",
        "",
        "| open | seconds | RssAnon after open | RssFile after open | 512-id fetch p50 / p90 (first) |",
        "|---|---|---|---|---|",
    ]
    for name, p in (("first (scans lines, writes offsets)", first), ("cached (offsets memory-mapped)", again)):
        lines.append(
            f"| {name} | {p['open_s']:.2f} | {p['rss_after']['RssAnon'] - p['rss_before']['RssAnon']:+.0f} MB | "
            f"{p['rss_after']['RssFile'] - p['rss_before']['RssFile']:+.0f} MB | "
            f"{p['fetch512_p50_ms']:.1f} / {p['fetch512_p90_ms']:.1f} ms ({p['fetch512_first_ms']:.1f}) |"
        )
    lines += [
        "",
        f"21M extrapolation: first open ~ {first['open_s'] * scale:.0f} s once (linear in bytes: the scan "
        f"reads the whole file, {size / args.corpus_lines * WIKI18 / 2**30:.1f} GiB at this passage length); "
        f"offsets file {WIKI18 * 16 / 2**20:.0f} MB; cached open {again['open_s']:.2f} s here and does not grow "
        "with N (np.load with mmap reads the header and the last row); a 512-id fetch touches 512 lines "
        "whatever N (warm page cache here; on a cold cache it costs up to 512 random reads).",
    ]
    print("\n".join(lines), flush=True)
    offsets.unlink(missing_ok=True)
    if "server" in args.skip:
        corpus.unlink()
    return lines


def server_section(args: argparse.Namespace) -> list[str]:
    from pvpo.retriever.build import write_dense_index
    from pvpo.retriever.index import write_meta

    n = args.server_lines
    idx = args.work_dir / "server_idx"
    idx.mkdir(exist_ok=True)
    corpus = args.work_dir / "corpus.jsonl"
    if not corpus.exists() or sum(1 for _ in open(corpus, "rb")) != n:
        write_corpus(corpus, n, args.seed)
    dim = 384  # the packaged all-MiniLM-L6-v2 (no other encoder is on this machine)
    t0 = time.perf_counter()
    data, _ = clustered_vectors(n, dim, 1, args.seed)
    nlist = nlist_for(n)
    recipe = args.server_index == "recipe"
    meta = write_dense_index(
        idx,
        [data[i : i + 262144] for i in range(0, n, 262144)],
        index_type=f"IVF{nlist},SQ4" if recipe else "Flat",
        rerank_depth=100 if recipe else 0,
        search_params={"nprobe": 32},
        max_train=64 * nlist,
        seed=args.seed,
    )
    build_s = time.perf_counter() - t0
    del data
    write_meta(
        idx,
        meta
        | {
            "format": 1,
            "corpus": str(corpus),
            "size": n,
            "model": None,
            "query_prefix": "",
            "passage_prefix": "",
            "max_length": 256,
        },
    )
    (idx / "corpus.offsets.npy").unlink(missing_ok=True)
    cold = server_startup(idx)  # the first start also scans the corpus for its offsets
    warm = server_startup(idx)
    index_mb = (idx / meta["index_file"]).stat().st_size / 2**20
    kind = (
        f"IVF{nlist},SQ4 + rerank 100 ({index_mb:.0f} MB index file, its lists memory-mapped, fp16 store "
        f"{fp16_store_gib(n, dim):.2f} GiB mmap)"
        if recipe
        else f"Flat ({index_mb:.0f} MB index file, memory-mapped)"
    )
    lines = [
        "",
        f"## Server startup to first answer: {n:,} passages, {kind}, packaged MiniLM 384-d on CPU (index built "
        f"by write_dense_index from synthetic vectors in {build_s:.0f} s)",
        "",
        "| start | spawn -> first /retrieve answer (server CPU s) | load_retriever (index + corpus + encoder) | "
        "of which index + corpus | server RssAnon |",
        "|---|---|---|---|---|",
    ]
    for name, s in (("first (offsets built)", cold), ("again (offsets cached)", warm)):
        lines.append(
            f"| {name} | {s['first_answer_s']:.1f} s ({s['cpu_s']:.1f}) | {s['load_retriever_s']:.1f} s | "
            f"{s['index_corpus_open_s']:.1f} s | {s['rss_anon_mb']:.0f} MB |"
        )
    print("\n".join(lines), flush=True)
    for p in idx.iterdir():
        p.unlink()
    idx.rmdir()
    corpus.unlink(missing_ok=True)
    return lines


if __name__ == "__main__":
    main()
