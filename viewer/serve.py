"""`pvpo view --serve`: the page served on loopback, for a browser on this machine (or through an
SSH tunnel) when opening a file is not at hand. One page, no other path, loopback only: the page
holds every question and answer of the folders, so it is never offered to the network."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"


class PageServer:
    """An HTTP server on 127.0.0.1 answering `GET /` (and `/index.html`) with one page; `port` 0 takes
    a free port. `url` says where it listens; `serve_forever` blocks, `start` runs it in a thread."""

    def __init__(self, page: str, port: int = 0) -> None:
        body = page.encode("utf-8")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] not in ("/", "/index.html"):
                    self.send_error(404, "pvpo view serves one page, at /")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
                pass  # one line per request would bury the URL line the command prints

        self.httpd = ThreadingHTTPServer((LOOPBACK, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.httpd.server_address[1]}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> PageServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
