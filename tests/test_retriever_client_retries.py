"""The retriever client: retries ride out a server restart, each logged and
bounded; an authenticated server is reached with the configured token; a 401 is not retried."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest

from pvpo.retriever.client import RetrieverClient, RetrieverError
from pvpo.retriever.server import BackgroundServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_search_during_a_restart_waits_for_the_server_and_logs_each_retry(tiny, caplog) -> None:
    port = _free_port()
    BackgroundServer(tiny, port=port).start().stop()  # the server went down
    restarted: list[BackgroundServer] = []
    timer = threading.Timer(3.0, lambda: restarted.append(BackgroundServer(tiny, port=port).start()))
    timer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="pvpo.retriever.client"):
            with RetrieverClient(f"http://127.0.0.1:{port}") as client:  # default retry budget
                t0 = time.monotonic()
                assert client.search(["who wrote Hamlet"], topk=1)[0][0].title == "Shakespeare"
        assert time.monotonic() - t0 >= 2.5
        retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        assert retries and all("ConnectError" in m for m in retries)
    finally:
        timer.join()
        for s in restarted:
            s.stop()


def test_retries_are_bounded_and_the_last_error_is_raised(caplog) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with caplog.at_level(logging.WARNING, logger="pvpo.retriever.client"):
        with (
            RetrieverClient(url, retries=2, backoff=0.01, timeout=2) as client,
            pytest.raises(RetrieverError, match="unreachable"),
        ):
            client.search(["x"])
    assert sum("retrying in" in r.getMessage() for r in caplog.records) == 2


def test_the_default_budget_outlasts_a_ten_second_restart() -> None:
    client = RetrieverClient("http://127.0.0.1:9")
    total = sum(client._delay(a) for a in range(client.retries))
    client.close()
    assert 15 <= total <= 30, total


def test_a_numeric_retry_after_is_honoured_up_to_the_cap() -> None:
    with RetrieverClient("http://127.0.0.1:9", backoff=0.1, max_backoff=3) as client:
        assert client._delay(0, httpx.Response(503, headers={"Retry-After": "2"})) == 2
        assert client._delay(0, httpx.Response(503, headers={"Retry-After": "60"})) == 3
        assert client._delay(0, httpx.Response(503, headers={"Retry-After": "soon"})) == pytest.approx(0.1)


def test_the_token_reaches_an_authenticated_server_and_a_401_is_not_retried(tiny) -> None:
    with BackgroundServer(tiny, token="s3cret") as server:
        sent = []
        with RetrieverClient(server.url, retries=3, backoff=0.01) as client:
            client._http.event_hooks["request"].append(sent.append)
            with pytest.raises(RetrieverError) as info:
                client.search(["chess"])
        assert info.value.status_code == 401 and len(sent) == 1
        with RetrieverClient(server.url, token="s3cret") as client:
            assert client.search(["chess"], topk=1)[0][0].title == "Chess"


def test_the_trainer_reaches_an_authenticated_url_with_the_env_token(tiny, tmp_path, monkeypatch) -> None:
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import retriever_session

    with BackgroundServer(tiny, token="s3cret") as server:
        cfg = load_config(None, [f"retriever.url={server.url}", "retriever.retries=0"])
        with retriever_session(cfg, tmp_path, None) as client, pytest.raises(RetrieverError, match="401"):
            client.search(["chess"])
        monkeypatch.setenv("PVPO_RETRIEVER_TOKEN", "s3cret")
        with retriever_session(cfg, tmp_path, None) as client:
            assert client.search(["chess"])[0][0].title == "Chess"
        cfg = load_config(None, [f"retriever.url={server.url}", "retriever.token=s3cret", "retriever.timeout=5"])
        monkeypatch.delenv("PVPO_RETRIEVER_TOKEN")
        with retriever_session(cfg, tmp_path, None) as client:
            assert client.timeout == 5 and client.search(["chess"])[0][0].title == "Chess"
