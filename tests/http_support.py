"""A loopback JSON server for tests: a stand-in retriever or OpenAI-compatible endpoint answers
each request from one function of its path and body."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (path, the request's JSON body or None) -> (status, reply); a reply of None sends `status` as an error
Answer = Callable[[str, Any], tuple[int, Any]]


@contextmanager
def json_server(answer: Answer) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering every GET and POST through `answer`; yields its
    base URL. Replies are ASCII JSON, so a lone surrogate travels as its escape (`\\ud800`)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            status, reply = answer(self.path, body)
            if reply is None:
                self.send_error(status)
                return
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
