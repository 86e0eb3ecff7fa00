"""`pvpo retriever serve`'s log holds no error that is not one: faiss's loader reports each
CPU-specific build it does not find as a ModuleNotFoundError at INFO, which the server's INFO log
would show on every start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_log(index: Path, seconds: float = 120.0) -> str:
    """What `pvpo retriever serve --index index` writes until it answers /health (then stopped)."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pvpo.cli", "retriever", "serve", "--index", str(index), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"the server did not come up (rc {proc.poll()})")
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return out


def test_serving_logs_no_module_not_found_from_faiss(tmp_path_factory: pytest.TempPathFactory) -> None:
    from pvpo.retriever.testing import build_tiny_index

    log = serve_log(build_tiny_index(tmp_path_factory.getbasetemp() / "retriever"))
    assert "serving" in log and "Application startup complete" in log
    assert "ModuleNotFoundError" not in log and "Could not load library" not in log, log
