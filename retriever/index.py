"""In-process retrievers over a built index directory: the base class, the backend registry,
FAISS index helpers and the dense (encoder + FAISS) retriever.

An index directory holds `meta.json` (which backend, model, index type, corpus file, ...), the
corpus as JSON lines with a cached line-span table, and the backend's own files."""

from __future__ import annotations

import errno
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pvpo.atomic import DamagedFileError, read_json
from pvpo.registry import Registry
from pvpo.retriever.corpus import CorpusStore
from pvpo.retriever.types import Passage

log = logging.getLogger(__name__)

META_FILE = "meta.json"
OFFSETS_FILE = "corpus.offsets.npy"
DEFAULT_TOPK = 3


class Retriever(ABC):
    """A searchable index with its corpus; implements the Searcher protocol."""

    backend: str = ""
    corpus: CorpusStore
    default_topk: int = DEFAULT_TOPK

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top passages of each query, best first, with scores."""
        k = self.default_topk if topk is None else topk
        return self.search_varying(list(queries), [k] * len(queries))

    @abstractmethod
    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        """Like `search`, with its own topk per query (what a batch of coalesced requests needs)."""

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What `/info` reports: backend, model, index_type, size, dim, device."""

    def __len__(self) -> int:
        return len(self.corpus)

    def close(self) -> None:
        """Releases the corpus file."""
        self.corpus.close()


# --- backend registry -------------------------------------------------------------------------

Loader = Callable[[Path, dict[str, Any], str | None], Retriever]
# Backends living in their own module are imported when first asked for.
BACKENDS: Registry[Loader] = Registry(
    "retriever backend", lazy={"bm25": "pvpo.retriever.bm25", "hybrid": "pvpo.retriever.hybrid"}
)


def register_backend(name: str) -> Callable[[Loader], Loader]:
    """Registers `loader(index_dir, meta, device) -> Retriever` under a backend name."""
    return BACKENDS.register(name)


def get_backend(name: str) -> Loader:
    """The loader of a backend; unknown names fail with the list of known ones."""
    return BACKENDS.get(name)


def read_meta(index_dir: str | Path) -> dict[str, Any]:
    """The index directory's metadata."""
    path = Path(index_dir) / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{index_dir} is not an index directory: {META_FILE} is missing")
    meta = read_json(path, fix="rebuild the index with `pvpo retriever build` (or restore the file from a copy)")
    if not isinstance(meta, dict):
        raise DamagedFileError(path, f"a JSON {type(meta).__name__}, not an object", "rebuild the index")
    return meta


def write_meta(index_dir: str | Path, meta: dict[str, Any]) -> None:
    (Path(index_dir) / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False))


def resolve_in(index_dir: Path, path: str) -> Path:
    """A path from meta.json: relative ones are relative to the index directory."""
    p = Path(path)
    return p if p.is_absolute() else index_dir / p


def open_corpus(index_dir: Path, meta: dict[str, Any]) -> CorpusStore:
    """The corpus store of an index directory (line spans cached beside meta.json)."""
    return CorpusStore(resolve_in(index_dir, meta["corpus"]), index_dir / OFFSETS_FILE)


def load_retriever(index_dir: str | Path, *, device: str | None = None, **overrides: Any) -> Retriever:
    """Opens an index directory as an in-process retriever on `device` ("cpu", "cuda"; None = GPU
    when present). `overrides` replace meta.json entries (e.g. `model=` a local path of the
    encoder, `search_params={"nprobe": 64}`)."""
    index_dir = Path(index_dir)
    meta = read_meta(index_dir) | overrides
    t0 = time.perf_counter()
    retriever = get_backend(meta.get("backend", "faiss"))(index_dir, meta, device)
    log.info(
        "loaded %s index %s (%d passages) in %.1fs",
        retriever.backend,
        index_dir,
        len(retriever),
        time.perf_counter() - t0,
    )
    return retriever


# --- FAISS helpers ----------------------------------------------------------------------------


def make_faiss_index(dim: int, index_type: str) -> Any:
    """An empty inner-product FAISS index from an `index_factory` string (Flat, HNSW32,
    IVF1024,Flat, IVF256,PQ16, ...)."""
    import faiss

    try:
        return faiss.index_factory(dim, index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"bad FAISS index type {index_type!r}: {str(e).splitlines()[-1]}") from e


def train_if_needed(index: Any, vectors: np.ndarray, *, max_train: int = 200_000, seed: int = 0) -> None:
    """Trains an index that needs it (IVF, PQ) on a seeded random sample of the vectors."""
    import faiss

    if index.is_trained:
        return
    try:
        ivf: Any = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:  # not an IVF index
        ivf = None
    if ivf is not None and getattr(ivf, "do_polysemous_training", False):
        # index_factory turns on polysemous training for IVF-PQ; its codes only help a Hamming
        # pre-filter (polysemous_ht) that nothing here sets, and it dominates training time
        # (IVF16,PQ8 on 3,000 x 32-d: 13 s with it, 0.2 s without, measured on this 2-core box).
        ivf.do_polysemous_training = False
    gpu_kmeans = ivf is not None and faiss_gpus() > 0
    if gpu_kmeans:
        # The coarse k-means on the GPUs (faiss's own clustering_index hook): 65,536 lists of 768-d on
        # 2.6M points is ~1e16 flops, minutes on a GPU, hours on CPU cores. L2 on unit vectors
        # gives the same assignments as inner product.
        ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(ivf.d))
    n = len(vectors)
    if n > max_train:
        vectors = vectors[np.sort(np.random.default_rng(seed).choice(n, size=max_train, replace=False))]
    # else all rows train, without a second copy (a 2.6M x 768 sample for wiki-18 is 8 GB)
    try:
        index.train(np.ascontiguousarray(vectors, dtype=np.float32))
    except RuntimeError as e:  # e.g. fewer training points than centroids
        raise ValueError(f"cannot train the index on {len(vectors)} vectors: {str(e).splitlines()[-1]}") from e
    finally:
        if gpu_kmeans:
            ivf.clustering_index = None


def faiss_gpus() -> int:
    """GPUs faiss can use here (0 with faiss-cpu or without CUDA)."""
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def coarse_assigner(index: Any, *, gpu: bool) -> Callable[[np.ndarray], np.ndarray] | None:
    """For a trained plain IVF index: vectors -> their IVF list, by a flat search over the
    centroids on all GPUs (`gpu`) or on CPU; None for other index types. Adding with these
    precomputed lists (`add_preassigned`) is how 21M vectors go into 65,536 lists in minutes on a
    GPU: IVF's own add assigns on CPU, 21M x 65,536 x 768 multiply-adds."""
    import faiss

    if type(index).__name__.startswith("IndexPreTransform") or not type(index).__name__.startswith("IndexIVF"):
        return None
    flat: Any = faiss.IndexFlat(index.d, index.metric_type)
    flat.add(index.quantizer.reconstruct_n(0, index.nlist))
    if gpu:
        flat = faiss.index_cpu_to_all_gpus(flat)

    def assign(x: np.ndarray) -> np.ndarray:
        return flat.search(x, 1)[1][:, 0].copy()

    return assign


def apply_search_params(index: Any, params: dict[str, Any]) -> None:
    """Sets search-time parameters (nprobe, efSearch, ...) the index understands; ignores others.
    `rerank_depth` sets a re-ranked index's shortlist; the rest go to the index under it."""
    import faiss

    from pvpo.retriever.rerank import RerankedIndex

    if isinstance(index, RerankedIndex):
        params = dict(params)
        if "rerank_depth" in params:
            index.set_depth(params.pop("rerank_depth"))
        index = index.index
    space = (
        faiss.GpuParameterSpace()
        if "Gpu" in type(index).__name__ or "Shards" in type(index).__name__
        else faiss.ParameterSpace()
    )
    for name, value in params.items():
        try:
            space.set_index_parameter(index, name, value)
        except (RuntimeError, AttributeError):
            log.debug("index %s has no search parameter %s", type(index).__name__, name)


# faiss's scratch memory per GPU: older StandardGpuResources reserved 18% of the device (14 GB of
# an 80 GB H100 beside training); 1 GiB holds the temporary distance tables of a 512-query batch.
GPU_TEMP_MB = 1024


def to_device(index: Any, device: str, *, temp_mb: int = GPU_TEMP_MB) -> tuple[Any, str]:
    """The index on all GPUs (fp16, sharded) when `device` is CUDA and faiss has GPU support;
    otherwise unchanged. Each GPU's faiss scratch memory is capped at `temp_mb`. Returns (index,
    where it lives)."""
    import faiss

    if not device.startswith("cuda"):
        return index, "cpu"
    ngpu = faiss_gpus()
    if ngpu == 0 or not hasattr(faiss, "index_cpu_to_gpu_multiple_py"):
        log.warning("faiss has no GPU support here: the index stays on CPU")
        return index, "cpu"
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16 = True  # fp16 IVF-Flat storage / IVF-PQ lookup tables (PQ64 needs them on GPU)
    co.shard = True
    resources = []
    for _ in range(ngpu):
        res = faiss.StandardGpuResources()
        res.setTempMemory(temp_mb << 20)
        resources.append(res)
    try:
        gpu_index: Any = faiss.index_cpu_to_gpu_multiple_py(resources, index, co)
    except RuntimeError as e:  # e.g. HNSW has no GPU implementation
        log.warning("index type cannot move to GPU (%s): it stays on CPU", e)
        return index, "cpu"
    gpu_index.referenced_objects = resources  # the resources must outlive the index
    return gpu_index, f"cuda x{ngpu} (fp16, sharded, {temp_mb} MB scratch each)"


def read_faiss_index(path: Path, *, mmap: bool = False) -> Any:
    """Reads a FAISS index file; `mmap` maps it read-only from disk where FAISS can instead of
    reading it: an IVF index's inverted lists (`IO_FLAG_MMAP`), the codes of a flat-codes index
    (Flat, HNSW's storage, PQ, SQ: `IO_FLAG_MMAP_IFC`). The two flags cannot be combined (an IVF
    index read with both fails in FAISS 1.15), so the file's first four bytes choose."""
    import faiss

    if not Path(path).is_file():
        raise FileNotFoundError(
            errno.ENOENT, "no FAISS index file (rebuild the index with `pvpo retriever build`)", str(path)
        )
    flags = 0
    if mmap:
        with open(path, "rb") as f:
            ivf = f.read(4).startswith(b"Iw")  # FAISS's IVF index types are written as "Iw.."
        flat_codes = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP)  # older FAISS: one flag for both
        flags = (faiss.IO_FLAG_MMAP if ivf else flat_codes) | faiss.IO_FLAG_READ_ONLY
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as e:  # faiss reads a cut or corrupted file as "read error" / "Index type ... not recognized"
        raise DamagedFileError(
            path, _last_line(e), "rebuild the index with `pvpo retriever build --corpus ... --out DIR`"
        ) from None


def _last_line(err: BaseException) -> str:
    """The useful part of a FAISS error (its last line, without the C++ location before it)."""
    text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return text.split("' failed: ")[-1].split("Error: ")[-1].strip()


# --- dense retriever --------------------------------------------------------------------------


class DenseRetriever(Retriever):
    """Encoder + FAISS inner-product index + corpus store."""

    backend = "faiss"

    def __init__(
        self,
        index: Any,
        encoder: Any,
        corpus: CorpusStore,
        *,
        index_type: str,
        index_device: str,
        search_params: dict[str, Any] | None = None,
    ) -> None:
        if index.ntotal != len(corpus):
            raise ValueError(
                f"index has {index.ntotal} vectors but the corpus has {len(corpus)} passages: "
                "they must be the same rows in the same order"
            )
        if index.d != encoder.dim:
            raise ValueError(f"index dimension {index.d} != encoder {encoder.name} dimension {encoder.dim}")
        self.index = index
        self.encoder = encoder
        self.corpus = corpus
        self.index_type = index_type
        self.index_device = index_device
        apply_search_params(index, search_params or {})

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        if len(queries) != len(topks):
            raise ValueError("one topk per query")
        if not queries or self.index.ntotal == 0:
            return [[] for _ in queries]
        # Rollouts of one prompt often repeat a query: encode each distinct string once.
        uniq = list(dict.fromkeys(queries))
        pos = {q: i for i, q in enumerate(uniq)}
        emb = self.encoder.encode_queries(uniq)
        out: list[list[Passage]] = [[] for _ in queries]
        by_k: dict[int, list[int]] = {}
        for i, k in enumerate(topks):
            by_k.setdefault(int(k), []).append(i)
        for k, members in by_k.items():
            rows_u = sorted({pos[queries[i]] for i in members})
            scores, ids = self.index.search(emb[rows_u], min(k, self.index.ntotal))
            hit = {u: r for r, u in enumerate(rows_u)}
            for i in members:
                r = hit[pos[queries[i]]]
                valid = ids[r] >= 0
                out[i] = self.corpus.passages(ids[r][valid], scores[r][valid])
        return out

    def info(self) -> dict[str, Any]:
        from pvpo.retriever.rerank import RerankedIndex

        out = {
            "backend": self.backend,
            "model": self.encoder.name,
            "index_type": self.index_type,
            "size": int(self.index.ntotal),
            "dim": int(self.index.d),
            "device": self.encoder.device,
            "index_device": self.index_device,
        }
        if isinstance(self.index, RerankedIndex):
            out["rerank"] = {"depth": self.index.depth, "vectors": "fp16, memory-mapped"}
        return out


@register_backend("faiss")
def _load_dense(index_dir: Path, meta: dict[str, Any], device: str | None) -> DenseRetriever:
    from pvpo.retriever.encoder import Encoder, Prefixes, default_device

    device = device or default_device()
    t0 = time.perf_counter()
    # On CPU mapped unless meta.json says otherwise (`pvpo retriever link --no-mmap`): a server is
    # ready before the index is read, and the page cache, not the process, holds it. An index
    # bound for the GPU is read as before unless meta.json asks for the mapping (an IVF index
    # with mapped lists is not known to copy to the GPU: untested here, no GPU).
    mmap = bool(meta.get("mmap", not device.startswith("cuda")))
    index = read_faiss_index(resolve_in(index_dir, meta["index_file"]), mmap=mmap)
    index, where = to_device(index, device, temp_mb=int(meta.get("gpu_temp_mb", GPU_TEMP_MB)))
    if meta.get("rerank_file"):  # a compressed index whose shortlist is re-scored from fp16 vectors
        from pvpo.retriever.rerank import GPU_MAX_DEPTH, Fp16Store, RerankedIndex

        index = RerankedIndex(
            index,
            Fp16Store(resolve_in(index_dir, meta["rerank_file"])),
            max_depth=GPU_MAX_DEPTH if where.startswith("cuda") else None,
        )
    corpus = open_corpus(index_dir, meta)
    log.info("index + corpus opened in %.1fs", time.perf_counter() - t0)
    prefixes = Prefixes(meta["query_prefix"], meta.get("passage_prefix", "")) if "query_prefix" in meta else None
    encoder = Encoder(
        meta.get("model"), device=device, max_length=meta.get("max_length", 256), prefixes=prefixes, queries=True
    )
    retriever = DenseRetriever(
        index,
        encoder,
        corpus,
        index_type=meta.get("index_type", "Flat"),
        index_device=where,
        search_params=meta.get("search_params"),
    )
    retriever.default_topk = int(meta.get("default_topk", DEFAULT_TOPK))
    return retriever
