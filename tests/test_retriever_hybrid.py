"""Hybrid retrieval: weighted reciprocal rank fusion (Cormack et al. 2009) of a dense and a BM25
ranking, on hand-made rankings with exact expected orders and scores, and as a built backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pvpo.retriever.hybrid import HybridRetriever, build_hybrid, link_hybrid, rrf_fuse
from pvpo.retriever.index import get_backend, load_retriever
from pvpo.retriever.testing import TINY_QUERIES, build_tiny_index, write_tiny_corpus

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_rrf_equal_weights_hand_computed() -> None:
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    fused = rrf_fuse([["a", "b", "c"], ["c", "a", "d"]], [1.0, 1.0], k=60)
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    assert [s for _, s in fused] == pytest.approx([1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62, 1 / 63], abs=1e-15)


def test_rrf_weights_change_the_order() -> None:
    # second list weighted 2: c = 1/63 + 2/61 = 0.048660 beats a = 1/61 + 2/62 = 0.048651
    fused = rrf_fuse([["a", "b", "c"], ["c", "a", "d"]], [1.0, 2.0], k=60)
    assert [d for d, _ in fused] == ["c", "a", "d", "b"]
    assert fused[0][1] == pytest.approx(1 / 63 + 2 / 61, abs=1e-15)
    # weight 0 on the second list: the first list's order, its scores 1/(k + rank)
    assert rrf_fuse([["a", "b", "c"], ["c", "a", "d"]], [1.0, 0.0], k=1, topk=2) == [("a", 0.5), ("b", 1 / 3)]


def test_rrf_ties_are_ordered_by_id_and_k_matters() -> None:
    # x first in one list, y first in the other: same score, id order decides
    assert [d for d, _ in rrf_fuse([["y", "x"], ["x", "y"]], [1.0, 1.0])] == ["x", "y"]
    # k = 0: c (1/2 + 1/1 = 1.5) beats a (1/1 + 1/3 = 1.33)
    assert [d for d, _ in rrf_fuse([["a", "c"], ["c", "x", "a"]], [1.0, 1.0], k=0)][:2] == ["c", "a"]


@pytest.mark.parametrize("weights,match", [([1.0], "two numbers"), ([-1, 1], ">= 0"), ([0, 0], "not both 0")])
def test_bad_weights_are_named(weights, match) -> None:
    with pytest.raises(ValueError, match=match):
        HybridRetriever(_Fixed({}), _Fixed({}), weights=weights)


class _Fixed:
    """A retriever double with fixed rankings per query (only what HybridRetriever calls)."""

    def __init__(self, rankings: dict[str, list[str]]) -> None:
        from pvpo.retriever.types import Passage

        self.rankings, self.Passage, self.corpus, self.asked = rankings, Passage, None, []

    def __len__(self) -> int:
        return 10

    def search_varying(self, queries, topks):
        self.asked.append(list(topks))
        return [
            [self.Passage(d, f'"{d}"\ntext {d}', 1.0) for d in self.rankings[q][:k]] for q, k in zip(queries, topks)
        ]

    def close(self) -> None:
        pass


def test_hybrid_retriever_fuses_each_query_and_asks_for_depth() -> None:
    dense = _Fixed({"q1": ["a", "b", "c"], "q2": ["z"]})
    lexical = _Fixed({"q1": ["c", "a", "d"], "q2": ["y", "z"]})
    h = HybridRetriever(dense, lexical, weights=(1.0, 2.0), k=60, depth=5)
    out = h.search_varying(["q1", "q2"], [3, 1])
    assert [[p.id for p in r] for r in out] == [["c", "a", "d"], ["z"]]
    assert out[0][0].score == pytest.approx(1 / 63 + 2 / 61) and out[0][0].contents == '"c"\ntext c'
    assert out[1][0].score == pytest.approx(1 / 61 + 2 / 62)  # z: dense 1st, lexical 2nd beats y (2/61)
    assert dense.asked == [[5, 5]] and lexical.asked == [[5, 5]]


def test_built_hybrid_index_ranks_as_rrf_of_its_parts(tmp_path: Path) -> None:
    assert get_backend("hybrid") is not None  # registered lazily through the backend registry
    base = tmp_path / "r"
    corpus = write_tiny_corpus(base / "tiny_corpus.json")
    out = build_hybrid(corpus, base / "hybrid", show_progress=False, batch_size=64, weights=(1.0, 0.5), depth=8)
    h = load_retriever(out, device="cpu")
    assert h.info()["backend"] == "hybrid" and h.info()["weights"] == [1.0, 0.5] and len(h) > 0
    queries = [q for q, _ in TINY_QUERIES]
    dense, lexical = h.dense.search(queries, topk=8), h.lexical.search(queries, topk=8)
    got = h.search(queries, topk=3)
    for d, lx, g in zip(dense, lexical, got):
        want = rrf_fuse([[p.id for p in d], [p.id for p in lx]], [1.0, 0.5], k=60, topk=3)
        assert [(p.id, p.score) for p in g] == [(i, pytest.approx(s)) for i, s in want]
    assert [r[0].title for r in got] == [title for _, title in TINY_QUERIES]
    # weights given at load time replace the stored ones
    lex_only = load_retriever(out, device="cpu", weights=[0.0, 1.0])
    assert [p.id for p in lex_only.search(queries[:1], topk=3)[0]] == [p.id for p in lexical[0][:3]]
    lex_only.close()
    h.close()


def test_link_hybrid_refuses_parts_of_different_corpora(tmp_path: Path) -> None:
    dense = build_tiny_index(tmp_path)
    from pvpo.retriever.build import build_index

    other = tmp_path / "other.json"
    other.write_text('[{"title": "A", "text": "only one passage"}]')
    bm25 = build_index(other, tmp_path / "bm25", index_type="bm25", show_progress=False)
    with pytest.raises(ValueError, match="passages but .* has 1: both must index the same corpus"):
        link_hybrid(dense, bm25, tmp_path / "h")
    with pytest.raises(ValueError, match="the lexical side must be bm25"):
        link_hybrid(dense, dense, tmp_path / "h2")


def test_build_command_makes_a_hybrid_directory(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app

    corpus = write_tiny_corpus(tmp_path / "c.json")
    res = CliRunner().invoke(
        app,
        [
            "retriever",
            "build",
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "h"),
            "--index-type",
            "hybrid:HNSW32",
            "--hybrid-weights",
            "1,0.5",
            "--encoder-backend",
            "torch",
        ],
    )
    assert res.exit_code == 0, res.output
    h = load_retriever(tmp_path / "h", device="cpu")
    assert h.info()["index_type"] == "hybrid(HNSW32+bm25)" and h.info()["weights"] == [1.0, 0.5]
    assert h.search(["who wrote Hamlet"], topk=1)[0][0].title == "Shakespeare"
    h.close()
    bad = CliRunner().invoke(
        app, ["retriever", "build", "--corpus", str(corpus), "--out", str(tmp_path / "x"), "--encoder-backend", "onx"]
    )
    assert bad.exit_code == 2 and "unknown encoder backend 'onx'" in " ".join(bad.output.replace("│", " ").split())


def test_hybrid_index_is_served_over_http(tmp_path: Path) -> None:
    import httpx

    from pvpo.retriever.server import BackgroundServer

    out = build_hybrid(write_tiny_corpus(tmp_path / "c.json"), tmp_path / "h", show_progress=False, batch_size=64)
    with BackgroundServer(out, device="cpu") as server:
        info = httpx.get(server.url + "/info").json()
        assert info["backend"] == "hybrid" and info["encoder"]["backend"] in ("torch", "onnx", "onnx-int8", "openvino")
        r = httpx.post(server.url + "/retrieve", json={"query": "who wrote Hamlet", "top_k": 2, "return_scores": True})
        [[first, _]] = r.json()["result"]
        assert first["document"]["contents"].startswith('"Shakespeare"') and first["score"] > 0
