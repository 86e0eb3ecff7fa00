"""HTTP clients of the retrieval service (ours or any Search-R1-compatible one): one POST per
search() call, round-robin over server URLs, retries with exponential backoff on 429/5xx,
timeouts and connection errors.

A server URL is its base (`http://host:8000`) or its `/retrieve` endpoint as Search-R1's and verl's
configs name it (`http://host:8000/retrieve`): both reach the same server. A URL the HTTP client
cannot parse is refused when the client is made, in one line with its credentials masked. A lone
surrogate in a query (`\\ud800`, which a model's text can hold and UTF-8 cannot encode) is sent as
U+FFFD, the replacement character, so the query is searched rather than the batch lost.

The default retry budget rides out a server restart: 8 retries, backoff 0.2 s doubling up to
4 s, about 18 s of waiting in all (an index reload took ~10 s; the previous 3 retries gave up
after 1.4 s). Each retry is logged at WARNING with its cause and the wait before the next try."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from pvpo.retriever.types import Passage, make_contents
from pvpo.secrets import check_url, mask_logs, mask_url

mask_logs("httpx")  # httpx logs each request's URL at INFO, credentials and all

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# A server refuses a request of more queries than this (`schema.Limits.max_queries`, its default):
# longer lists go as several requests, in order (a dataset GT check sends every hop at once, 1,395
# queries for the multi-hop recipe's warm start).
MAX_QUERIES_PER_REQUEST = 1024


def _chunks(queries: Sequence[str]) -> list[Sequence[str]]:
    return [queries[i : i + MAX_QUERIES_PER_REQUEST] for i in range(0, len(queries), MAX_QUERIES_PER_REQUEST)]


log = logging.getLogger(__name__)


class RetrieverError(RuntimeError):
    """The service refused the request (4xx) or stayed unreachable after all retries."""

    def __init__(self, message: str, status_code: int | None = None, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.fix = fix  # what to do, where the status code does not say (a reply of the wrong shape)


# The fix of a reply that is not a /retrieve reply (RetrieverError.fix)
_NOT_A_RETRIEVER = "check that the URL names a Search-R1-compatible /retrieve server (pvpo retriever serve)"


def _passage(item: Any, where: str) -> Passage:
    """One passage of a reply: a `{"document", "score"}` item or a bare document."""
    doc = item.get("document", item) if isinstance(item, dict) else item
    if not isinstance(doc, dict):
        raise RetrieverError(
            f"malformed reply: {where} is {type(doc).__name__} {str(doc)[:80]!r}, expected a passage "
            '{"document": {...}, "score": ...} or a document {"id", "contents"}',
            fix=_NOT_A_RETRIEVER,
        )
    score = item.get("score") if "document" in item else None
    contents = doc.get("contents")
    if contents is None:  # FlashRAG-style {"title", "text"} documents
        contents = make_contents(str(doc.get("title", "")), str(doc.get("text", "")))
    try:
        value = None if score is None else float(score)
    except (TypeError, ValueError):
        raise RetrieverError(f"malformed reply: the score of {where} is {score!r}", fix=_NOT_A_RETRIEVER) from None
    return Passage(str(doc.get("id", "")), str(contents), value)


def parse_result(payload: Any, n_queries: int) -> list[list[Passage]]:
    """Passages from a `/retrieve` reply, in either Search-R1 shape (`{"document", "score"}`
    items, or bare documents as Search-R1's server sends when return_scores is false). A reply of
    another shape is a RetrieverError saying what in it was wrong."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        raise RetrieverError(
            f"malformed reply: expected {{'result': [...]}}, got {str(payload)[:200]}", fix=_NOT_A_RETRIEVER
        )
    result = payload["result"]
    if len(result) != n_queries:
        raise RetrieverError(f"reply has {len(result)} result lists for {n_queries} queries", fix=_NOT_A_RETRIEVER)
    out = []
    for q, items in enumerate(result):
        if not isinstance(items, list):
            raise RetrieverError(
                f"malformed reply: result[{q}] is {type(items).__name__}, expected a list of passages",
                fix=_NOT_A_RETRIEVER,
            )
        out.append([_passage(item, f"result[{q}][{i}]") for i, item in enumerate(items)])
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")  # never valid in UTF-8, paired or not


def base_url(url: str) -> str:
    """The server's base URL: `url` without a trailing `/` or `/retrieve` (the endpoint, as Search-R1's
    and verl's configs name it), so `/retrieve`, `/info` and `/health` are all found under it."""
    url = url.rstrip("/")
    return url.removesuffix("/retrieve").rstrip("/")


def clean_text(text: str) -> str:
    """`text` as UTF-8 can carry it: each lone surrogate (a model served over JSON can write
    `\\ud800`) replaced by U+FFFD, the replacement character; any other text unchanged."""
    return _SURROGATE.sub("\ufffd", text)


class _Base:
    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        topk: int = 3,
        timeout: float = 30.0,
        retries: int = 8,
        token: str | None = None,
        backoff: float = 0.2,
        max_backoff: float = 4.0,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("at least one retriever URL is needed")
        self.urls = [base_url(check_url(u, "retriever URL")) for u in urls]
        self.topk = topk
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._next = itertools.cycle(range(len(self.urls)))
        self._lock = threading.Lock()

    def _pick(self) -> str:
        with self._lock:
            return self.urls[next(self._next)]

    def _delay(self, attempt: int, resp: httpx.Response | None = None) -> float:
        """The wait after failed attempt `attempt` (0-based): exponential, capped; a server's
        numeric Retry-After (e.g. on 503 while it sheds load) is honoured up to the cap."""
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        retry_after = resp.headers.get("retry-after", "") if resp is not None else ""
        if retry_after.replace(".", "", 1).isdigit():
            delay = max(delay, min(self.max_backoff, float(retry_after)))
        return delay

    def _note_retry(self, attempt: int, url: str, resp: httpx.Response | None, err: Exception | None) -> float:
        """Log a failed attempt that will be retried; return the wait before the next one."""
        delay = self._delay(attempt, resp)
        cause = f"status {resp.status_code}" if resp is not None else f"{type(err).__name__}: {err}"
        log.warning(
            "retriever attempt %d/%d to %s failed (%s); retrying in %.1f s",
            attempt + 1,
            self.retries + 1,
            mask_url(url),
            mask_url(cause),
            delay,
        )
        return delay

    def _payload(self, queries: Sequence[str], topk: int | None) -> dict[str, Any]:
        return {
            "queries": [clean_text(q) for q in queries],
            "topk": self.topk if topk is None else topk,
            "return_scores": True,
        }

    @staticmethod
    def _json(resp: httpx.Response, url: str) -> Any:
        """The reply's JSON; a reply that is not JSON is a RetrieverError naming the server."""
        try:
            return resp.json()
        except ValueError:
            raise RetrieverError(
                mask_url(f"{url} answered {resp.status_code} with no JSON: {resp.text[:200]!r}"), fix=_NOT_A_RETRIEVER
            ) from None

    @staticmethod
    def _parse(resp: httpx.Response, url: str, n_queries: int) -> list[list[Passage]]:
        """The passages of a /retrieve reply from `url`; a reply of the wrong shape is a RetrieverError
        naming the server and what was wrong."""
        try:
            return parse_result(_Base._json(resp, url), n_queries)
        except RetrieverError as e:
            raise RetrieverError(mask_url(f"{url}/retrieve: {e}"), fix=e.fix) from None

    @staticmethod
    def _final(resp: httpx.Response | None, err: Exception | None, url: str) -> RetrieverError:
        if resp is not None:
            return RetrieverError(mask_url(f"{url} answered {resp.status_code}: {resp.text[:500]}"), resp.status_code)
        return RetrieverError(mask_url(f"retriever unreachable (last tried {url}): {type(err).__name__}: {err}"))

    @staticmethod
    def _refused(resp: httpx.Response, url: str) -> RetrieverError:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        return RetrieverError(mask_url(f"{url} refused the request ({resp.status_code}): {detail}"), resp.status_code)


class RetrieverClient(_Base):
    """Blocking client. `search` sends one request for the whole batch of queries; a failed
    attempt is retried on the next URL after a backoff."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        topk: int = 3,
        timeout: float = 30.0,
        retries: int = 8,
        token: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(urls, topk=topk, timeout=timeout, retries=retries, token=token, **kw)
        self._http = httpx.Client(timeout=timeout, headers=self.headers)

    def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        resp: httpx.Response | None = None
        err: Exception | None = None
        url = self.urls[0]
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._note_retry(attempt - 1, url, resp, err))
            url = self._pick()
            resp, err = None, None
            try:
                resp = self._http.request(method, url + path, json=json)
            except httpx.TransportError as e:  # connection refused/reset, timeouts
                err = e
                continue
            if resp.status_code in RETRYABLE_STATUS:
                continue
            if resp.status_code >= 400:
                raise self._refused(resp, url)
            return resp
        raise self._final(resp, err, url)

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top passages of each query, best first, with scores."""
        out: list[list[Passage]] = []
        for part in _chunks(queries):
            resp = self._request("POST", "/retrieve", self._payload(part, topk))
            out += self._parse(resp, str(resp.request.url).removesuffix("/retrieve"), len(part))
        return out

    def info(self) -> dict[str, Any]:
        """The server's /info (model, index type, size, dim, device)."""
        return self._request("GET", "/info").json()

    def health(self) -> bool:
        """Whether a server answers /health."""
        try:
            return self._request("GET", "/health").status_code == 200
        except RetrieverError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetrieverClient(_Base):
    """asyncio client with the same behaviour as RetrieverClient."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        topk: int = 3,
        timeout: float = 30.0,
        retries: int = 8,
        token: str | None = None,
        max_connections: int = 256,
        **kw: Any,
    ) -> None:
        super().__init__(urls, topk=topk, timeout=timeout, retries=retries, token=token, **kw)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(timeout=timeout, headers=self.headers, limits=limits)

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        resp: httpx.Response | None = None
        err: Exception | None = None
        url = self.urls[0]
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self._note_retry(attempt - 1, url, resp, err))
            url = self._pick()
            resp, err = None, None
            try:
                resp = await self._http.request(method, url + path, json=json)
            except httpx.TransportError as e:
                err = e
                continue
            if resp.status_code in RETRYABLE_STATUS:
                continue
            if resp.status_code >= 400:
                raise self._refused(resp, url)
            return resp
        raise self._final(resp, err, url)

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        """Top passages of each query, best first, with scores."""
        out: list[list[Passage]] = []
        for part in _chunks(queries):
            resp = await self._request("POST", "/retrieve", self._payload(part, topk))
            out += self._parse(resp, str(resp.request.url).removesuffix("/retrieve"), len(part))
        return out

    async def info(self) -> dict[str, Any]:
        """The server's /info."""
        return (await self._request("GET", "/info")).json()

    async def health(self) -> bool:
        """Whether a server answers /health."""
        try:
            return (await self._request("GET", "/health")).status_code == 200
        except RetrieverError:
            return False

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
