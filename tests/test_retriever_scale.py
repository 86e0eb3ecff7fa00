"""The wiki-18-scale index recipe on small synthetic data: a compressed FAISS index whose shortlist
is re-scored exactly from fp16 vectors in a memory-mapped file, through build, load and search."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pvpo.retriever.build import build_index, write_dense_index
from pvpo.retriever.index import (
    DenseRetriever,
    apply_search_params,
    faiss_gpus,
    load_retriever,
    make_faiss_index,
    train_if_needed,
)
from pvpo.retriever.rerank import VECTORS_FILE, Fp16Store, RerankedIndex, rerank, write_fp16_store
from pvpo.retriever.testing import TINY_CORPUS, write_tiny_corpus
from pvpo.retriever.types import Passage

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around 20 seeded centres (float32)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, dim))
    x = centres[rng.integers(0, 20, n)] + 0.6 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _store(tmp_path: Path, x: np.ndarray) -> Fp16Store:
    return Fp16Store(write_fp16_store(tmp_path / VECTORS_FILE, [x[:1000], x[1000:]], len(x), x.shape[1]))


def test_reranked_top_k_equals_exact_search_when_the_shortlist_covers_it(tmp_path: Path) -> None:
    x, q = _clustered(3000, 32, seed=0), _clustered(50, 32, seed=1)
    coarse = make_faiss_index(32, "IVF16,PQ8")
    train_if_needed(coarse, x, seed=0)
    coarse.add(x)
    apply_search_params(coarse, {"nprobe": 16})
    k, depth = 5, 300
    _, shortlist = coarse.search(q, depth)
    x16 = x.astype(np.float16).astype(np.float32)  # the stored vectors, exactly
    exact_ids = np.argsort(-(q @ x16.T), axis=1)[:, :k]
    assert all(set(e) <= set(s) for e, s in zip(exact_ids, shortlist)), "precondition: shortlist covers the top k"

    index = RerankedIndex(coarse, _store(tmp_path, x), depth=depth)
    scores, ids = index.search(q, k)
    assert np.array_equal(ids, exact_ids)
    assert np.allclose(scores, np.take_along_axis(q @ x16.T, exact_ids, axis=1), atol=1e-5)
    # Against fp32 exact search the fp16 store loses nothing at this k on this data.
    assert np.array_equal(ids, np.argsort(-(q @ x.T), axis=1)[:, :k])
    # The compressed codes alone rank differently: the re-ranking is what makes it exact.
    assert not np.array_equal(coarse.search(q, k)[1], exact_ids)


def test_short_or_padded_shortlists_come_back_as_minus_one(tmp_path: Path) -> None:
    x = _clustered(1200, 8, seed=2)
    store = _store(tmp_path, x)
    q = x[:2]
    candidates = np.array([[5, -1, 7], [-1, -1, -1]])
    scores, ids = rerank(store, q, candidates, 4)
    want = sorted([5, 7], key=lambda r: -float(q[0] @ x[r].astype(np.float16).astype(np.float32)))
    assert ids.tolist() == [want + [-1, -1], [-1, -1, -1, -1]]
    assert np.isneginf(scores[0, 2:]).all() and np.isneginf(scores[1]).all()


def test_fp16_store_is_memory_mapped_not_read(tmp_path: Path) -> None:
    x = np.random.default_rng(3).normal(size=(4096, 64)).astype(np.float32)
    rows = 24 << 10  # 24k rows x 1024 dims x 2 bytes = 48 MB on disk
    path = write_fp16_store(tmp_path / VECTORS_FILE, (np.tile(x, (1, 16)) for _ in range(rows // 4096)), rows, 1024)
    assert path.stat().st_size > 48 << 20
    before = _rss_anon_kb()
    store = Fp16Store(path)
    assert isinstance(store.vectors, np.memmap) and store.vectors.dtype == np.float16
    scores, ids = rerank(store, np.tile(x[:3], (1, 16)), np.array([[0, 1, 2, 4097]] * 3), 2)
    assert ids[0, 0] == 0 and ids[1, 0] in (1, 4097) and ids[2, 0] == 2  # rows 1 and 4097 hold the same vector
    after = _rss_anon_kb()
    if before is not None and after is not None:  # Linux: the process's own memory did not take the file in
        assert after - before < 8 << 10


def _rss_anon_kb() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def test_a_store_of_other_rows_is_refused(tmp_path: Path) -> None:
    x = _clustered(1200, 8, seed=4)
    flat = make_faiss_index(8, "Flat")
    flat.add(x[:1100])
    with pytest.raises(ValueError, match="1200 x 8 vectors, the index 1100 x 8"):
        RerankedIndex(flat, _store(tmp_path, x))
    flat.add(x[1100:])
    with pytest.raises(ValueError, match="rerank_depth must be >= 1, got 0"):
        RerankedIndex(flat, _store(tmp_path, x), depth=0)
    with pytest.raises(ValueError, match="rerank_depth 3000 is more than this index returns \\(2048 on GPU\\)"):
        RerankedIndex(flat, _store(tmp_path, x), depth=3000, max_depth=2048)


def test_write_dense_index_writes_index_store_and_params(tmp_path: Path) -> None:
    x = _clustered(2000, 16, seed=5)
    meta = write_dense_index(
        tmp_path, [x[:700], x[700:]], index_type="IVF8,SQ8", rerank_depth=50, search_params={"nprobe": 8}
    )
    assert meta["rerank_file"] == VECTORS_FILE and meta["search_params"]["nprobe"] == 8
    assert meta["search_params"]["rerank_depth"] == 50
    stored = np.load(tmp_path / VECTORS_FILE)
    assert stored.dtype == np.float16 and np.array_equal(stored, x.astype(np.float16))
    meta = write_dense_index(tmp_path, [x], index_type="Flat")
    assert "rerank_file" not in meta and not (tmp_path / VECTORS_FILE).exists()
    with pytest.raises(ValueError, match="rerank_depth must be >= 0"):
        write_dense_index(tmp_path, [x], index_type="Flat", rerank_depth=-1)


def test_adding_with_precomputed_lists_equals_ivf_add(tmp_path: Path) -> None:
    from faiss.contrib.ivf_tools import add_preassigned

    from pvpo.retriever.index import coarse_assigner

    x, q = _clustered(3000, 32, seed=6), _clustered(40, 32, seed=7)
    plain = make_faiss_index(32, "IVF16,SQ8")
    train_if_needed(plain, x, seed=0)
    pre = make_faiss_index(32, "IVF16,SQ8")
    pre.quantizer.add(plain.quantizer.reconstruct_n(0, 16))
    train_if_needed(pre, x, seed=0)
    plain.add(x)
    assign = coarse_assigner(pre, gpu=False)
    assert assign is not None and coarse_assigner(make_faiss_index(32, "Flat"), gpu=False) is None
    for start in range(0, 3000, 1000):  # chunked, as write_dense_index adds
        ids = np.arange(start, start + 1000, dtype=np.int64)  # named: see write_dense_index
        add_preassigned(pre, x[start : start + 1000], assign(x[start : start + 1000]), ids=ids)
    for index in (plain, pre):
        apply_search_params(index, {"nprobe": 4})
    assert np.array_equal(pre.search(q, 10)[1], plain.search(q, 10)[1])
    assert pre.ntotal == plain.ntotal == 3000


def test_ivf_training_sample_grows_with_the_list_count(tmp_path: Path) -> None:
    x = _clustered(6000, 16, seed=10)
    # 100 points cannot train 128 lists; the sample is raised to 40 a list (capped at the data).
    meta = write_dense_index(tmp_path, [x], index_type="IVF128,Flat", max_train=100)
    assert meta["index_type"] == "IVF128,Flat" and (tmp_path / meta["index_file"]).exists()
    with pytest.raises(ValueError, match="cannot train the index on 100 vectors"):
        train_if_needed(make_faiss_index(16, "IVF128,Flat"), x, max_train=100)


@pytest.fixture(scope="module")
def reranked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("scale")
    corpus = write_tiny_corpus(base / "tiny_corpus.json")
    return build_index(
        corpus,
        base / "ivfpq_rerank",
        index_type="IVF2,PQ8x4",
        rerank_depth=len(TINY_CORPUS),
        search_params={"nprobe": 2},
        show_progress=False,
        batch_size=64,
    )


def test_recipe_round_trips_build_load_search_and_equals_flat(reranked_dir: Path, tiny) -> None:
    r = load_retriever(reranked_dir, device="cpu")
    try:
        info = r.info()
        assert info["index_type"] == "IVF2,PQ8x4" and info["rerank"]["depth"] == len(TINY_CORPUS)
        queries = ["capital city", "a musical instrument", "who discovered things", "space"]
        for got, want in zip(r.search(queries, topk=5), tiny.search(queries, topk=5)):
            assert [p.id for p in got] == [p.id for p in want]
            assert np.allclose(_scores(got), _scores(want), atol=2e-3)
    finally:
        r.close()


def _scores(passages: list[Passage]) -> list[float]:
    out = [p.score for p in passages]
    assert all(s is not None for s in out), "dense search returns a score with every passage"
    return [float(s) for s in out if s is not None]


def test_rerank_depth_is_a_search_param_overridable_at_load(reranked_dir: Path) -> None:
    r = load_retriever(reranked_dir, device="cpu", search_params={"nprobe": 1, "rerank_depth": 3})
    try:
        assert isinstance(r, DenseRetriever) and isinstance(r.index, RerankedIndex)
        assert r.info()["rerank"]["depth"] == 3 and r.index.index.nprobe == 1
        assert len(r.search(["capital city"], topk=5)[0]) == 5  # depth below k: k candidates are re-scored
    finally:
        r.close()
    with pytest.raises(FileNotFoundError, match="re-ranking vector file .*nope.npy does not exist"):
        load_retriever(reranked_dir, device="cpu", rerank_file="nope.npy")


@pytest.mark.gpu
@pytest.mark.skipif(faiss_gpus() == 0, reason="needs CUDA and faiss with GPU support")
def test_recipe_on_gpu_fp16_sharded_matches_cpu(reranked_dir: Path) -> None:
    cpu = load_retriever(reranked_dir, device="cpu")
    gpu = load_retriever(reranked_dir, device="cuda")
    try:
        assert gpu.info()["index_device"].startswith("cuda") and "rerank" in gpu.info()
        assert isinstance(gpu, DenseRetriever) and isinstance(gpu.index, RerankedIndex)
        assert gpu.index.max_depth == 2048
        queries = ["capital city", "a musical instrument", "space", "a drink"]
        for a, b in zip(gpu.search(queries, topk=5), cpu.search(queries, topk=5)):
            assert [p.id for p in a] == [p.id for p in b]
    finally:
        cpu.close()
        gpu.close()


def test_a_prebuilt_flat_index_is_reindexed_without_encoding(tmp_path: Path, tiny, monkeypatch) -> None:
    from pvpo.retriever import encoder as encoder_mod
    from pvpo.retriever.build import reindex_prebuilt
    from pvpo.retriever.index import read_meta

    flat_dir = tiny.corpus.path.parent
    out = tmp_path / "from_flat"
    monkeypatch.setattr(encoder_mod.Encoder, "encode_passages", _no_encoding)
    reindex_prebuilt(
        flat_dir / "index.faiss",
        flat_dir / "corpus.jsonl",
        out,
        index_type="IVF2,PQ8x4",
        model=read_meta(flat_dir)["model"],
        rerank_depth=len(TINY_CORPUS),
        search_params={"nprobe": 2},
    )
    meta = read_meta(out)
    # the new file is ours, mapped as any built index (the flat source's "mmap" is not carried over)
    assert meta["index_type"] == "IVF2,PQ8x4" and meta["index_file"] == "index.faiss" and "mmap" not in meta
    assert np.array_equal(np.load(out / VECTORS_FILE), tiny.index.reconstruct_n(0, len(TINY_CORPUS)).astype(np.float16))
    r = load_retriever(out, device="cpu")
    try:
        queries = ["capital city", "a musical instrument", "space"]
        for got, want in zip(r.search(queries, topk=5), tiny.search(queries, topk=5)):
            assert [p.id for p in got] == [p.id for p in want]
    finally:
        r.close()
    with pytest.raises(ValueError, match="bad FAISS index type 'IVF2,Nope'"):
        reindex_prebuilt(flat_dir / "index.faiss", flat_dir / "corpus.jsonl", tmp_path / "bad", index_type="IVF2,Nope")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="is a IndexIVFPQ: only a flat index"):
        reindex_prebuilt(out / "index.faiss", flat_dir / "corpus.jsonl", tmp_path / "bad", index_type="Flat")


def _no_encoding(*args: object, **kwargs: object) -> None:
    raise AssertionError("re-indexing a prebuilt index must not encode passages")


def test_build_cli_reindexes_a_flat_index_with_rerank_and_nprobe(tmp_path: Path, tiny) -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app
    from pvpo.retriever.index import read_meta

    flat_dir = tiny.corpus.path.parent
    out = tmp_path / "cli_idx"
    res = CliRunner().invoke(
        app,
        [
            "retriever",
            "build",
            "--corpus",
            str(flat_dir / "corpus.jsonl"),
            "--out",
            str(out),
            "--from-faiss-index",
            str(flat_dir / "index.faiss"),
            "--model",
            read_meta(flat_dir)["model"],
            "--index-type",
            "IVF2,SQ8",
            "--rerank-depth",
            "10",
            "--nprobe",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    meta = read_meta(out)
    assert meta["index_type"] == "IVF2,SQ8" and meta["rerank_file"] == VECTORS_FILE
    assert meta["search_params"] | {"nprobe": 2, "rerank_depth": 10} == meta["search_params"]


@pytest.mark.gpu
@pytest.mark.skipif(faiss_gpus() == 0, reason="needs CUDA and faiss with GPU support")
def test_gpu_trained_and_assigned_build_reranks_exactly(tmp_path: Path) -> None:
    import faiss

    x, q = _clustered(20000, 32, seed=8), _clustered(30, 32, seed=9)
    meta = write_dense_index(
        tmp_path, [x[:12000], x[12000:]], index_type="IVF64,PQ8", rerank_depth=500, search_params={"nprobe": 64}
    )
    index = RerankedIndex(faiss.read_index(str(tmp_path / meta["index_file"])), Fp16Store(tmp_path / VECTORS_FILE))
    apply_search_params(index, meta["search_params"])
    x16 = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(index.search(q, 5)[1], np.argsort(-(q @ x16.T), axis=1)[:, :5])
