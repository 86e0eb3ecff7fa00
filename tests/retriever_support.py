"""Test-only retriever doubles (kept out of the package: production code holds no crash hooks)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from pvpo.retriever.index import Retriever
from pvpo.retriever.types import Passage


class FailingRetriever(Retriever):
    """Wraps a retriever and raises on the first `failures` searches."""

    def __init__(self, inner: Retriever, failures: int) -> None:
        self.inner, self.failures, self.calls = inner, failures, 0
        self.corpus = inner.corpus
        self.lock = threading.Lock()

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        with self.lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise RuntimeError("index shard unavailable")
        return self.inner.search_varying(queries, topks)

    def info(self) -> dict[str, Any]:
        return self.inner.info()

    def close(self) -> None:
        pass


class CountingRetriever(Retriever):
    """Wraps a retriever and records every query that reaches it (through a server, say)."""

    def __init__(self, inner: Retriever) -> None:
        self.inner, self.corpus, self.queries = inner, inner.corpus, []
        self.lock = threading.Lock()

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        with self.lock:
            self.queries.extend(queries)
        return self.inner.search_varying(queries, topks)

    def info(self) -> dict[str, Any]:
        return self.inner.info()

    def close(self) -> None:
        pass
