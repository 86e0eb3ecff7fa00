"""Builds an index directory from a corpus file (resumable: embeddings are written in chunks),
and links a prebuilt Search-R1 / FlashRAG FAISS index with its corpus without re-encoding."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pvpo.atomic import disk_full_error
from pvpo.owned import RECORD
from pvpo.retriever.corpus import CorpusCheck, CorpusStore, corpus_layout, iter_corpus, write_jsonl
from pvpo.retriever.index import (
    OFFSETS_FILE,
    make_faiss_index,
    train_if_needed,
    write_meta,
)

log = logging.getLogger(__name__)

CORPUS_FILE = "corpus.jsonl"
INDEX_FILE = "index.faiss"
EMB_DIR = "embeddings"
DEFAULT_SEARCH_PARAMS = {"nprobe": 32, "efSearch": 128}


# Passages per encoder batch. On CPU small batches win: MiniLM over 384 HotpotQA paragraphs (578
# characters mean) on 2 AVX-512 cores encoded 31.5 passages/s at batch 32 vs 19.2 at 256 in float32,
# 72.1 vs 40.7 in bfloat16 (less padding, activations that stay in cache); GPUs prefer big batches.
CPU_PASSAGE_BATCH, GPU_PASSAGE_BATCH = 32, 256
SLICE_BATCHES = 16  # batches per call: the encoder sorts each call's texts by length


def started_empty(out: Path) -> bool:
    """Whether `out` is absent or holds only the manifest `retriever.outdir` writes before a build:
    a build that fails there leaves nothing (`undo_failed_build`)."""
    return not out.exists() or all(p.name == RECORD for p in out.iterdir())


def undo_failed_build(out: Path, *, existed: bool) -> None:
    """Remove what a failed build wrote in a folder it found empty (`started_empty`): its
    entries, and the folder itself when it made it and no manifest is left (`retriever.outdir`
    removes that one)."""
    for p in out.iterdir():
        if p.name == RECORD:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if not existed and not any(out.iterdir()):
        out.rmdir()


def _source_stamp(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def prepare_corpus(corpus: str | Path, out_dir: Path) -> CorpusStore:
    """out_dir/corpus.jsonl in `{"id", "contents"}` form, rewritten only when the source changed."""
    corpus = Path(corpus)
    stamp_file = out_dir / "corpus.source.json"
    stamp = _source_stamp(corpus)
    target = out_dir / CORPUS_FILE
    if not (target.exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp):
        tmp = out_dir / (CORPUS_FILE + ".tmp")
        try:
            check = CorpusCheck(corpus)
            n = write_jsonl(check(iter_corpus(corpus)), tmp)
            if n == 0:
                raise ValueError(f"corpus {corpus} has no passages")
            warning = check.report(tmp)  # duplicate ids refused here, before anything is encoded
            if warning:
                log.warning(warning)
        except BaseException:
            tmp.unlink(missing_ok=True)  # never a partial corpus file
            raise
        os.replace(tmp, target)
        (out_dir / OFFSETS_FILE).unlink(missing_ok=True)
        stamp_file.write_text(json.dumps(stamp))
    return CorpusStore(target, out_dir / OFFSETS_FILE)


def check_rerank_depth(rerank_depth: int) -> None:
    """A one-line error unless `rerank_depth` is >= 0 (0 = no re-ranking); callers check before
    encoding or linking anything."""
    if rerank_depth < 0:
        raise ValueError(f"rerank_depth must be >= 0 (0 = no re-ranking), got {rerank_depth}")


def _encode_chunks(
    store: CorpusStore, emb_dir: Path, encoder: Any, *, chunk_size: int, batch_size: int, show_progress: bool
) -> list[Path]:
    """Encodes the corpus chunk by chunk into emb_dir, skipping chunks already there from an
    interrupted run of the same model and corpus."""
    from pvpo.progress import Progress

    n = len(store)
    manifest = {
        "model": encoder.name,
        "passage_prefix": encoder.prefixes.passage,
        "n": n,
        "chunk_size": chunk_size,
        "dim": encoder.dim,
        "max_length": encoder.max_seq_length,
    }
    manifest_file = emb_dir / "manifest.json"
    if emb_dir.exists() and (not manifest_file.exists() or json.loads(manifest_file.read_text()) != manifest):
        shutil.rmtree(emb_dir)  # embeddings of another model / corpus: start over
    emb_dir.mkdir(parents=True, exist_ok=True)
    manifest_file.write_text(json.dumps(manifest))

    paths = [emb_dir / f"chunk_{c:06d}.npy" for c in range((n + chunk_size - 1) // chunk_size)]
    done = [p.exists() for p in paths]
    initial = sum(min(chunk_size, n - c * chunk_size) for c, d in enumerate(done) if d)
    with Progress(total=n, initial=initial, desc="encoding passages", unit="psg", enabled=show_progress) as bar:
        for c, path in enumerate(paths):
            if done[c]:
                continue
            rows = range(c * chunk_size, min(n, (c + 1) * chunk_size))
            parts: list[np.ndarray] = []
            # the encoder sorts a slice's texts by length before batching them: slices of many
            # batches pad each batch only to texts of similar length
            step = batch_size * SLICE_BATCHES
            for start in range(rows.start, rows.stop, step):
                stop = min(rows.stop, start + step)
                texts = [store.record(r)[1] for r in range(start, stop)]
                parts.append(encoder.encode_passages(texts, batch_size=batch_size))
                bar.update(stop - start)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, np.concatenate(parts).astype(np.float32))
            os.replace(tmp, path)  # a chunk file exists only once complete
    return paths


def _gather(chunks: Sequence[Any], rows: np.ndarray) -> np.ndarray:
    """Rows (sorted) of the matrix the consecutive chunks form."""
    out, start = [], 0
    for chunk in chunks:
        sel = rows[(rows >= start) & (rows < start + len(chunk))] - start
        if sel.size:
            out.append(np.asarray(chunk[sel]))
        start += len(chunk)
    return np.concatenate(out)


def write_dense_index(
    out: Path,
    chunks: Sequence[Any],
    *,
    index_type: str,
    rerank_depth: int = 0,
    search_params: dict[str, Any] | None = None,
    max_train: int = 200_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Trains (when needed) and fills a FAISS index of `index_type` with the vectors of the
    consecutive `chunks` (arrays, memory maps or `FlatRows`), writes it to out/index.faiss and, with
    `rerank_depth` > 0, the same vectors in fp16 to out/vectors.f16.npy for exact re-ranking of
    a shortlist of that depth. Returns the meta.json entries of the index."""
    import faiss
    from faiss.contrib.ivf_tools import add_preassigned

    from pvpo.retriever.index import coarse_assigner, faiss_gpus
    from pvpo.retriever.rerank import VECTORS_FILE, write_fp16_store

    check_rerank_depth(rerank_depth)
    n = sum(len(c) for c in chunks)
    dim = int(chunks[0].shape[1])
    index = make_faiss_index(dim, index_type)
    try:
        nlist = int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:  # not an IVF index
        nlist = 0
    # faiss's k-means wants >= 39 points a list: 65,536 lists (wiki-18) train on 2.6M points
    # (8 GB of 768-d float32), not the default sample of 200,000.
    max_train = max(max_train, 40 * nlist)
    if not index.is_trained:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=min(n, max_train), replace=False))
        train_if_needed(index, _gather(chunks, rows), max_train=max_train, seed=seed)
    assign = coarse_assigner(index, gpu=True) if faiss_gpus() else None
    for chunk in chunks:
        x = np.ascontiguousarray(chunk, dtype=np.float32)
        if assign is None:
            index.add(x)
        else:  # lists found on the GPUs, codes written on CPU
            # A named array: add_preassigned rebinds its `ids` argument to a raw pointer, and an
            # inline temporary is then freed before faiss reads it (garbage ids, caught by a test).
            ids = np.arange(index.ntotal, index.ntotal + len(x), dtype=np.int64)
            add_preassigned(index, x, assign(x), ids=ids)
    tmp_index = out / (INDEX_FILE + ".tmp")
    try:
        faiss.write_index(index, str(tmp_index))
        os.replace(tmp_index, out / INDEX_FILE)
    except RuntimeError as err:  # faiss reports a full disk as a failed fwrite, without an errno
        full = disk_full_error(err, out / INDEX_FILE)
        if full is not None:
            raise full from err
        raise
    finally:
        tmp_index.unlink(missing_ok=True)
    params = dict(DEFAULT_SEARCH_PARAMS) | (search_params or {})
    meta: dict[str, Any] = {"backend": "faiss", "index_type": index_type, "index_file": INDEX_FILE, "dim": dim}
    if rerank_depth:
        write_fp16_store(out / VECTORS_FILE, chunks, n, dim)
        meta["rerank_file"] = VECTORS_FILE
        params["rerank_depth"] = rerank_depth
    else:
        (out / VECTORS_FILE).unlink(missing_ok=True)  # a rebuild without re-ranking drops a stale store
    meta["search_params"] = params
    return meta


def export_query_encoder(encoder: Any) -> None:
    """Exports `encoder`'s model for the query backend a CPU server of the index will use (ONNX
    Runtime by default) into the export cache, so that server starts without torch or
    sentence-transformers; nothing when that backend is torch or its packages are missing (the
    server then exports at its first start, or encodes with torch)."""
    from pvpo.retriever.encoder import default_backend
    from pvpo.retriever.runtimes import MissingRuntime, cached_export, exported_model

    backend = default_backend("cpu", queries=True)[0]
    if backend == "torch" or cached_export(encoder.path, encoder.max_seq_length, backend) is not None:
        return
    try:
        exported_model(encoder.model, encoder.path, backend)
    except MissingRuntime as e:
        log.info("no %s export of the query encoder: %s", backend, e)


def build_index(
    corpus: str | Path,
    out_dir: str | Path,
    *,
    model: str | None = None,
    index_type: str = "Flat",
    batch_size: int | None = None,
    show_progress: bool = True,
    device: str | None = None,
    chunk_size: int = 16384,
    max_length: int = 256,
    keep_embeddings: bool = True,
    max_train: int = 200_000,
    seed: int = 0,
    rerank_depth: int = 0,
    search_params: dict[str, Any] | None = None,
) -> Path:
    """Builds an index directory from a corpus file (any supported format) and returns its path.

    `index_type` is a FAISS `index_factory` string (inner product) or "bm25" for the lexical
    backend. `rerank_depth` > 0 keeps the vectors in fp16 beside the index and re-scores that many
    candidates exactly (for compressed types such as IVF65536,PQ64); `search_params` (nprobe,
    efSearch, rerank_depth) are stored in meta.json and applied at load. Re-running after an
    interruption resumes encoding at the first missing chunk."""
    from pvpo.retriever.encoder import Encoder

    check_rerank_depth(rerank_depth)
    out = Path(out_dir)
    created, existed = started_empty(out), out.exists()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        store = prepare_corpus(corpus, out)
    except BaseException:
        if created:  # nothing of this build is worth keeping: leave no directory behind
            undo_failed_build(out, existed=existed)
        raise
    meta: dict[str, Any] = {
        "format": 1,
        "corpus": CORPUS_FILE,
        "size": len(store),
        "source": str(Path(corpus).resolve()),
    }
    try:
        if index_type.lower() == "bm25":
            from pvpo.retriever.bm25 import build_bm25

            build_bm25(store, out, show_progress=show_progress)
            meta |= {"backend": "bm25", "index_type": "bm25", "model": "bm25", "dim": 0}
        else:
            encoder = Encoder(model, device=device, max_length=max_length)
            if batch_size is None:
                batch_size = CPU_PASSAGE_BATCH if encoder.device == "cpu" else GPU_PASSAGE_BATCH
            make_faiss_index(encoder.dim, index_type)  # a bad factory string fails before encoding
            paths = _encode_chunks(
                store, out / EMB_DIR, encoder, chunk_size=chunk_size, batch_size=batch_size, show_progress=show_progress
            )
            meta |= write_dense_index(
                out,
                [np.load(p, mmap_mode="r") for p in paths],
                index_type=index_type,
                rerank_depth=rerank_depth,
                search_params=search_params,
                max_train=max_train,
                seed=seed,
            )
            meta |= {
                "model": encoder.name,
                "query_prefix": encoder.prefixes.query,
                "passage_prefix": encoder.prefixes.passage,
                "max_length": max_length,
            }
            export_query_encoder(encoder)
            if not keep_embeddings:
                shutil.rmtree(out / EMB_DIR)
    finally:
        store.close()
    meta["build_seconds"] = round(time.perf_counter() - t0, 2)
    write_meta(out, meta)
    return out


def link_prebuilt(
    faiss_index: str | Path,
    corpus_jsonl: str | Path,
    out_dir: str | Path,
    *,
    model: str = "intfloat/e5-base-v2",
    index_type: str | None = None,
    max_length: int = 256,
    mmap: bool | None = None,
) -> Path:
    """An index directory that points at an existing FAISS index and its corpus (same row order),
    e.g. Search-R1's `e5_Flat.index` + `wiki-18.jsonl`: nothing is re-encoded; a JSON-lines corpus
    is not copied (its line spans are computed once and cached in out_dir), another corpus format
    is converted into out_dir. An index whose vector count is not the corpus's passage count is
    refused, and a refused or failed link leaves no directory it created."""
    from pvpo.retriever.encoder import prefixes_for

    faiss_index, corpus_jsonl, out = Path(faiss_index).resolve(), Path(corpus_jsonl).resolve(), Path(out_dir)
    for p in (faiss_index, corpus_jsonl):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
    if index_type is None:  # Search-R1 / FlashRAG name files <model>_<factory string>.index
        stem = faiss_index.stem
        index_type = stem.split("_", 1)[1] if "_" in stem else stem
    vectors = _vector_count(faiss_index)
    created, existed = started_empty(out), out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        if corpus_layout(corpus_jsonl) == "jsonl":
            store = CorpusStore(corpus_jsonl, out / OFFSETS_FILE)
        else:
            store = prepare_corpus(corpus_jsonl, out)
            corpus_jsonl = Path(CORPUS_FILE)  # in the directory: relative, so it can be moved
        size = len(store)
        store.close()
        if size != vectors:
            raise ValueError(
                f"{faiss_index} holds {vectors} vectors but {corpus_jsonl} has {size} passages: "
                "an index and its corpus must have the same rows, in the same order"
            )
    except BaseException:
        if created:
            undo_failed_build(out, existed=existed)
        else:
            (out / OFFSETS_FILE).unlink(missing_ok=True)
        raise
    prefixes = prefixes_for(model)
    write_meta(
        out,
        {
            "format": 1,
            "backend": "faiss",
            "index_type": index_type,
            "index_file": str(faiss_index),
            "corpus": str(corpus_jsonl),
            "size": size,
            "model": model,
            "query_prefix": prefixes.query,
            "passage_prefix": prefixes.passage,
            "max_length": max_length,
            "search_params": DEFAULT_SEARCH_PARAMS,
        }
        | ({} if mmap is None else {"mmap": mmap}),  # absent: mapped on CPU, read for a GPU (load_retriever)
    )
    return out


class FlatRows:
    """Rows [start, stop) of a flat FAISS index read lazily: behaves as an (n, dim) array where
    `write_dense_index` needs one (len, shape, row selection, conversion), reconstructing only the
    rows asked for, so a 64 GB memory-mapped e5_Flat.index is re-indexed a chunk at a time."""

    def __init__(self, index: Any, start: int, stop: int) -> None:
        self.index, self.start, self.stop = index, start, stop
        self.shape = (stop - start, int(index.d))

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        ids = np.asarray(rows, dtype=np.int64) + self.start
        return self.index.reconstruct_batch(ids)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.index.reconstruct_n(self.start, len(self))
        return out if dtype is None else out.astype(dtype, copy=False)


def reindex_prebuilt(
    faiss_index: str | Path,
    corpus_jsonl: str | Path,
    out_dir: str | Path,
    *,
    index_type: str,
    model: str = "intfloat/e5-base-v2",
    rerank_depth: int = 0,
    search_params: dict[str, Any] | None = None,
    max_length: int = 256,
    chunk_size: int = 262_144,
    max_train: int = 200_000,
    seed: int = 0,
) -> Path:
    """An index directory of another type built from the vectors of a prebuilt flat index (e.g.
    Search-R1's e5_Flat.index of wiki-18, memory-mapped; nothing is re-encoded): the corpus is
    checked and used as `link_prebuilt` does, then `write_dense_index` trains and fills
    `index_type` (and the fp16 re-ranking store) from the flat vectors, chunk by chunk."""
    import faiss

    from pvpo.retriever.index import read_faiss_index, read_meta

    check_rerank_depth(rerank_depth)
    if not Path(faiss_index).exists():
        raise FileNotFoundError(f"{faiss_index} does not exist")
    flat = read_faiss_index(Path(faiss_index), mmap=True)  # faiss returns it as its own class
    if not isinstance(flat, faiss.IndexFlat):
        raise ValueError(f"{faiss_index} is a {type(flat).__name__}: only a flat index holds the vectors to re-index")
    make_faiss_index(int(flat.d), index_type)  # a bad factory string fails before anything is written
    created, existed = started_empty(Path(out_dir)), Path(out_dir).exists()
    out = link_prebuilt(faiss_index, corpus_jsonl, out_dir, model=model, index_type="Flat", max_length=max_length)
    n = int(flat.ntotal)
    chunks = [FlatRows(flat, s, min(n, s + chunk_size)) for s in range(0, n, chunk_size)]
    t0 = time.perf_counter()
    try:
        meta = read_meta(out)
        meta |= write_dense_index(
            out,
            chunks,
            index_type=index_type,
            rerank_depth=rerank_depth,
            search_params=search_params,
            max_train=max_train,
            seed=seed,
        )
    except BaseException:
        if created:  # not even the link is kept: the directory would not be the index asked for
            undo_failed_build(out, existed=existed)
        raise
    meta.pop("mmap", None)  # the new index file is ours: mapped on CPU, read for a GPU (load_retriever)
    meta |= {
        "source_index": str(Path(faiss_index).resolve()),
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    write_meta(out, meta)
    return out


def _vector_count(faiss_index: Path) -> int:
    """How many vectors a FAISS index file holds, memory-mapping it where FAISS can (a 60 GB flat
    index is not read into memory for this)."""
    from pvpo.retriever.index import read_faiss_index

    try:
        index = read_faiss_index(faiss_index, mmap=True)
    except RuntimeError:  # index types FAISS cannot map
        index = read_faiss_index(faiss_index)
    return int(index.ntotal)
