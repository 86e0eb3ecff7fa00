"""`pvpo view --serve`: the page served on loopback, for a browser on this machine (or through an
SSH tunnel) when opening a file is not at hand. One page, no other path, loopback only: the page
holds every question and answer of the folders, so it is never offered to the network, and a
request naming another host (a page of some site whose name was made to resolve to 127.0.0.1,
"DNS rebinding") is refused: only `127.0.0.1`, `localhost` and `[::1]`, with any port (an SSH
tunnel's), are answered."""

from __future__ import annotations

import errno
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pvpo.viewer.sources import ViewError

LOOPBACK = "127.0.0.1"
# the Host header of a request from a browser on this machine (or through a tunnel to it)
_LOCAL_HOST = re.compile(r"(?:127\.0\.0\.1|localhost|\[::1\])(?::\d{1,5})?", re.IGNORECASE)


def local_host(host: str | None) -> bool:
    """Whether a request's Host header names this machine's loopback (`_LOCAL_HOST`)."""
    return host is not None and _LOCAL_HOST.fullmatch(host.strip()) is not None


class PageServer:
    """An HTTP server on 127.0.0.1 answering `GET /` (and `/index.html`) with one page; `port` 0 takes
    a free port. `url` says where it listens; `serve_forever` blocks, `start` runs it in a thread."""

    def __init__(self, page: str, port: int = 0) -> None:
        body = page.encode("utf-8")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if not local_host(self.headers.get("Host")):
                    self.send_error(403, "pvpo view answers requests for 127.0.0.1 or localhost only")
                    return
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

        try:
            self.httpd = ThreadingHTTPServer((LOOPBACK, port), Handler)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ViewError(
                f"--port {port}: another program listens on {LOOPBACK}:{port}; give another port, or --port 0 for a free one"
            ) from None
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
