"""An ASGI layer in front of the retrieval app that decides, before any body is parsed, whether a
request gets in: the bearer token first, on every path but the public ones (/health, and the API
docs only when the operator says so; a request without it gets a 401 and its body is never
read), then the content type (415 unless JSON), then the body size, counted while the body
streams in (Content-Length or chunked; 413 the moment it passes the limit) and the time the body
may take to arrive (408), and that it is UTF-8 (422). Refusals close the connection, so an unread
body is not read either.

It replaces a check of Content-Length alone, which let a chunked body of 500 MB through
unauthenticated (server RSS 637 MB -> 2 GB, and it stayed there).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# answers a body that passed the guard on a json path and returns True, or returns False
FastPath = Callable[[bytes, Scope, Receive, Send], Awaitable[bool]]


def is_json_media_type(content_type: str) -> bool:
    """`application/json` (any parameters) or a `+json` type; an absent type is taken as JSON,
    as FastAPI does, since Search-R1 clients always send JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("", "application/json") or (media.startswith("application/") and media.endswith("+json"))


async def send_json(send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A complete JSON response that also closes the connection."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _detail(text: str) -> bytes:
    return json.dumps({"detail": text}).encode()


class RequestGuard:
    """Wraps `app`: with a token, every path but `public` needs it (unknown paths too, so a 404
    tells nothing); JSON-only bodies on `json_paths`, and a body of at most `max_body` bytes
    that arrives within `body_timeout` seconds. A body that passes goes to `fast` first, then
    to `app` unless `fast` answered it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_body: int,
        body_timeout: float = 30.0,
        public: tuple[str, ...] = ("/health",),
        json_paths: tuple[str, ...] = ("/retrieve",),
        fast: FastPath | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.public = frozenset(public)
        self.json_paths = json_paths
        self.fast = fast

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        if self.token is None:
            return True
        header = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(given.strip(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers", [])
        path = scope.get("path", "")
        if path not in self.public and not self._authorized(headers):
            return await send_json(
                send, 401, _detail("missing or wrong bearer token"), ((b"www-authenticate", b"Bearer"),)
            )
        if path not in self.json_paths or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        content_type = next((v for k, v in headers if k == b"content-type"), b"").decode("latin-1")
        if not is_json_media_type(content_type):
            return await send_json(
                send, 415, _detail(f"content type {content_type!r} is not accepted: send application/json")
            )
        too_large = _detail(f"request body too large (at most {self.max_body} bytes)")
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await send_json(send, 413, too_large)
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.body_timeout)
        except asyncio.TimeoutError:
            return await send_json(send, 408, _detail(f"request body not received within {self.body_timeout:g} s"))
        if body is None:
            return await send_json(send, 413, too_large)
        if isinstance(body, dict):  # the client disconnected before sending all of it
            return None
        try:  # JSON is UTF-8 (RFC 8259); FastAPI would answer another encoding with a bare 400
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            return await send_json(send, 422, _detail(f"body is not valid JSON: not UTF-8 at byte {e.start}"))
        if self.fast is not None and await self.fast(body, scope, receive, send):
            return None
        return await self.app(scope, self._replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | dict[str, Any] | None:
        """The whole body; None once it passes `max_body` (the rest is never read); the
        disconnect message when the client goes away."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return dict(message)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    def _replay(body: bytes, receive: Receive) -> Receive:
        """A receive that yields the buffered body once, then the server's own messages (the
        disconnect the endpoint watches for)."""
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay
