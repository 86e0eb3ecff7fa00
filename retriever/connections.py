"""How the retrieval server treats connections: the uvicorn configuration it is served with, and
an HTTP protocol that closes connections which do not finish their request headers in time and
keeps the number of open connections under a limit by closing the longest-idle one.

uvicorn's own keep-alive timeout only starts after a response, so a socket that connects and
sends nothing (or a header byte now and then) was held forever: 200 idle sockets stayed open for
40+ s, and under a low open-file limit 520 of them made every real request fail. Its httptools
parser also keeps request headers of any size: a 40 MB header was answered 200, and 16 such
clients grew the server by 270 MB; headers past MAX_HEADER_BYTES are answered 431 and closed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0  # from connecting (or the first byte of a keep-alive request) to the end of the headers
KEEP_ALIVE_S = 5.0  # idle time allowed between requests on one connection
FD_RESERVE = 64  # open files kept for the index, the corpus, logs and the worker threads
# request line and headers of one request (h11's default is 16 KiB; a Search-R1 client sends < 1 KiB)
MAX_HEADER_BYTES = 64 * 1024
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: 55\r\nconnection: close\r\n\r\n"
    b'{"detail": "request headers over 65536 bytes: refused"}'
)


def check_port_free(host: str, port: int) -> None:
    """OSError(EADDRINUSE) naming `host:port` when a server already listens there: checked
    before an index is loaded (which takes a while), not after."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} on {host} is in use (another server?): give another --port, or stop that server"
                ) from None
            raise


def open_file_limit(raise_soft: bool = False) -> int:
    """The process's soft limit on open files; with `raise_soft`, first raised to the hard limit
    (what a server should do at start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_soft and soft != hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, e)
    return soft


def default_max_connections(requested: int | None = None) -> int:
    """`requested` (default 4096), capped so the server never runs out of file descriptors."""
    return max(16, min(requested or 4096, open_file_limit() - FD_RESERVE))


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a header deadline and a connection cap with idle
    eviction. Subclassed per server by `protocol_class` with the two settings."""

    header_timeout: float = HEADER_TIMEOUT_S
    max_connections: int = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None  # set while no request is in progress
        self._header_bytes: int | None = 0  # bytes since the request began; None once its headers are in

    def data_received(self, data: bytes) -> None:
        counting = self._header_bytes is not None
        super().data_received(data)
        if counting and self._header_bytes is not None:  # the headers did not end in this chunk
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self.transport.write(_TOO_LARGE)
                self.transport.close()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = time.monotonic()
        self._arm_header_timer()
        if len(self.connections) > self.max_connections:
            # uvicorn types its connection set as every protocol it has; ours are all this class
            idle: list[Any] = [
                c for c in self.connections if c is not self and getattr(c, "idle_since", None) is not None
            ]
            victim = min(idle, key=lambda c: c.idle_since) if idle else self
            log.debug(
                "%d connections (limit %d): closing %s",
                len(self.connections),
                self.max_connections,
                "the longest-idle one" if victim is not self else "the new one",
            )
            victim.transport.close()

    def on_message_begin(self) -> None:
        self.idle_since = None
        self._arm_header_timer()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        self._header_bytes = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        self._header_bytes = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        self.idle_since = None
        super().connection_lost(exc)


def protocol_class(
    header_timeout: float = HEADER_TIMEOUT_S, max_connections: int | None = None
) -> type[GuardedHttpProtocol]:
    """A GuardedHttpProtocol with these settings (uvicorn builds protocols from a class)."""
    attrs = {"header_timeout": header_timeout, "max_connections": default_max_connections(max_connections)}
    return type("ServedHttpProtocol", (GuardedHttpProtocol,), attrs)


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    header_timeout: float | None = None,
    keep_alive: float | None = None,
    max_connections: int | None = None,
) -> Any:
    """The uvicorn.Config the server runs with, here and in `pvpo retriever serve` (None = the
    defaults above)."""
    import uvicorn

    http = protocol_class(HEADER_TIMEOUT_S if header_timeout is None else header_timeout, max_connections)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        http=http,
        # typed int by uvicorn, used as a loop.call_later delay: a float is kept whole
        timeout_keep_alive=KEEP_ALIVE_S if keep_alive is None else keep_alive,  # type: ignore[arg-type]
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
