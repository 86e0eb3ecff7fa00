"""Hybrid retrieval backend: a dense and a lexical (BM25) retriever over the same corpus, their
rankings fused by weighted reciprocal rank fusion (Cormack, Clarke & Buettcher, "Reciprocal Rank
Fusion outperforms Condorcet and individual Rank Learning Methods", SIGIR 2009):

    score(d) = sum_i  w_i / (k + rank_i(d))      rank_i 1-based; a list missing d adds nothing

with k = 60 as in the paper. Each retriever is asked for `depth` candidates (at least the topk).

A hybrid index directory holds meta.json naming the two sub-index directories (built inside it
by `build_hybrid`, or existing ones referenced by `link_hybrid`), the weights, k and depth."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.retriever.index import (
    DEFAULT_TOPK,
    Retriever,
    load_retriever,
    read_meta,
    register_backend,
    resolve_in,
    write_meta,
)
from pvpo.retriever.types import Passage

RRF_K = 60
DEPTH = 50
DENSE_DIR = "dense"
LEXICAL_DIR = "bm25"


def rrf_fuse(
    rankings: Sequence[Sequence[str]], weights: Sequence[float], *, k: float = RRF_K, topk: int | None = None
) -> list[tuple[str, float]]:
    """(id, fused score) best first from ranked id lists (best first), weighted RRF. Equal
    scores are ordered by id, so the result does not depend on dict order."""
    if len(rankings) != len(weights):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    scores: dict[str, float] = {}
    for ranking, w in zip(rankings, weights):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + w / (k + rank)
    fused = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    return fused if topk is None else fused[:topk]


def check_fusion(weights: Sequence[float], k: float, depth: int) -> tuple[tuple[float, float], float, int]:
    """Validated (weights, k, depth); one-line errors name the bad value."""
    if len(weights) != 2:
        raise ValueError(f"hybrid weights must be two numbers [dense, bm25], got {list(weights)!r}")
    w = (float(weights[0]), float(weights[1]))
    if min(w) < 0 or max(w) == 0:
        raise ValueError(f"hybrid weights must be >= 0 and not both 0, got {list(w)!r}")
    if not k >= 0:
        raise ValueError(f"hybrid rrf_k must be >= 0, got {k!r}")
    if int(depth) < 1:
        raise ValueError(f"hybrid depth must be >= 1, got {depth!r}")
    return w, float(k), int(depth)


class HybridRetriever(Retriever):
    """Dense + lexical retrievers fused by weighted RRF; returned scores are the fused scores."""

    backend = "hybrid"

    def __init__(
        self,
        dense: Retriever,
        lexical: Retriever,
        *,
        weights: Sequence[float] = (1.0, 1.0),
        k: float = RRF_K,
        depth: int = DEPTH,
    ) -> None:
        if len(dense) != len(lexical):
            raise ValueError(
                f"dense index has {len(dense)} passages but the lexical one has {len(lexical)}: "
                "both must index the same corpus"
            )
        self.dense, self.lexical = dense, lexical
        self.weights, self.k, self.depth = check_fusion(weights, k, depth)
        self.corpus = dense.corpus

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        if len(queries) != len(topks):
            raise ValueError("one topk per query")
        if not queries:
            return []
        depth = [max(self.depth, int(t)) for t in topks]
        runs: list[list[list[Passage]]] = [
            r.search_varying(queries, depth) if w > 0 else [[] for _ in queries]
            for r, w in ((self.dense, self.weights[0]), (self.lexical, self.weights[1]))
        ]
        out = []
        for i, want in enumerate(topks):
            by_id = {p.id: p for run in runs for p in run[i]}
            fused = rrf_fuse([[p.id for p in run[i]] for run in runs], self.weights, k=self.k, topk=int(want))
            out.append([Passage(doc, by_id[doc].contents, score) for doc, score in fused])
        return out

    def info(self) -> dict[str, Any]:
        dense = self.dense.info()
        return dense | {
            "backend": self.backend,
            "index_type": f"hybrid({dense['index_type']}+bm25)",
            "weights": list(self.weights),
            "rrf_k": self.k,
            "depth": self.depth,
        }

    def close(self) -> None:
        self.dense.close()
        self.lexical.close()


def write_hybrid_meta(
    out: Path, dense_dir: str, lexical_dir: str, *, weights: Sequence[float], k: float, depth: int
) -> None:
    """meta.json of a hybrid directory; sub-directories relative to it, or absolute."""
    dense_meta = read_meta(resolve_in(out, dense_dir))
    lexical_meta = read_meta(resolve_in(out, lexical_dir))
    if lexical_meta.get("backend") != "bm25":
        raise ValueError(f"{lexical_dir} is a {lexical_meta.get('backend')!r} index; the lexical side must be bm25")
    if dense_meta.get("size") != lexical_meta.get("size"):
        raise ValueError(
            f"{dense_dir} has {dense_meta.get('size')} passages but {lexical_dir} has "
            f"{lexical_meta.get('size')}: both must index the same corpus"
        )
    w, k, depth = check_fusion(weights, k, depth)
    corpus_path = resolve_in(Path(dense_dir), dense_meta["corpus"])  # relative to `out` when both are
    corpus = str(corpus_path if not corpus_path.is_absolute() else corpus_path.resolve())
    write_meta(
        out,
        {
            "format": 1,
            "backend": "hybrid",
            "dense": dense_dir,
            "lexical": lexical_dir,
            "weights": list(w),
            "rrf_k": k,
            "depth": depth,
            "corpus": corpus,
            "size": dense_meta.get("size"),
            "model": dense_meta.get("model"),
            "index_type": f"hybrid({dense_meta.get('index_type')}+bm25)",
        },
    )


def build_hybrid(
    corpus: str | Path,
    out_dir: str | Path,
    *,
    dense_index_type: str = "Flat",
    weights: Sequence[float] = (1.0, 1.0),
    k: float = RRF_K,
    depth: int = DEPTH,
    **build_kw: Any,
) -> Path:
    """A hybrid index directory: out/dense (FAISS `dense_index_type`) and out/bm25 built from
    the corpus (`build_kw` go to build_index), and the fusion settings."""
    from pvpo.retriever.build import build_index, started_empty, undo_failed_build

    check_fusion(weights, k, depth)  # fail before encoding anything
    out = Path(out_dir)
    created, existed = started_empty(out), out.exists()
    try:
        build_index(corpus, out / DENSE_DIR, index_type=dense_index_type, **build_kw)
        build_index(corpus, out / LEXICAL_DIR, index_type="bm25", show_progress=build_kw.get("show_progress", True))
        write_hybrid_meta(out, DENSE_DIR, LEXICAL_DIR, weights=weights, k=k, depth=depth)
    except BaseException:
        if created:  # a folder it started (absent, or only the manifest `retriever.outdir` wrote): left as found
            undo_failed_build(out, existed=existed)
        raise
    return out


def link_hybrid(
    dense_dir: str | Path,
    lexical_dir: str | Path,
    out_dir: str | Path,
    *,
    weights: Sequence[float] = (1.0, 1.0),
    k: float = RRF_K,
    depth: int = DEPTH,
) -> Path:
    """A hybrid directory referencing two existing index directories of the same corpus."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_hybrid_meta(
        out, str(Path(dense_dir).resolve()), str(Path(lexical_dir).resolve()), weights=weights, k=k, depth=depth
    )
    return out


@register_backend("hybrid")
def _load_hybrid(index_dir: Path, meta: dict[str, Any], device: str | None) -> HybridRetriever:
    dense = load_retriever(resolve_in(index_dir, meta["dense"]), device=device)
    try:
        lexical = load_retriever(resolve_in(index_dir, meta["lexical"]), device=device)
    except BaseException:
        dense.close()
        raise
    retriever = HybridRetriever(
        dense,
        lexical,
        weights=meta.get("weights", (1.0, 1.0)),
        k=meta.get("rrf_k", RRF_K),
        depth=meta.get("depth", DEPTH),
    )
    retriever.default_topk = int(meta.get("default_topk", DEFAULT_TOPK))
    return retriever
