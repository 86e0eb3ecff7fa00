"""The retriever client takes a server's base URL or its `/retrieve` endpoint (Search-R1's and verl's
config form), sends a query holding a lone surrogate (which UTF-8 cannot encode) as U+FFFD, and turns
a reply of the wrong shape into one line naming the server and what was wrong."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from http_support import json_server
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.retriever.client import AsyncRetrieverClient, RetrieverClient, RetrieverError


@contextmanager
def _retriever(reply: Any = None) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in retriever on loopback serving `/retrieve` only (404 elsewhere): `reply`, or one
    passage per query; yields its base URL and the bodies it received."""
    received: list[dict[str, Any]] = []

    def answer(path: str, body: Any) -> tuple[int, Any]:
        if path != "/retrieve":
            return 404, None
        received.append(body)
        passages = [[{"document": {"id": "7", "contents": '"T"\nabout ' + q}, "score": 0.5}] for q in body["queries"]]
        return 200, reply or {"result": passages}

    with json_server(answer) as url:
        yield url, received


def test_a_full_retrieve_url_reaches_the_server_as_its_base_does() -> None:
    with _retriever() as (base, received):
        for url in (base, base + "/", base + "/retrieve", base + "/retrieve/"):
            with RetrieverClient(url, retries=0) as client:
                [[passage]] = client.search(["chess"])
            assert passage.id == "7" and passage.text == "about chess"
        assert len(received) == 4
        res = CliRunner().invoke(app, ["retriever", "query", "--url", base + "/retrieve", "--retries", "0", "go"])
        assert res.exit_code == 0 and "[7] T: about go" in res.output, res.output


def test_the_async_client_takes_a_retrieve_url_too() -> None:
    async def ask(url: str) -> list[list[Any]]:
        async with AsyncRetrieverClient(url, retries=0) as client:
            return await client.search(["chess"])

    with _retriever() as (base, _):
        [[passage]] = asyncio.run(ask(base + "/retrieve"))
    assert passage.text == "about chess"


def test_a_lone_surrogate_in_a_query_is_sent_as_the_replacement_character() -> None:
    with _retriever() as (base, received), RetrieverClient(base, retries=0) as client:
        [[passage], [other]] = client.search(["who \ud800 is", "plain"])
    assert received[0]["queries"] == ["who \ufffd is", "plain"]
    assert passage.text == "about who \ufffd is" and other.text == "about plain"


@pytest.mark.parametrize(
    ("reply", "what"),
    [
        ({"result": [["x"]]}, "result[0][0] is str 'x'"),
        ({"result": ["x"]}, "result[0] is str"),
        ({"result": [[{"document": {"id": "1", "contents": "c"}, "score": "high"}]]}, "score of result[0][0]"),
        ([1, 2], "expected {'result': [...]}"),
    ],
)
def test_a_reply_of_the_wrong_shape_names_the_server_and_what_was_wrong(reply: Any, what: str) -> None:
    with _retriever(reply) as (base, _):
        with RetrieverClient(base, retries=0) as client, pytest.raises(RetrieverError) as info:
            client.search(["q"])
        assert base in str(info.value) and what in str(info.value)
        res = CliRunner().invoke(app, ["retriever", "query", "--url", base, "--retries", "0", "q"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) <= 3 and lines[0].startswith(f"error: {base}/retrieve: malformed reply")
    assert "fix: check that the URL names a Search-R1-compatible /retrieve server" in res.output
