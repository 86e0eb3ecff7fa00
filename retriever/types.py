"""What a retriever returns and the one method every retriever offers (the client, an in-process
index, or any object a user plugs into the environment)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# The longest query a server of ours answers (`schema.Limits.max_query_chars`, its default):
# more than MiniLM (256 tokens) or e5 / bge (512) read of a query. A policy's query is the
# model's output, so the environment cuts a longer one to this rather than have it refused.
MAX_QUERY_CHARS = 2048


def make_contents(title: str, text: str) -> str:
    """A passage's `contents`, as Search-R1's corpora hold it: the title, quoted, on the first
    line, then the text. The one way a title and a text become `contents`."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a passage's `contents`: the first line without its quotes (a corpus may
    hold it unquoted), and the rest. The one way `contents` is read."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. `contents` follows Search-R1 (`make_contents`): the title on the
    first line, the text after it."""

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        return split_contents(self.contents)[1]


@runtime_checkable
class Searcher(Protocol):
    """Anything that answers a batch of queries with the top passages of each, in order."""

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]: ...


class TimedSearcher:
    """A Searcher that adds up the seconds spent inside `search` (`seconds`) and its calls (`calls`)."""

    def __init__(self, inner: Searcher) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        t0 = time.perf_counter()
        try:
            return self.inner.search(queries, topk)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
