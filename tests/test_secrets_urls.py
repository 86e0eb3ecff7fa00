"""A URL's credentials are found by the parser httpx uses and masked everywhere they could be echoed:
a password holding `@` is masked whole (not up to its first `@`) in `config show`, a client's error
and a run's config.yaml; one holding `/` (a URL httpx cannot parse) is refused in one masked line,
not a traceback quoting its first part; and `pvpo --debug` prints no password in its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from http_support import json_server
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.secrets import check_url, mask_exception, mask_url
from pvpo.user_errors import add_note

REPO = Path(__file__).resolve().parents[1]


def _server(status: int, reply: dict) -> AbstractContextManager[str]:
    """A loopback HTTP server answering every request with `status` and `reply`; yields its base URL."""
    return json_server(lambda path, body: (status, reply))


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("http://admin:Secret@4x@127.0.0.1:9/v1", "Secret@4x"),
        ("http://admin:p%40ss@h:1", "p%40ss"),
        ("https://tok3n@example.org/x", "tok3n"),
        ("http://u:pa:ss@h:8000", "pa:ss"),
    ],
)
def test_credentials_are_masked_where_httpx_reads_them(url: str, password: str) -> None:
    """The masked URL still reaches the same host and port by httpx's parse, with `***` as its password."""
    masked = mask_url(f"last tried {url}: refused")
    assert password not in masked and password.split("@")[-1] not in masked
    shown = httpx.URL(masked.split()[2].rstrip(":"))
    real = httpx.URL(url)
    assert (shown.host, shown.port, shown.path) == (real.host, real.port, real.path)
    assert "***" in (shown.password or shown.username)


def test_a_password_holding_an_at_sign_is_masked_whole_in_config_show_and_a_runs_config(tmp_path) -> None:
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.config.written import dump_config

    url = "http://admin:Secret@4x@127.0.0.1:9"
    show = CliRunner().invoke(app, ["config", "show", f"retriever.url={url}"])
    assert show.exit_code == 0, show.output
    assert "4x" not in show.output and "url: http://admin:***@127.0.0.1:9" in show.output
    dump_config(load_config(None, [f"retriever.url={url}"]), tmp_path / "config.yaml")
    written = (tmp_path / "config.yaml").read_text()
    assert "4x" not in written and "url: http://admin:***@127.0.0.1:9" in written


def test_a_password_holding_a_slash_is_refused_in_one_masked_line() -> None:
    url = "http://admin:Sec/ret4x@127.0.0.1:9"
    for args in (
        ["retriever", "query", "--url", url, "--retries", "0", "who?"],
        ["config", "show", f"retriever.url={url}"],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "Sec" not in res.output and "ret4x" not in res.output, res.output
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 3
        assert "admin:***@127.0.0.1:9" in res.output and "%2F" in res.output  # where, and the fix
    with pytest.raises(ValueError, match="percent-encode") as info:
        check_url(url, "--url")
    assert "Sec" not in str(info.value)


def test_a_malformed_url_is_one_line_naming_the_option() -> None:
    for args, option in (
        (["retriever", "query", "--url", "http://127.0.0.1:80a", "who?"], "--url"),
        (["eval", "--engine", "openai", "--base-url", "http://127.0.0.1:80a/v1", "--model-name", "m",
          "--dataset", "nq", "--retriever-url", "http://127.0.0.1:9", "--out", "/nonexistent/x"], "--base-url"),
        (["eval", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m",
          "--dataset", "nq", "--retriever-url", "http://127.0.0.1:80a", "--out", "/nonexistent/x"], "--retriever-url"),
    ):  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert f"error: {option} 'http://127.0.0.1:80a" in res.output and "Invalid port" in res.output


def test_mask_exception_masks_every_exception_of_a_chain() -> None:
    import traceback

    pw = "".join(reversed("QzX7"))
    try:
        try:
            raise OSError(2, "No such file", f"http://u:{pw}1@h/f")
        except OSError as inner:
            raise RuntimeError(f"http://u:{pw}2@h/v1 failed") from inner
    except RuntimeError as err:
        add_note(err, f"tried http://u:{pw}3@h")
        mask_exception(err)
        text = "".join(traceback.format_exception(err))
    assert pw not in text and text.count("u:***@h") == 3


def test_debug_traceback_of_a_refused_endpoint_holds_no_password(tmp_path) -> None:
    """`pvpo --debug eval --engine openai --base-url http://u:PW@host/v1` against a 401 printed
    the password in the OpenAIError of its traceback."""
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "1", "question": "who?", "golden_answers": ["x"]}\n')
    with _server(401, {"error": "bad key"}) as base:
        endpoint = base.replace("http://", "http://u:PW4xQ9@") + "/v1"
        res = subprocess.run(
            [sys.executable, "-m", "pvpo.cli", "--debug", "eval", "--engine", "openai", "--base-url", endpoint,
             "--model-name", "m", "--dataset", str(data), "--retriever-url", base, "--out", str(tmp_path / "out"),
             "--quiet"],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env=os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "60"},
        )  # fmt: skip
    assert res.returncode == 1 and "Traceback" in res.stderr and "OpenAIError" in res.stderr, res.stderr[-2000:]
    assert "PW4xQ9" not in res.stdout + res.stderr
    assert "u:***@127.0.0.1" in res.stderr


def test_an_endpoint_error_names_the_url_without_its_password() -> None:
    """The OpenAIError itself is masked (it is logged and kept, not only printed)."""
    from pvpo.trainer.rollout.openai_client import OpenAIClient, OpenAIError

    with _server(401, {"error": "bad key"}) as base:
        client = OpenAIClient(base.replace("http://", "http://u:Secret@4x@") + "/v1", "m", retries=0)
        with pytest.raises(OpenAIError, match="HTTP 401") as info:
            client.post("completions", {"prompt": "p"})
        client.close()
    assert "4x" not in str(info.value) and "u:***@127.0.0.1" in str(info.value)


def test_the_http_clients_request_log_holds_no_password(caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs every request's URL at INFO as given, `http://u:PASSWORD@host/...` included."""
    import logging

    from pvpo.retriever.client import RetrieverClient

    with _server(200, {"result": [[]]}) as base, caplog.at_level(logging.INFO, logger="httpx"):
        with RetrieverClient(base.replace("http://", "http://u:Secret@4x@"), retries=0) as client:
            assert client.search(["q"]) == [[]]
    assert "HTTP Request: POST http://u:***@127.0.0.1" in caplog.text and "4x" not in caplog.text
