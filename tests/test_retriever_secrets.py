"""The retriever's bearer token is never written to disk: not by a build run with it in
the environment, not by a server at debug log level answering right, wrong and missing tokens
and bad requests (its log, its index directory and its home directory scanned byte for byte),
and not in the traceback of a serve that fails, --debug included."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx

from pvpo.retriever.testing import start_server, stop_server, write_tiny_corpus


def _files_holding(root: Path, secret: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes()]


def test_a_build_and_a_served_session_write_the_token_nowhere(tmp_path) -> None:
    token = "tok-" + secrets.token_hex(16)
    home = tmp_path / "home"
    home.mkdir()
    env = os.environ | {"PVPO_RETRIEVER_TOKEN": token, "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    corpus = write_tiny_corpus(tmp_path / "corpus.json")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pvpo.cli",
            "retriever",
            "build",
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "idx"),
            "--device",
            "cpu",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr.decode()[-2000:]
    log = tmp_path / "server.log"
    proc, (url,) = start_server(tmp_path / "idx", log_level="debug", log=log, env=env, cwd=tmp_path, timeout=120)
    try:
        good = {"Authorization": f"Bearer {token}"}
        assert httpx.post(url + "/retrieve", json={"queries": ["chess"]}, headers=good).status_code == 200
        assert httpx.post(url + "/retrieve", json={"queries": []}, headers=good).status_code == 422
        assert httpx.get(url + "/info", headers=good).status_code == 200
        assert token not in httpx.get(url + "/info", headers=good).text
        assert httpx.get(url + "/openapi.json", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
        assert httpx.post(url + "/retrieve", json={"queries": ["chess"]}).status_code == 401
    finally:
        stop_server(proc)
    assert log.stat().st_size > 0  # the debug log was written, and scanned below
    assert _files_holding(tmp_path, token.encode()) == []


def test_a_failing_serve_does_not_print_the_token_even_with_debug(tmp_path) -> None:
    """A serve that fails prints a traceback (with --debug, or for an unexpected error), which a
    service manager writes to its log: the token, an argument of the failing call, stays out."""
    token = "tok-" + secrets.token_hex(16)
    (tmp_path / "meta.json").write_text('{"backend": "faiss", "corpus": "c.jsonl"}')  # no index_file: a KeyError
    for debug in ([], ["--debug"]):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pvpo.cli",
                *debug,
                "retriever",
                "serve",
                "--index",
                str(tmp_path),
                "--token",
                token,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
        )
        assert res.returncode != 0 and "Traceback" in res.stderr  # an unexpected error: the full traceback
        assert token not in res.stdout + res.stderr


def test_the_password_of_a_retriever_url_is_masked_in_every_message_of_the_client() -> None:
    """`last tried http://admin:PASSWORD99@...` echoed the credentials."""
    import logging

    import pytest

    from pvpo.retriever.client import RetrieverClient, RetrieverError
    from pvpo.user_errors import describe

    url = "http://admin:PASSWORD99@127.0.0.1:9"
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    logging.getLogger("pvpo.retriever.client").addHandler(handler)
    try:
        with RetrieverClient(url, retries=1, backoff=0.01) as client, pytest.raises(RetrieverError) as info:
            client.search(["q"])
    finally:
        logging.getLogger("pvpo.retriever.client").removeHandler(handler)
    shown = [str(info.value), describe(info.value) or "", *records]
    assert records and not [m for m in shown if "PASSWORD99" in m]
    assert "admin:***@127.0.0.1:9" in str(info.value)
