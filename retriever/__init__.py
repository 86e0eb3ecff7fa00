"""pvpo.retriever: dense (sentence-transformers + FAISS) or BM25 passage retrieval, served over
HTTP in Search-R1's `/retrieve` JSON, with blocking and async clients.

Exports load on first use: `from pvpo.retriever import RetrieverClient` imports httpx, not faiss.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    # clients of a running server
    "RetrieverClient": "client",
    "AsyncRetrieverClient": "client",
    "RetrieverError": "client",
    "parse_result": "client",
    # what a search returns, and what anything that searches provides
    "Passage": "types",
    "Searcher": "types",
    # in-process retrieval over a built index
    "Retriever": "index",
    "load_retriever": "index",
    "read_meta": "index",
    "register_backend": "index",
    # building an index, or linking a prebuilt FAISS one
    "build_index": "build",
    "link_prebuilt": "build",
    "prepare_corpus": "build",
    # serving
    "create_app": "server",
    "BackgroundServer": "server",
    # corpus files and the encoder
    "CorpusStore": "corpus",
    "iter_corpus": "corpus",
    "make_contents": "corpus",
    "Encoder": "encoder",
    "Prefixes": "encoder",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
