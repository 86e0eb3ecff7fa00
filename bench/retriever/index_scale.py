"""Index recipes for a wiki-18-sized retriever (21M passages, e5-base 768-d), measured at a size
this machine holds and extrapolated to 21M on paper.

Measures, in one run: for each candidate FAISS index (Flat; IVF + SQ8 / SQ4 / PQ, with and
without exact re-ranking of a shortlist from fp16 vectors in a memory-mapped file, which is what
`pvpo retriever build --rerank-depth` builds; HNSW32,SQ8 as the CPU-only option) the build time,
bytes per vector, recall@5 against exact Flat search, and queries/s at batch 1 / 64 / 512; the
same recipe at a quarter of the size (how recall moves with N). With faiss GPU support, the IVF
rows are measured again on the GPUs (fp16, sharded, our `to_device`); elsewhere those rows are
marked skipped. After the indexes, in the same run (each section skippable with `--skip`): the
corpus store on a generated JSON-lines file (`bench/retriever/corpus_store.py`: first open with the offset
scan, cached reopen, RSS, fetch latency of 512 ids) and the whole server's start-up to its first
answer over an index of the corpus's size (`bench/retriever/server_startup.py`); each of the two also runs
alone. Prints the machine, the command and a markdown table, and writes them to
runs/bench/index_scale-<time>.md (git-ignored).

The vectors are `synthetic_index.clustered_vectors` (seeded; described there; the run prints the
mean cosine of two random vectors of this set).

    .venv/bin/python bench/retriever/index_scale.py [--n 1000000] [--dim 768] [--quick]

Timings share the box's cores with whatever else runs; the load average is printed at start and
end. Compare rows within one run, not across runs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.corpus_store import corpus_section
from bench.retriever.server_startup import server_section
from bench.retriever.synthetic_index import WIKI18, clustered_vectors, fp16_store_gib, load_average, nlist_for

REPO = Path(__file__).resolve().parents[2]
RECALL_K = 5


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

    from pvpo.machine import machine_line

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
    sections = {
        "indexes": index_section,
        "corpus": lambda a: corpus_section(a, keep_corpus="server" not in a.skip),  # the server reuses it
        "server": server_section,
    }
    for name, section in sections.items():
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


if __name__ == "__main__":
    main()
