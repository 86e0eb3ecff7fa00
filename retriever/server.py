"""The retrieval HTTP service: FastAPI app speaking Search-R1's `/retrieve` JSON, with
cross-request batching in bounded batches, input limits published in its OpenAPI schema, an
optional bearer token checked before the body is read, and a background-thread server for tests,
demos and benchmarks served with the same connection settings as `pvpo retriever serve`."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from pvpo.retriever.batching import DynamicBatcher, Overloaded
from pvpo.retriever.connections import HEADER_TIMEOUT_S, KEEP_ALIVE_S, uvicorn_config
from pvpo.retriever.guard import Receive, RequestGuard, Scope, Send
from pvpo.retriever.index import Retriever
from pvpo.retriever.schema import (
    ErrorBody,
    Health,
    Limits,
    RetrieveRequestBase,
    RetrieveResponse,
    error_messages,
    request_model,
)

log = logging.getLogger(__name__)


def _json(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response, encoded with orjson when installed (several times faster than json for
    the passage lists /retrieve returns; NaN becomes null instead of an error)."""
    if _orjson is None:
        return JSONResponse(content, status_code=status_code, headers=headers)
    return Response(_orjson.dumps(content), status_code=status_code, headers=headers, media_type="application/json")


try:
    import orjson as _orjson
except ImportError:  # optional: the stdlib encoder is used instead
    _orjson = None  # type: ignore[assignment]


def set_torch_threads(threads: int | None) -> int:
    """Sets torch's intra-op CPU threads; None = one fewer than the visible cores (at least 1),
    leaving a core to the event loop that parses requests while a batch is encoded. Returns
    the number set."""
    import os

    import torch

    n = threads if threads is not None else max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(n)
    return n


@dataclass(frozen=True)
class SearchPlan:
    """How a server searches: `workers` threads each computing a batch's groups with
    `worker_threads` CPU threads, and a lone query with `solo_threads` (None: no budget, the
    libraries' defaults; no solo thread)."""

    workers: int
    worker_threads: int | None
    solo_threads: int | None


def search_plan(
    retriever: Retriever, *, workers: int | None = None, threads: int | None = None, solo_threads: int | None = None
) -> SearchPlan:
    """The plan for `retriever`. With an exported CPU encoder (ONNX Runtime, OpenVINO), whose
    thread count is chosen per call: a worker a core with one thread each unless told otherwise,
    and `solo_threads` (default every core) for a lone query, no solo lane when that is no more
    than a worker's. One thread spends 9.9 ms of CPU a MiniLM query at batch 1 and 7.6 ms at batch
    32 (bench/retriever/encoder.py, 2 loaded cores): batching saves a quarter, and a worker a core puts every
    core to work where the small matrices of a query batch gain little from a second thread in one
    worker. Otherwise
    (torch, whose thread count is process-wide; BM25 and hybrid indexes, whose lexical search is
    not known to be thread-safe; a GPU) one worker and no budget, as `threads` is then torch's
    count (`set_torch_threads`)."""
    from pvpo.retriever.index import DenseRetriever
    from pvpo.retriever.thread_budget import cpu_cores

    if not isinstance(retriever, DenseRetriever) or retriever.encoder.runtime is None:
        return SearchPlan(workers or 1, None, None)
    cores = cpu_cores()
    workers = workers or max(1, cores // (threads or 1))
    threads = threads or max(1, cores // workers)
    solo = solo_threads or cores
    return SearchPlan(workers, threads, solo if solo > threads else None)


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


async def _client_gone(receive: Receive) -> None:
    """Returns when the client disconnects (after the body, the server's receive only yields
    the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def create_app(
    retriever: Retriever,
    *,
    max_batch_size: int = 64,
    max_batch_chars: int = 8192,
    max_wait_ms: float = 5.0,
    max_delay_ms: float = 20.0,
    batching: bool = True,
    token: str | None = None,
    limits: Limits | None = None,
    max_pending: int = 16384,
    body_timeout: float = 30.0,
    public_docs: bool = False,
    plan: SearchPlan | None = None,
) -> FastAPI:
    """The app serving one retriever: POST /retrieve, GET /health, GET /info, behind a
    RequestGuard (token, content type, streamed body limit). With a token, every route but
    /health needs it, the OpenAPI schema and the docs pages included unless `public_docs`.
    `token=""` is refused: an empty bearer would let everyone in. `plan`: the search workers and
    their threads (default `search_plan(retriever)`)."""
    if token is not None and not token.strip():
        raise ValueError("token is empty: give a non-empty bearer token, or none to serve without one")
    limits = limits or Limits()
    plan = plan or search_plan(retriever)
    batcher = DynamicBatcher(
        retriever.search_varying,
        max_batch_size=max_batch_size,
        max_batch_chars=max_batch_chars,
        max_wait_ms=max_wait_ms,
        max_delay_ms=max_delay_ms,
        coalesce=batching,
        max_pending=max_pending,
        pad_group=_pad_group(retriever),
        workers=plan.workers,
        worker_threads=plan.worker_threads,
        solo_threads=plan.solo_threads,
    )
    RetrieveRequest = request_model(limits)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await _load_runners(retriever, plan)
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(
        title="pvpo retriever",
        lifespan=lifespan,
        description='Search-R1 `/retrieve` over a dense or BM25 index. Every error body is `{"detail": str}`.',
    )
    app.state.batcher = batcher
    app.state.retriever = retriever
    auth: dict[int | str, dict[str, Any]] = {401: _error("missing or wrong bearer token")} if token is not None else {}
    security: list[dict[str, list[str]]] | None = [{"bearer": []}] if token is not None else None

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> Response:
        return _json({"detail": error_messages(list(exc.errors()), limits)}, status_code=422)

    @app.exception_handler(Exception)
    async def on_crash(_: Request, exc: Exception) -> Response:  # the text stays in the server log
        log.error("unhandled error", exc_info=exc)
        return _json({"detail": "internal error (logged on the server)"}, status_code=500)

    async def answer(req: RetrieveRequestBase, receive: Receive) -> Response:
        """The reply to a valid /retrieve body: searched in batches shared with other requests;
        499 if the client went away first (its queries not yet searched are dropped)."""
        queries, topk = req.resolved(retriever.default_topk)
        work = asyncio.ensure_future(batcher.submit(queries, topk))
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # the client went away (or the server stops): drop its queries
        if not work.done() or work.cancelled():
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        try:
            results = work.result()
        except Overloaded as e:
            return _json({"detail": f"overloaded: {e}"}, status_code=503, headers={"Retry-After": "1"})
        except Exception:  # noqa: BLE001 - one failed search must not take the server down
            log.exception("retrieval failed")
            return _json({"detail": "retrieval failed (logged on the server)"}, status_code=500)
        if req.return_scores:
            body = [[{"document": {"id": p.id, "contents": p.contents}, "score": p.score} for p in r] for r in results]
        else:
            # Same nesting without "score": Search-R1's client reads item["document"]["contents"].
            body = [[{"document": {"id": p.id, "contents": p.contents}} for p in r] for r in results]
        return _json({"result": body})

    async def fast_retrieve(body: bytes, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answers a /retrieve body that validates without FastAPI's routing, dependency and
        exception layers (returns False for any other body, which FastAPI then answers with the
        same 422 as ever): they were most of the event loop's 0.3-0.45 ms a request, time the
        encoder thread waited on the GIL at 64 clients (bench/retriever/retriever.py)."""
        try:
            req = RetrieveRequest.model_validate_json(body)
        except ValidationError:
            return False
        try:
            response = await answer(req, receive)
        except Exception as exc:  # noqa: BLE001 - as on_crash: the text stays in the server log
            log.error("unhandled error", exc_info=exc)
            response = _json({"detail": "internal error (logged on the server)"}, status_code=500)
        await response(scope, receive, send)
        return True

    async def retrieve(req: RetrieveRequestBase, request: Request) -> Response:
        """Top passages of each query (Search-R1 shape). A request larger than one batch is
        searched in several, interleaved with other clients' requests; work for a client that
        disconnects is dropped."""
        return await answer(req, request.receive)

    retrieve.__annotations__["req"] = RetrieveRequest  # built from `limits` at run time: no name to annotate with
    app.post(
        "/retrieve",
        response_model=RetrieveResponse,
        openapi_extra={"security": security} if security else None,
        responses={
            **auth,
            408: _error("body not received in time"),
            413: _error("body larger than the limits allow"),
            415: _error("body is not JSON"),
            422: _error("invalid request; the detail names the field"),
            500: _error("the search failed"),
            503: _error("overloaded; retry after Retry-After seconds"),
        },
    )(retrieve)

    @app.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        """Liveness and corpus size; never needs the token."""
        return {"status": "ok", "size": len(retriever)}

    @app.get("/info", responses=auth, openapi_extra={"security": security} if security else None)
    async def info() -> dict[str, Any]:
        """Model, index type, size, dim, device, batching settings and counters, limits."""
        return retriever.info() | {
            "encoder": _encoder_info(retriever),
            "default_topk": retriever.default_topk,
            "batching": {
                "enabled": batching,
                "max_batch_size": max_batch_size,
                "max_batch_chars": max_batch_chars,
                "max_wait_ms": max_wait_ms,
                "max_delay_ms": max_delay_ms,
                "workers": plan.workers,
                "worker_threads": plan.worker_threads,
                "solo_threads": plan.solo_threads,
                "batches": batcher.batches,
                "queries": batcher.queries,
                "dropped": batcher.dropped,
                "pending": batcher.pending,
            },
            "limits": limits.model_dump(),
        }

    if token is not None:
        _add_bearer_scheme(app)
    docs = (app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
    public = ("/health", *(p for p in docs if p and public_docs))
    app.add_middleware(
        RequestGuard,
        token=token,
        max_body=limits.max_body_bytes,
        body_timeout=body_timeout,
        public=public,
        fast=fast_retrieve,
    )
    return app


def _query_encoder(retriever: Retriever) -> Any:
    """The retriever's query encoder (a hybrid retriever's dense side); None for BM25."""
    return getattr(retriever, "encoder", None) or getattr(getattr(retriever, "dense", None), "encoder", None)


async def _load_runners(retriever: Retriever, plan: SearchPlan) -> None:
    """Makes the exported encoder's sessions for the plan's thread counts (the workers' for as many
    callers as workers), at once on threads of their own, before the server answers: the first
    queries do not wait for a session (0.4-0.7 s each for MiniLM on 2 loaded cores)."""
    runtime = getattr(_query_encoder(retriever), "runtime", None)
    counts = {n: 1 for n in (plan.solo_threads,) if n is not None}
    if plan.worker_threads is not None:
        counts[plan.worker_threads] = plan.workers  # the workers call it at once
    if runtime is not None and counts:
        await asyncio.gather(*(asyncio.to_thread(runtime.runner, n, c) for n, c in counts.items()))


def _pad_group(retriever: Retriever) -> int | None:
    """How many length-sorted queries the encoder pads together (its query batch size); None
    (the whole batch at once) for BM25, which searches a batch in one call."""
    encoder = _query_encoder(retriever)
    return getattr(encoder, "query_batch_size", None) if encoder is not None else None


def _encoder_info(retriever: Retriever) -> dict[str, Any] | None:
    """The query encoder's backend and dtype (a hybrid retriever's dense side); None for BM25."""
    encoder = _query_encoder(retriever)
    if encoder is None:
        return None
    return {"backend": getattr(encoder, "backend", "torch"), "dtype": getattr(encoder, "dtype", "float32")}


def _add_bearer_scheme(app: FastAPI) -> None:
    """Declare the bearer scheme the `security` of /retrieve and /info refers to."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        schema = base()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
        }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class BackgroundServer:
    """The real uvicorn server on a background thread (loopback, free port by default), for tests,
    demos and benchmarks. Use as a context manager, or call start() / stop(). `workers`,
    `threads`, `solo_threads`: as `search_plan`; by default one worker with one thread and no solo
    lane, as it shares its process with other work (a trainer's retriever on loopback): a lone
    query's second thread would spin on a core the trainer uses."""

    def __init__(
        self,
        retriever_or_index_dir: Retriever | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 64,
        max_batch_chars: int = 8192,
        max_wait_ms: float = 5.0,
        max_delay_ms: float = 20.0,
        token: str | None = None,
        batching: bool = True,
        device: str | None = None,
        limits: Limits | None = None,
        startup_timeout: float = 60.0,
        header_timeout: float = HEADER_TIMEOUT_S,
        keep_alive: float = KEEP_ALIVE_S,
        max_connections: int | None = None,
        body_timeout: float = 30.0,
        public_docs: bool = False,
        workers: int | None = 1,
        threads: int | None = 1,
        solo_threads: int | None = 1,
    ) -> None:
        self._source = retriever_or_index_dir
        self._plan_kw: dict[str, int | None] = dict(workers=workers, threads=threads, solo_threads=solo_threads)
        self.host = host
        self.port = port
        self._app_kw: dict[str, Any] = dict(
            max_batch_size=max_batch_size,
            max_batch_chars=max_batch_chars,
            max_wait_ms=max_wait_ms,
            max_delay_ms=max_delay_ms,
            token=token,
            batching=batching,
            limits=limits,
            body_timeout=body_timeout,
            public_docs=public_docs,
        )
        self._conn_kw: dict[str, Any] = dict(
            header_timeout=header_timeout, keep_alive=keep_alive, max_connections=max_connections
        )
        self.device = device
        self.startup_timeout = startup_timeout
        self.retriever: Retriever | None = None
        self._owns_retriever = False
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> BackgroundServer:
        """Loads the index if given a directory, binds, and returns once the server accepts requests."""
        import uvicorn

        if self._thread is not None:
            return self
        if isinstance(self._source, (str, Path)):
            from pvpo.retriever.index import load_retriever

            self.retriever = load_retriever(self._source, device=self.device)
            self._owns_retriever = True
        else:
            self.retriever = self._source
        app = create_app(self.retriever, **self._app_kw, plan=search_plan(self.retriever, **self._plan_kw))
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self.port))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn_config(app, **self._conn_kw))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"retriever-server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"retriever server on {self.url} failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Shuts the server down and waits for its thread; closes an index it loaded itself."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._owns_retriever and self.retriever is not None:
            self.retriever.close()
            self.retriever = None
            self._owns_retriever = False
        self._server = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
