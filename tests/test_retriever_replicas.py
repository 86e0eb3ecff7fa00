"""`pvpo retriever serve --replicas 2`: two server processes on consecutive loopback ports, the
client's round-robin spreading requests over both, and SIGTERM to the parent stopping both."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pvpo.retriever.client import RetrieverClient
from pvpo.retriever.replicas import ReplicaSet, replica_threads, replica_urls
from pvpo.retriever.testing import TINY_QUERIES, build_tiny_index, free_consecutive_ports, start_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _serve_two_replicas(index: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    """`pvpo retriever serve --replicas 2` on ports port, port + 1 (stdout piped: the serving lines)."""
    return start_server(index, port=port, replicas=2, extra=extra, wait=False, stdout=subprocess.PIPE, text=True)[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_replica_urls_and_threads() -> None:
    assert replica_urls("127.0.0.1", 8000, 3) == [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
    ]
    assert replica_urls("::1", 9000, 1) == ["http://[::1]:9000"]
    assert replica_threads(2, 3) == 3 and replica_threads(64, None) == 1
    with pytest.raises(ValueError, match="replicas must be >= 1, got 0"):
        ReplicaSet([], host="127.0.0.1", port=8000, replicas=0)


def test_two_replicas_share_the_clients_requests_and_stop_on_sigterm(tmp_path: Path) -> None:
    index = build_tiny_index(tmp_path)
    port = free_consecutive_ports(2)
    parent = _serve_two_replicas(index, port, "--encoder-backend", "torch")
    try:
        # each replica prints its own "serving ..." line; the parent's comes once all answer /health
        lines = [parent.stdout.readline() for _ in range(3)]
        line = next((x for x in lines if "replicas (pids" in x), "")
        assert sum(x.startswith("serving ") for x in lines) == 2 and line, lines
        pids = [int(p) for p in line.split("(pids ", 1)[1].split(")", 1)[0].split()]
        urls = replica_urls("127.0.0.1", port, 2)
        assert all(f"--url {u}" in line for u in urls)
        with RetrieverClient(urls, topk=1, retries=0) as client:
            for q, title in TINY_QUERIES:
                assert client.search([q])[0][0].title == title
        infos = [httpx.get(u + "/info").json() for u in urls]
        assert all(i["encoder"] == {"backend": "torch", "dtype": "float32"} for i in infos)
        served = [i["batching"]["queries"] for i in infos]
        assert served == [len(TINY_QUERIES) // 2] * 2  # round-robin: every other request to each
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a replica outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()  # the replicas get SIGTERM from the kernel (PR_SET_PDEATHSIG)
            parent.wait()


def test_replicas_of_a_killed_parent_stop_too(tmp_path: Path) -> None:
    index = build_tiny_index(tmp_path)
    port = free_consecutive_ports(2)
    parent = _serve_two_replicas(index, port)
    try:
        line = next((x for x in (parent.stdout.readline() for _ in range(3)) if "replicas (pids" in x), "")
        pids = [int(p) for p in line.split("(pids ", 1)[1].split(")", 1)[0].split()]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a replica outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
