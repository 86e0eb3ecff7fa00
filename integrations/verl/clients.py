"""One retriever client per process and server set, shared by everything verl builds per
trajectory (an agent loop is instantiated for every sample; a tool once per worker)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from pvpo.retriever.client import RetrieverClient

URL_ENV = "PVPO_RETRIEVER_URL"

_clients: dict[tuple[tuple[str, ...], int, float], RetrieverClient] = {}
_lock = threading.Lock()


def server_urls(url: str | Sequence[str] | None) -> list[str]:
    """The retriever base URLs: `url` (one, several, or a comma-separated string; a trailing
    `/retrieve`, as verl's search tool configs write it, is dropped), else $PVPO_RETRIEVER_URL."""
    if url is None or url == "":
        url = os.environ.get(URL_ENV, "")
    urls = url.split(",") if isinstance(url, str) else list(url)
    out = [u.strip().rstrip("/").removesuffix("/retrieve") for u in urls if u and u.strip()]
    if not out:
        raise ValueError(f"no retriever URL: set retriever_url in the verl config or ${URL_ENV}")
    return out


def shared_client(url: str | Sequence[str] | None, *, topk: int = 3, timeout: float = 30.0) -> RetrieverClient:
    """The process's client for these servers (blocking; verl's async code calls it in a thread)."""
    key = (tuple(server_urls(url)), int(topk), float(timeout))
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = RetrieverClient(list(key[0]), topk=key[1], timeout=key[2])
        return client
