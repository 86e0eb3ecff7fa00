"""The retriever server under hostile or unlucky clients: the token is
checked before any body is read, the body limit holds for chunked bodies, idle and slow
connections are closed, a small request is not stuck behind a large one, work for a client that
went away is dropped, aliases are accepted and unknown fields refused, and the OpenAPI contract
holds under schemathesis."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import httpx
import pytest
from typer.testing import CliRunner

from pvpo.retriever.index import Retriever
from pvpo.retriever.schema import Limits
from pvpo.retriever.server import BackgroundServer, create_app
from pvpo.retriever.types import Passage

SMALL = Limits(max_queries=16, max_query_chars=200, max_topk=10)


class SlowRetriever(Retriever):
    """Delegates to a real retriever after sleeping `per_query_s` per query; counts queries."""

    def __init__(self, inner: Retriever, per_query_s: float) -> None:
        self.inner, self.per_query_s, self.searched = inner, per_query_s, 0
        self.corpus, self.default_topk = inner.corpus, inner.default_topk

    def search_varying(self, queries: Sequence[str], topks: Sequence[int]) -> list[list[Passage]]:
        time.sleep(self.per_query_s * len(queries))
        self.searched += len(queries)
        return self.inner.search_varying(queries, topks)

    def info(self) -> dict:
        return self.inner.info()

    def close(self) -> None:
        pass


def _connect(server: BackgroundServer) -> socket.socket:
    s = socket.create_connection((server.host, server.port), timeout=5)
    return s


def _closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def _chunked_head(server: BackgroundServer, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /retrieve HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n{auth}"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def _stream_until_answered(s: socket.socket, chunk: bytes, budget: int) -> tuple[int, bytes]:
    """Send `chunk` as HTTP chunks until the server answers (or `budget` bytes went out)."""
    sent = 0
    s.settimeout(0.05)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    while sent < budget:
        try:
            s.sendall(framed)
            sent += len(chunk)
        except OSError:
            break
        try:
            reply = s.recv(65536)
            if reply:
                return sent, reply
        except TimeoutError:
            continue
        except OSError:
            break
    s.settimeout(5)
    try:
        return sent, s.recv(65536)
    except OSError:
        return sent, b""


@pytest.fixture(scope="module")
def guarded(tiny):
    with BackgroundServer(tiny, token="s3cret", limits=SMALL) as s:
        yield s


def test_without_the_token_a_chunked_body_gets_401_and_is_not_read(guarded: BackgroundServer) -> None:
    with _connect(guarded) as s:
        s.sendall(_chunked_head(guarded, token=None))
        sent, reply = _stream_until_answered(s, b"x" * 8192, budget=50_000_000)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert sent < 1_000_000  # answered at the headers: the 50 MB body was never read


def test_without_the_token_bad_json_is_401_not_a_422_describing_fields(guarded: BackgroundServer) -> None:
    r = httpx.post(guarded.url + "/retrieve", content=b'{"queries": [', headers={"content-type": "application/json"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(guarded.url + "/retrieve", json={"queries": ["x"]}, headers={"Authorization": "Bearer  x"})
    assert r.status_code == 401


def test_a_chunked_body_past_the_limit_is_refused_while_it_streams(guarded: BackgroundServer) -> None:
    limit = SMALL.max_body_bytes
    with _connect(guarded) as s:
        s.sendall(_chunked_head(guarded, token="s3cret"))
        sent, reply = _stream_until_answered(s, b" " * 8192, budget=50_000_000)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert limit < sent < limit + 1_000_000
    assert httpx.get(guarded.url + "/health").status_code == 200


def test_a_declared_length_past_the_limit_is_refused_before_the_body(guarded: BackgroundServer) -> None:
    with _connect(guarded) as s:
        s.sendall(
            f"POST /retrieve HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\n"
            f"Content-Length: {10**9}\r\n\r\n".encode()
        )
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 413")


def test_a_body_that_trickles_in_past_the_body_timeout_gets_408(tiny) -> None:
    with BackgroundServer(tiny, body_timeout=0.5) as server, _connect(server) as s:
        s.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            b'{"queries": '
        )
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 408")


def test_text_plain_is_415_and_a_body_that_is_not_utf8_is_422(guarded: BackgroundServer) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    r = httpx.post(
        guarded.url + "/retrieve", content=b'{"queries": ["chess"]}', headers={**auth, "content-type": "text/plain"}
    )
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    r = httpx.post(
        guarded.url + "/retrieve",
        content=b'{"queries": ["\xff"]}',
        headers={**auth, "content-type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["detail"] == "body is not valid JSON: not UTF-8 at byte 14"
    r = httpx.post(
        guarded.url + "/retrieve",
        content=b'{"queries": ["chess"]}',
        headers={**auth, "content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("body", "topk", "n"),
    [
        ({"query": "chess", "top_k": 1}, 1, 1),
        ({"query": "chess", "k": 2}, 2, 1),
        ({"queries": ["chess", "cat"], "k": 3}, 3, 2),
        ({"queries": ["chess"], "topk": None}, 3, 1),
        ({"query": "chess", "top_k": 2.0}, 2, 1),
    ],
)
def test_rllm_style_query_and_topk_aliases_are_honoured(
    guarded: BackgroundServer, body: dict, topk: int, n: int
) -> None:
    r = httpx.post(guarded.url + "/retrieve", json=body, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200, r.text
    assert [len(x) for x in r.json()["result"]] == [topk] * n
    assert r.json()["result"][0][0]["document"]["contents"].startswith('"Chess"')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"queries": ["chess"], "top_n": 3},
            "top_n: unknown field (known: queries, query, topk, top_k, k, return_scores)",
        ),
        (
            {"queries": ["chess"], "topk": 2, "k": 3},
            "give at most one of topk, top_k, k (they are aliases); got ['k', 'topk']",
        ),
        (
            {"queries": ["chess"], "query": "cat"},
            "give exactly one of `queries` (a list of strings) or `query` (one string)",
        ),
        ({"query": None}, "query must not be null"),
        ({"query": "chess", "k": 0}, "k must be between 1 and 10, got 0"),
        ({"query": ["chess"]}, "query: Input should be a valid string"),
    ],
)
def test_unknown_and_conflicting_fields_are_422_never_ignored(
    guarded: BackgroundServer, body: dict, message: str
) -> None:
    r = httpx.post(guarded.url + "/retrieve", json=body, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 422 and r.json()["detail"] == message


def test_an_empty_token_is_refused_by_the_app_and_the_cli(tiny, tmp_path) -> None:
    from pvpo.cli import app

    with pytest.raises(ValueError, match="token is empty"):
        create_app(tiny, token="")
    res = CliRunner().invoke(
        app, ["retriever", "serve", "--index", str(tmp_path), "--token", ""], env={"COLUMNS": "300"}
    )
    assert res.exit_code == 2 and "token is empty" in res.output


def test_the_openapi_schema_publishes_limits_errors_and_the_bearer_scheme(guarded: BackgroundServer) -> None:
    spec = httpx.get(guarded.url + "/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()
    req = spec["components"]["schemas"]["RetrieveRequest"]
    assert req["additionalProperties"] is False
    assert (req["properties"]["queries"]["minItems"], req["properties"]["queries"]["maxItems"]) == (1, 16)
    assert (
        req["properties"]["queries"]["items"]["maxLength"] == 200
        and req["properties"]["topk"]["anyOf"][0]["maximum"] == 10
    )
    responses = spec["paths"]["/retrieve"]["post"]["responses"]
    assert {"200", "401", "413", "415", "422", "503"} <= set(responses)
    assert spec["components"]["schemas"]["ErrorBody"]["properties"]["detail"]["type"] == "string"
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}


DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def test_with_a_token_every_route_but_health_needs_it_docs_and_unknown_paths_too(guarded: BackgroundServer) -> None:
    for path in (*DOCS, "/info", "/no-such-route"):
        r = httpx.get(guarded.url + path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert httpx.get(guarded.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
    assert httpx.post(guarded.url + "/retrieve", json={"queries": ["chess"]}).status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    ok = {"Authorization": "Bearer s3cret"}
    assert [
        httpx.get(guarded.url + p, headers=ok).status_code for p in ("/openapi.json", "/docs", "/redoc", "/info")
    ] == [200] * 4
    assert httpx.get(guarded.url + "/no-such-route", headers=ok).status_code == 404


def test_public_docs_opens_the_docs_and_schema_only(tiny) -> None:
    with BackgroundServer(tiny, token="s3cret", public_docs=True) as s:
        assert [httpx.get(s.url + p).status_code for p in ("/openapi.json", "/docs", "/redoc")] == [200] * 3
        assert "securitySchemes" in httpx.get(s.url + "/openapi.json").json()["components"]
        assert httpx.get(s.url + "/info").status_code == 401
        assert httpx.post(s.url + "/retrieve", json={"queries": ["chess"]}).status_code == 401
        assert httpx.get(s.url + "/no-such-route").status_code == 401


def test_serve_forwards_public_docs_to_every_replica_and_the_token_by_environment(monkeypatch) -> None:
    import pvpo.retriever.replicas as replicas
    from pvpo.cli import app

    seen: dict = {}

    class FakeSet:
        def __init__(self, args, **kw) -> None:
            seen["args"], seen["env"] = args, kw["env"]
            self.urls, self.procs = [], []

        def start(self) -> FakeSet:
            return self

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(replicas, "ReplicaSet", FakeSet)
    res = CliRunner().invoke(
        app,
        ["retriever", "serve", "--index", ".", "--replicas", "2", "--public-docs"],
        env={"PVPO_RETRIEVER_TOKEN": "s3cret"},
    )
    assert res.exit_code == 0, res.output
    assert "--public-docs" in seen["args"] and "s3cret" not in " ".join(seen["args"])  # argv is public (ps)
    assert seen["env"]["PVPO_RETRIEVER_TOKEN"] == "s3cret"


def test_idle_sockets_and_slow_headers_are_closed_after_the_header_timeout(tiny) -> None:
    with BackgroundServer(tiny, header_timeout=0.5) as server:
        idle = [_connect(server) for _ in range(5)]
        slow = _connect(server)
        slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            try:
                slow.sendall(b"X")  # a header byte now and then
            except OSError:
                break
            time.sleep(0.2)
        assert all(_closed_by_server(s, within=2) for s in [*idle, slow])
        for s in [*idle, slow]:
            s.close()
        assert httpx.get(server.url + "/health").status_code == 200


def test_past_the_connection_limit_the_longest_idle_connection_makes_room(tiny) -> None:
    with BackgroundServer(tiny, max_connections=16, header_timeout=60) as server:
        idle = [_connect(server) for _ in range(40)]
        time.sleep(0.3)
        r = httpx.post(server.url + "/retrieve", json={"queries": ["chess"]}, timeout=5)
        assert r.status_code == 200
        closed = sum(_closed_by_server(s, within=0.2) for s in idle)
        assert closed >= 40 + 1 - 16
        for s in idle:
            s.close()


def test_a_small_request_is_not_stuck_behind_a_large_one(tiny) -> None:
    slow = SlowRetriever(tiny, per_query_s=0.01)
    with BackgroundServer(slow, max_batch_size=16, limits=Limits(max_queries=512)) as server:
        big: list[httpx.Response] = []
        t_big = time.perf_counter()
        t = threading.Thread(
            target=lambda: big.append(
                httpx.post(server.url + "/retrieve", timeout=60, json={"queries": [f"chess {i}" for i in range(400)]})
            )
        )
        t.start()
        time.sleep(0.3)  # the large request (400 x 10 ms = 4 s of search) is under way
        took = []
        for q in ("who wrote Hamlet", "capital of Japan", "largest planet", "cat"):
            t0 = time.perf_counter()
            assert httpx.post(server.url + "/retrieve", json={"queries": [q]}, timeout=60).status_code == 200
            took.append(time.perf_counter() - t0)
        t.join()
        big_s = time.perf_counter() - t_big
        assert big[0].status_code == 200 and len(big[0].json()["result"]) == 400
        assert big[0].json()["result"][0][0]["document"]["contents"].startswith('"Chess"')
    # one 16-query batch is 0.16 s; behind the whole request a small one waited all of its >= 4 s.
    # Relative to the large request's own time, so a loaded machine (both slower) cannot fail it.
    assert max(took) < 0.4 * big_s, (took, big_s)


def test_work_for_a_client_that_went_away_is_dropped(tiny, caplog) -> None:
    slow = SlowRetriever(tiny, per_query_s=0.01)
    with (
        caplog.at_level(logging.ERROR),
        BackgroundServer(slow, max_batch_size=16, limits=Limits(max_queries=512)) as server,
    ):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/retrieve", json={"queries": [f"q{i}" for i in range(500)]}, timeout=0.5)
        time.sleep(1.0)
        stats = httpx.get(server.url + "/info").json()["batching"]
    assert stats["dropped"] > 300 and stats["pending"] == 0
    assert slow.searched < 200  # 500 x 10 ms would have kept the worker busy for 5 s
    assert not [r for r in caplog.records if r.name.startswith("pvpo")], caplog.text  # a gone client is no error


def test_schemathesis_finds_no_contract_violation(tiny, tmp_path) -> None:
    cli = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    if cli is None:
        pytest.fail("schemathesis is not installed: pip install -e '.[dev]'")
    with BackgroundServer(tiny, token="s3cret", limits=Limits(max_queries=4, max_query_chars=48, max_topk=5)) as server:
        proc = subprocess.run(
            [
                cli,
                "run",
                server.url + "/openapi.json",
                "--checks",
                "all",
                "-H",
                "Authorization: Bearer s3cret",
                "--max-examples",
                "60",
                "--seed",
                "16",
                "--request-timeout",
                "20",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )  # its .schemathesis cache: not in the repo
    # ~5 s here (60 examples per operation, small limits so positive cases stay cheap to search)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "No issues found" in proc.stdout


@pytest.mark.slow
def test_under_a_low_open_file_limit_520_idle_sockets_do_not_starve_real_requests(tmp_path) -> None:
    import resource

    from pvpo.retriever.testing import build_tiny_index, start_server, stop_server

    index = build_tiny_index(tmp_path / "idx")
    # the hard limit too, so `serve` cannot raise it: 256 files, of which 192 for connections
    server, (url,) = start_server(
        index, timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    )
    port = int(url.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    try:
        for _ in range(520):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        for q in ("chess", "who wrote Hamlet", "capital of Japan"):
            r = httpx.post(url + "/retrieve", json={"query": q, "k": 1}, timeout=10)
            assert r.status_code == 200
    finally:
        for s in idle:
            s.close()
        stop_server(server)


def test_past_max_pending_a_request_gets_503_with_retry_after(tiny) -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_app(tiny, max_pending=2)) as client:
        r = client.post("/retrieve", json={"queries": ["a", "b", "c"]})
        ok = client.post("/retrieve", json={"queries": ["chess"]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["detail"].startswith("overloaded")
    assert ok.status_code == 200


def test_request_headers_past_the_limit_get_431_and_the_connection_closed_unread(tiny) -> None:
    """A 40 MB header was answered 200 (httptools keeps headers of any size); 16 such clients grew
    the server by 270 MB."""
    from pvpo.retriever.connections import MAX_HEADER_BYTES

    with BackgroundServer(tiny, header_timeout=60) as server:
        s = _connect(server)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            while sent < 8 * MAX_HEADER_BYTES:
                s.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass
        s.settimeout(5)
        assert s.recv(64).startswith(b"HTTP/1.1 431")
        s.close()
        small = {"X-Small": "a" * 4096}  # a header of ordinary size still passes
        assert httpx.get(server.url + "/health", headers=small, timeout=5).status_code == 200


def test_serve_on_a_port_in_use_is_refused_in_one_line_before_the_index_loads(tiny, tmp_path) -> None:
    from pvpo.cli import app

    with BackgroundServer(tiny) as server:
        t0 = time.monotonic()
        res = CliRunner().invoke(app, ["retriever", "serve", "--index", str(tmp_path), "--port", str(server.port)])
    assert res.exit_code == 2 and f"port {server.port} on 127.0.0.1 is in use" in res.output, res.output
    assert time.monotonic() - t0 < 10 and "Traceback" not in res.output
