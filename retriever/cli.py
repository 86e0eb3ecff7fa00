"""`pvpo retriever ...`: build an index, link a prebuilt one, serve it, query a server."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import typer

ENCODER_BACKEND_HELP = (
    "torch, onnx, onnx-int8 or openvino (CPU; exported once to ~/.cache/pvpo/encoders). "
    "Default: $PVPO_ENCODER_BACKEND, else the measured CPU default (docs/benchmarks/retriever.md, encoder backends); "
    "torch on GPU."
)


ENCODER_DTYPE_HELP = (
    "encoder dtype: float32, float16, bfloat16, or auto (bfloat16 where the CPU computes it natively, float32 "
    "on other CPUs, float16 on GPU); default: float16 on GPU, float32 on CPU. Backend torch computes every dtype, "
    "openvino float32 and bfloat16 (on an AMX CPU 1.7x float32's served q/s at 32-64 clients, a lone query slower), "
    "the others float32."
)


def _encoder_option(check_name: str) -> Callable[[str | None], str | None]:
    """A typer callback running pvpo.retriever.encoder's `check_name` on a given value (imported
    when an option is given, so `--help` stays light); its ValueError becomes a usage error."""

    def callback(value: str | None) -> str | None:
        if value is not None:
            from pvpo.retriever import encoder

            try:
                getattr(encoder, check_name)(value)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        return value

    return callback


_dtype_option = _encoder_option("check_dtype")
_backend_option = _encoder_option("check_backend")


retriever_app = typer.Typer(
    name="retriever", help="Build, serve and query the passage retriever.", no_args_is_help=True, add_completion=False
)


@retriever_app.command()
def build(
    corpus: Path = typer.Option(
        ...,
        "--corpus",
        exists=True,
        dir_okay=False,
        help="Corpus file: jsonl {id, contents} / {id, title, text}, a JSON list of {title, text}, "
        "or a JSON object title -> sentences (HotpotQA).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Index directory to write (re-run to resume encoding); new, empty, or a build of ours."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace --out even if it holds other files (or start a build of ours afresh); the "
        "old contents stay until the new index is built.",
    ),
    model: str | None = typer.Option(
        None, "--model", help="sentence-transformers model (default: packaged all-MiniLM-L6-v2)."
    ),
    index_type: str = typer.Option(
        "Flat",
        "--index-type",
        help="FAISS index_factory string (Flat, HNSW32, IVF4096,PQ64, ...), bm25, or hybrid[:FACTORY] (dense + bm25 fused).",
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", min=1, help="Passages per encoder batch (default: 32 on CPU, 256 on GPU)."
    ),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when present)."),
    keep_embeddings: bool = typer.Option(
        True, "--keep-embeddings/--drop-embeddings", help="Keep the encoded chunks (to re-index with another type)."
    ),
    rerank_depth: int = typer.Option(
        0,
        "--rerank-depth",
        min=0,
        help="Keep the vectors in fp16 beside the index (memory-mapped at serve time) and "
        "re-score this many candidates exactly; 0 = off. For compressed types, e.g. "
        "--index-type IVF65536,PQ64 --rerank-depth 100 (wiki-18 on one GPU).",
    ),
    nprobe: int | None = typer.Option(
        None, "--nprobe", min=1, help="IVF lists visited per query, stored in meta.json (default 32)."
    ),
    from_faiss_index: Path | None = typer.Option(
        None,
        "--from-faiss-index",
        exists=True,
        dir_okay=False,
        help="Take the vectors from this prebuilt flat index (e.g. Search-R1's "
        "e5_Flat.index, memory-mapped) instead of encoding the corpus "
        "(jsonl, same row order); --model then names the encoder it was "
        "built with (default intfloat/e5-base-v2).",
    ),
    encoder_backend: str | None = typer.Option(
        None, "--encoder-backend", callback=_backend_option, help=ENCODER_BACKEND_HELP
    ),
    hybrid_weights: str = typer.Option(
        "1,1", "--hybrid-weights", help="With --index-type hybrid[:FACTORY]: dense,bm25 weights of the rank fusion."
    ),
    encoder_dtype: str | None = typer.Option(None, "--encoder-dtype", callback=_dtype_option, help=ENCODER_DTYPE_HELP),
) -> None:
    """Encode a corpus (or re-index a prebuilt flat index's vectors) and build its index directory."""
    from pvpo.locks import folder_lock
    from pvpo.retriever.build import build_index
    from pvpo.retriever.encoder import set_default_backend, set_default_dtype
    from pvpo.retriever.index import read_meta
    from pvpo.retriever.outdir import build_into, checked_out

    set_default_backend(encoder_backend)
    set_default_dtype(encoder_dtype)
    hybrid = index_type.lower().split(":", 1)[0] == "hybrid"  # dense (FAISS type after the colon) + BM25, fused
    if hybrid:
        try:
            weights = [float(w) for w in hybrid_weights.split(",")]
        except ValueError:
            raise typer.BadParameter(f"--hybrid-weights {hybrid_weights!r}: give two numbers, e.g. 1,0.5") from None
    params = None if nprobe is None else {"nprobe": nprobe}
    # one build at a time per folder: a second one would mix its files into the first's and report its count
    with folder_lock(checked_out(out), "pvpo retriever build"):
        source = from_faiss_index or corpus
        with build_into(out, overwrite=overwrite, inputs=[corpus, from_faiss_index], source=source) as target:
            if hybrid:
                from pvpo.retriever.hybrid import build_hybrid

                build_hybrid(
                    corpus,
                    target,
                    dense_index_type=index_type.partition(":")[2] or "Flat",
                    weights=weights,
                    model=model,
                    batch_size=batch_size,
                    device=device,
                    keep_embeddings=keep_embeddings,
                    show_progress=True,
                )
            elif from_faiss_index is not None:  # re-index a prebuilt flat index's vectors: nothing is encoded
                from pvpo.retriever.build import reindex_prebuilt

                reindex_prebuilt(
                    from_faiss_index,
                    corpus,
                    target,
                    index_type=index_type,
                    model=model or "intfloat/e5-base-v2",
                    rerank_depth=rerank_depth,
                    search_params=params,
                )
            else:
                build_index(
                    corpus,
                    target,
                    model=model,
                    index_type=index_type,
                    batch_size=batch_size,
                    device=device,
                    keep_embeddings=keep_embeddings,
                    show_progress=True,
                    rerank_depth=rerank_depth,
                    search_params=params,
                )
        meta = read_meta(out)
    if hybrid:
        typer.echo(f"built hybrid index (dense + bm25) of {meta['size']} passages in {out}")
    else:
        typer.echo(f"built {meta['index_type']} index of {meta['size']} passages in {out} ({meta['build_seconds']} s)")


@retriever_app.command("link")
def link(
    index_file: Path = typer.Option(
        ..., "--faiss-index", exists=True, dir_okay=False, help="Prebuilt FAISS index, e.g. Search-R1's e5_Flat.index."
    ),
    corpus: Path = typer.Option(
        ...,
        "--corpus",
        exists=True,
        dir_okay=False,
        help="Its corpus, same row order (jsonl is used in place; other formats are converted).",
    ),
    out: Path = typer.Option(..., "--out", help="Index directory to create (nothing is copied)."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace --out even if it holds other files (kept until the link is made)."
    ),
    model: str = typer.Option("intfloat/e5-base-v2", "--model", help="The encoder the index was built with."),
    mmap: bool | None = typer.Option(
        None,
        "--mmap/--no-mmap",
        help="Memory-map the index where FAISS can, or read it into memory at start (default: mapped on CPU, read "
        "for a GPU).",
    ),
) -> None:
    """Use a prebuilt Search-R1 / FlashRAG index with its corpus, without re-encoding."""
    from pvpo.locks import folder_lock
    from pvpo.retriever.build import link_prebuilt
    from pvpo.retriever.outdir import build_into, checked_out

    with folder_lock(checked_out(out), "pvpo retriever link"):
        with build_into(out, overwrite=overwrite, inputs=[index_file, corpus], source=index_file) as target:
            link_prebuilt(index_file, corpus, target, model=model, mmap=mmap)
    typer.echo(f"linked {index_file} + {corpus} as {out}")


def _non_empty_token(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise typer.BadParameter(
            "the token is empty: an empty bearer would let every request in; give a secret or leave it out"
        )
    return value


@retriever_app.command()
def serve(
    index: Path = typer.Option(..., "--index", exists=True, file_okay=False, help="Index directory."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (0.0.0.0 exposes it to the network)."),
    port: int = typer.Option(8000, "--port"),
    device: str | None = typer.Option(None, "--device"),
    max_batch_size: int = typer.Option(64, "--max-batch-size", min=1, help="Queries per coalesced batch."),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", min=0.0, help="A batch closes once no request arrived for this long."
    ),
    max_delay_ms: float = typer.Option(
        20.0, "--max-delay-ms", min=0.0, help="...or this long after its first request, whichever comes first."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="CPU threads a search worker computes with: an exported encoder's (default 1, a worker a core; a lone "
        "query uses every core), or torch's for the whole process (default cores - 1, leaving one to HTTP).",
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Batches searched at once (default: cores / --threads with an exported encoder on CPU, else 1).",
    ),
    solo_threads: int | None = typer.Option(
        None,
        "--solo-threads",
        min=1,
        help="CPU threads for a lone query, with an exported encoder on CPU (default: every core; 1 on a machine "
        "busy with other jobs, where a second thread spins waiting for a core).",
    ),
    max_batch_chars: int = typer.Option(
        8192,
        "--max-batch-chars",
        min=1,
        help="Padded characters per batch: the encoder's length-sorted groups, each counted as its "
        "queries x its widest query's length (capped at 1536, +32 each). Bounds how long one batch, "
        "and so a small request waiting behind it, can take (8192: 64 typical questions or 5 long queries).",
    ),
    no_batching: bool = typer.Option(False, "--no-batching", help="Serve each request on its own."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="PVPO_RETRIEVER_TOKEN",
        callback=_non_empty_token,
        help="Require 'Authorization: Bearer TOKEN' on every route but /health (the API docs too, "
        "unless --public-docs).",
    ),
    public_docs: bool = typer.Option(
        False, "--public-docs", help="With --token, serve /docs, /redoc and /openapi.json without it."
    ),
    header_timeout: float | None = typer.Option(
        None,
        "--header-timeout",
        min=0.1,
        help="Close a connection whose request headers are not complete in this many seconds (default 10).",
    ),
    keep_alive: float | None = typer.Option(
        None, "--keep-alive", min=0.1, help="Close a connection idle this long between requests (default 5)."
    ),
    max_connections: int | None = typer.Option(
        None,
        "--max-connections",
        min=16,
        help="Open connections kept (the longest-idle is closed past it); default 4096, capped by the open-file limit.",
    ),
    log_level: str = typer.Option("info", "--log-level"),
    encoder_backend: str | None = typer.Option(
        None, "--encoder-backend", callback=_backend_option, help=ENCODER_BACKEND_HELP
    ),
    encoder_dtype: str | None = typer.Option(None, "--encoder-dtype", callback=_dtype_option, help=ENCODER_DTYPE_HELP),
    replicas: int = typer.Option(
        1,
        "--replicas",
        min=1,
        help="Server processes, on ports PORT..PORT+K-1 (each loads the index; give the "
        "client every URL). --threads is then per replica (default: cores-1 shared out).",
    ),
) -> None:
    """Serve an index over HTTP (Search-R1 /retrieve, /health, /info)."""
    if replicas > 1:
        import os

        from pvpo.retriever.replicas import ReplicaSet, replica_threads

        args = [
            "--index",
            str(index),
            "--max-batch-size",
            str(max_batch_size),
            "--max-wait-ms",
            str(max_wait_ms),
            "--max-delay-ms",
            str(max_delay_ms),
            "--threads",
            str(replica_threads(replicas, threads)),
            "--workers",
            str(workers or 1),  # the replicas share the cores: one worker each, no lone query on all of them
            "--solo-threads",
            str(solo_threads or replica_threads(replicas, threads)),
            "--max-batch-chars",
            str(max_batch_chars),
            "--log-level",
            log_level,
        ]
        args += ["--device", device] if device else []
        args += ["--no-batching"] if no_batching else []
        args += ["--public-docs"] if public_docs else []
        args += ["--encoder-backend", encoder_backend] if encoder_backend else []
        args += ["--encoder-dtype", encoder_dtype] if encoder_dtype else []
        args += ["--header-timeout", str(header_timeout)] if header_timeout is not None else []
        args += ["--keep-alive", str(keep_alive)] if keep_alive is not None else []
        args += ["--max-connections", str(max_connections)] if max_connections is not None else []
        env = os.environ | ({"PVPO_RETRIEVER_TOKEN": token} if token else {})  # not on the command line (ps)
        replica_set = ReplicaSet(args, host=host, port=port, replicas=replicas, env=env).start()
        urls = " ".join(f"--url {u}" for u in replica_set.urls)
        typer.echo(
            f"{replicas} replicas (pids {' '.join(str(p.pid) for p in replica_set.procs)}) serving; "
            f"query with: pvpo retriever query {urls} ..."
        )
        raise typer.Exit(replica_set.wait())
    import uvicorn

    from pvpo.retriever.connections import check_port_free, open_file_limit, uvicorn_config
    from pvpo.retriever.encoder import set_default_backend, set_default_dtype
    from pvpo.retriever.index import load_retriever
    from pvpo.retriever.server import create_app, search_plan, set_torch_threads

    check_port_free(host, port)  # before the index loads, which can take minutes
    set_default_backend(encoder_backend)
    set_default_dtype(encoder_dtype)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # faiss-cpu's wheel ships one build (faiss.swigfaiss); its loader first tries CPU-specific ones
    # and logs each missing one at INFO as a ModuleNotFoundError, which reads like a failure
    logging.getLogger("faiss.loader").setLevel(max(logging.WARNING, logging.getLogger().level))
    open_file_limit(raise_soft=True)
    retriever = load_retriever(index, device=device)
    plan = search_plan(retriever, workers=workers, threads=threads, solo_threads=solo_threads)
    if plan.worker_threads is None and "torch" in sys.modules:  # torch encodes: its thread count is process-wide
        set_torch_threads(threads)
    app = create_app(
        retriever,
        max_batch_size=max_batch_size,
        max_batch_chars=max_batch_chars,
        max_wait_ms=max_wait_ms,
        max_delay_ms=max_delay_ms,
        batching=not no_batching,
        token=token,
        public_docs=public_docs,
        plan=plan,
    )
    config = uvicorn_config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        header_timeout=header_timeout,
        keep_alive=keep_alive,
        max_connections=max_connections,
    )
    typer.echo(
        f"serving {json.dumps(retriever.info())} on http://{host}:{port} "
        f"(max {config.http.max_connections} connections)"
    )
    uvicorn.Server(config).run()


@retriever_app.command()
def query(
    queries: list[str] = typer.Argument(..., help="One or more queries."),
    url: list[str] = typer.Option(["http://127.0.0.1:8000"], "--url", help="Server URL (repeat for several)."),
    topk: int = typer.Option(3, "--topk", min=1),
    token: str | None = typer.Option(None, "--token", envvar="PVPO_RETRIEVER_TOKEN"),
    retries: int = typer.Option(
        8, "--retries", min=0, help="Retries of a failed request, with backoff (8: about 18 s)."
    ),
) -> None:
    """Ask a running server and print the passages."""
    from pvpo.retriever.client import RetrieverClient
    from pvpo.secrets import check_url

    for u in url:
        check_url(u, "--url")
    with RetrieverClient(url, topk=topk, token=token, retries=retries) as client:
        for q, passages in zip(queries, client.search(queries)):
            typer.echo(f"# {q}")
            for p in passages:
                typer.echo(f"  {p.score:.4f}  [{p.id}] {p.title}: {p.text[:100]}")


def register(app: typer.Typer) -> None:
    """Adds `pvpo retriever ...` to the main CLI."""
    app.add_typer(retriever_app, name="retriever")
