"""Sync and async clients against real loopback servers: one HTTP call per search, round-robin,
retries on 5xx and dead URLs, no retry on 4xx, both reply shapes; and the CLI."""

from __future__ import annotations

import asyncio
import os
import socket

import httpx
import pytest
from retriever_support import FailingRetriever
from typer.testing import CliRunner

from pvpo.retriever.client import AsyncRetrieverClient, RetrieverClient, RetrieverError, parse_result
from pvpo.retriever.server import BackgroundServer
from pvpo.retriever.testing import TINY_QUERIES, write_tiny_corpus

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def two_servers(tiny):
    with BackgroundServer(tiny) as a, BackgroundServer(tiny) as b:
        yield a, b


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this socket closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _served(server: BackgroundServer) -> int:
    return httpx.get(server.url + "/info").json()["batching"]["queries"]


def test_one_http_call_per_search_whatever_the_batch_size(two_servers) -> None:
    server = two_servers[0]
    calls = []
    with RetrieverClient(server.url, topk=2) as client:
        client._http.event_hooks["request"].append(calls.append)
        queries = [q for q, _ in TINY_QUERIES] * 4
        results = client.search(queries)
    assert len(calls) == 1
    assert len(results) == len(queries) and all(len(r) == 2 for r in results)
    assert [r[0].title for r in results[: len(TINY_QUERIES)]] == [t for _, t in TINY_QUERIES]
    assert all(p.score is not None for r in results for p in r)


def test_more_queries_than_a_server_takes_go_as_several_requests_in_order(two_servers) -> None:
    from pvpo.retriever import client as client_mod
    from pvpo.retriever.schema import Limits

    assert client_mod.MAX_QUERIES_PER_REQUEST == Limits().max_queries  # the server's default limit
    server = two_servers[0]
    queries = [q for q, _ in TINY_QUERIES] * (Limits().max_queries // len(TINY_QUERIES) + 2)
    calls = []
    with RetrieverClient(server.url, topk=1) as sync:
        sync._http.event_hooks["request"].append(calls.append)
        got = sync.search(queries)  # refused with 422 in one request
    assert len(calls) == 2 and len(got) == len(queries)
    assert [r[0].title for r in got] == [t for _, t in TINY_QUERIES] * (len(queries) // len(TINY_QUERIES))

    async def go() -> int:
        async with AsyncRetrieverClient(server.url, topk=1) as aclient:
            return len(await aclient.search(queries))

    assert asyncio.run(go()) == len(queries)


def test_round_robin_spreads_calls_over_urls(two_servers) -> None:
    a, b = two_servers
    before = (_served(a), _served(b))
    with RetrieverClient([a.url, b.url]) as client:
        for _ in range(4):
            client.search(["chess"])
    assert (_served(a) - before[0], _served(b) - before[1]) == (2, 2)


def test_dead_url_is_skipped_by_retrying_on_the_next(two_servers) -> None:
    with RetrieverClient([_dead_url(), two_servers[0].url], retries=2, backoff=0.01) as client:
        for _ in range(3):
            assert client.search(["capital of Japan"], topk=1)[0][0].title == "Tokyo"


def test_all_urls_dead_raises_after_the_retries() -> None:
    with RetrieverClient(_dead_url(), retries=2, backoff=0.01, timeout=2) as client:
        with pytest.raises(RetrieverError, match="unreachable"):
            client.search(["x"])


def test_5xx_is_retried_until_the_server_recovers(tiny) -> None:
    flaky = FailingRetriever(tiny, failures=2)
    with BackgroundServer(flaky) as s, RetrieverClient(s.url, retries=3, backoff=0.01) as client:
        assert client.search(["who wrote Hamlet"], topk=1)[0][0].title == "Shakespeare"
    assert flaky.calls == 3


def test_4xx_is_not_retried_and_carries_the_servers_message(two_servers) -> None:
    with RetrieverClient(two_servers[0].url, retries=3) as client:
        with pytest.raises(RetrieverError, match="topk must be between 1 and 100") as info:
            client.search(["x"], topk=1000)
    assert info.value.status_code == 422


def test_async_client_matches_the_sync_client(two_servers) -> None:
    a, b = two_servers
    queries = [q for q, _ in TINY_QUERIES]

    async def run():
        async with AsyncRetrieverClient([a.url, b.url], topk=3) as client:
            return await asyncio.gather(*[client.search([q]) for q in queries])

    got = asyncio.run(run())
    with RetrieverClient(a.url, topk=3) as client:
        want = client.search(queries)
    assert [[p.id for p in r[0]] for r in got] == [[p.id for p in r] for r in want]


def test_parses_search_r1_bare_documents_and_title_text_documents() -> None:
    bare = {"result": [[{"id": "7", "contents": '"T"\nbody'}], [{"title": "U", "text": "more"}]]}
    [[p], [q]] = parse_result(bare, 2)
    assert (p.id, p.title, p.text, p.score) == ("7", "T", "body", None)
    assert (q.title, q.text) == ("U", "more")
    with pytest.raises(RetrieverError, match="2 result lists for 3 queries"):
        parse_result(bare, 3)


def test_cli_builds_an_index_that_the_server_serves(tmp_path) -> None:
    from pvpo.cli import app

    corpus = write_tiny_corpus(tmp_path / "c.json")
    runner = CliRunner()
    result = runner.invoke(
        app, ["retriever", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--index-type", "bm25"]
    )
    assert result.exit_code == 0, result.output
    assert "built bm25 index of 24 passages" in result.output
    with BackgroundServer(tmp_path / "idx") as s, RetrieverClient(s.url) as client:
        assert client.search(["Alexander Fleming"], topk=1)[0][0].title == "Penicillin"
    assert runner.invoke(app, ["retriever", "--help"]).exit_code == 0
