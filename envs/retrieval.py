"""What the environment needs from retrieval: a Searcher from a URL or an object, and the text
the agent reads back (Search-R1's `Doc i(Title: t) text` lines, trimmed to a budget)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pvpo.retriever.types import Passage, Searcher, split_contents


def resolve_retriever(
    retriever: Searcher | None = None,
    retriever_url: str | Sequence[str] | None = None,
    *,
    topk: int = 3,
    timeout: float = 30.0,
    token: str | None = None,
) -> tuple[Searcher, bool]:
    """The Searcher to use and whether the env created it (and so must close it): `retriever` if
    given (any object with `search(queries, topk)`), else an HTTP client for `retriever_url`
    (one URL or several, round-robin)."""
    if retriever is not None:
        if retriever_url is not None:
            raise ValueError("give either `retriever` or `retriever_url`, not both")
        if not callable(getattr(retriever, "search", None)):
            raise TypeError(f"retriever {type(retriever).__name__} has no search(queries, topk) method")
        return retriever, False
    if retriever_url is None:
        raise ValueError(
            "a retriever is required: pass `retriever_url` (a running server) or `retriever` (an object with .search)"
        )
    from pvpo.retriever.client import RetrieverClient  # only the URL path needs the HTTP client

    urls = [retriever_url] if isinstance(retriever_url, str) else list(retriever_url)
    return RetrieverClient(urls, topk=topk, timeout=timeout, token=token), True


def close_retriever(retriever: Any) -> None:
    close = getattr(retriever, "close", None)
    if callable(close):
        close()


def format_passages(passages: Sequence[Passage], max_chars: int | None = None) -> str:
    """Search-R1's rendering, one line per passage: `Doc 1(Title: t) text`. With `max_chars`,
    the text is cut at the last whitespace before the budget and ends with '...'."""
    lines = []
    for i, p in enumerate(passages, 1):
        contents = p.contents if isinstance(p, Passage) else str(p.get("contents", ""))
        title, text = split_contents(contents)
        lines.append(f"Doc {i}(Title: {title}) {text.strip()}")
    return trim(("\n".join(lines)).strip(), max_chars)


def trim(text: str, max_chars: int | None) -> str:
    """`text` cut to at most `max_chars` characters at a word boundary, marked with '...'."""
    if max_chars is None or len(text) <= max_chars:
        return text
    if max_chars <= 3:
        return text[:max_chars]
    cut = text[: max_chars - 3]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + "..."
