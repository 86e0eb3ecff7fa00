"""Several server processes for one index (`pvpo retriever serve --replicas K`): replica i listens
on port + i, and clients spread requests over the URLs with RetrieverClient's round-robin.

Consecutive ports rather than one SO_REUSEPORT port: the kernel balances SO_REUSEPORT by
connection, so a few keep-alive clients (a trainer holds one or two) can all land on one
replica, while per-request round-robin over K URLs spreads even one client's requests; each
replica can also be health-checked and restarted on its own. Each replica loads its own copy of
the index (K x the memory of one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import httpx


def replica_urls(host: str, port: int, replicas: int) -> list[str]:
    """The URL of each replica."""
    host = f"[{host}]" if ":" in host else host
    return [f"http://{host}:{port + i}" for i in range(replicas)]


def replica_threads(replicas: int, threads: int | None) -> int:
    """torch threads per replica: as given, else the cores less one (for HTTP) shared out, at
    least 1 (on 2 cores, 1 each)."""
    if threads is not None:
        return threads
    return max(1, ((os.cpu_count() or 2) - 1) // replicas)


class ReplicaSet:
    """K `pvpo retriever serve` child processes on consecutive ports; stop() (or leaving the
    `with` block) sends each SIGTERM, waits, and kills any still running after `grace` s."""

    def __init__(
        self,
        serve_args: Sequence[str],
        *,
        host: str,
        port: int,
        replicas: int,
        env: dict[str, str] | None = None,
        grace: float = 15.0,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.serve_args = list(serve_args)
        self.host, self.port, self.replicas = host, port, replicas
        self.env = env
        self.grace = grace
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return replica_urls(self.host, self.port, self.replicas)

    def start(self, *, wait: float = 300.0) -> ReplicaSet:
        """Starts every replica and returns once each answers /health (or raises, stopping all)."""
        base = [sys.executable, "-m", "pvpo.cli", "retriever", "serve", *self.serve_args, "--host", self.host]
        try:
            for i in range(self.replicas):
                self.procs.append(
                    subprocess.Popen([*base, "--port", str(self.port + i)], env=self.env, preexec_fn=_die_with_parent)
                )
            wait_healthy(self.urls, self.procs, timeout=wait)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM to each replica (uvicorn then finishes open requests), SIGKILL past the grace."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def wait(self) -> int:
        """Blocks until a replica exits or this process gets SIGINT / SIGTERM; then stops all.
        Returns the first non-zero exit status seen (0 after a signal)."""
        stop = False

        def on_signal(signum: int, frame: FrameType | None) -> None:
            nonlocal stop
            stop = True

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        status = 0
        try:
            while not stop:
                exited = [p for p in self.procs if p.poll() is not None]
                if exited:
                    status = next((p.returncode for p in exited if p.returncode), 0)
                    break
                time.sleep(0.2)
        finally:
            self.stop()
            for s, handler in old.items():
                signal.signal(s, handler)
        return status

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_healthy(urls: Sequence[str], procs: Sequence[subprocess.Popen[Any]], *, timeout: float) -> None:
    """Returns once every URL answers /health; RuntimeError naming the URL when the process serving
    it (`procs[i]`; one parent repeated for a `serve --replicas` child set) exits first, or when
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    for proc, url in zip(procs, urls, strict=True):
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"server {url} exited with status {proc.returncode} before serving")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {url} did not answer /health within {timeout:.0f} s")
            time.sleep(0.2)


def _die_with_parent() -> None:
    """In a replica, before exec: Linux sends it SIGTERM when the parent dies, even by SIGKILL,
    so no replica outlives a killed `serve --replicas` (elsewhere stop() is the only cleanup)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
