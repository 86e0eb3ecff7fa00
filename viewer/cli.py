"""`pvpo view`: one evaluation folder, two side by side, or a training run as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pvpo.user_errors import request_traceback

DEFAULT_OUT = Path("pvpo-view.html")


def view_cmd(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="An evaluation folder (pvpo eval --out, or one dataset's folder), a FlashRAG predictions file, or a "
            "training run dir; two evaluation folders to compare them question by question (A then B)",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help=f"Write the page here (default: {DEFAULT_OUT} in the current folder; with --serve, no file unless given)",
        ),
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve the page on 127.0.0.1 until Ctrl-C instead of only writing it")
    ] = False,
    port: Annotated[int, typer.Option(help="--serve's port on 127.0.0.1; 0 = a free one")] = 0,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace an existing --out file (never a file a run or evaluation wrote)"),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Full tracebacks")] = False,
) -> None:
    """What the agent did: each episode's searches, passages (a mark where a golden answer is), answer and
    scores, with filters and search; `pvpo view A B` pairs two evaluations by question and shows which flipped;
    a run dir shows the episodes each step sampled, its groups' advantages and the curves. The page is one
    self-contained HTML file (opens from file://, fetches nothing)."""
    from pvpo.owned import check_output_file
    from pvpo.viewer.page import build_page, save_page
    from pvpo.viewer.sources import ViewError

    if debug:
        request_traceback()
    if not 1 <= len(paths) <= 2:
        raise ViewError(f"pvpo view takes one folder, or two evaluation folders to compare; got {len(paths)}")
    if not 0 <= port <= 65535:
        raise ViewError(f"--port {port}: give a port from 0 (a free one) to 65535")
    target = out or DEFAULT_OUT
    if not serve or out is not None:  # refused before anything is read (`pvpo.owned`: a run's files are never replaced)
        check_output_file(target, "--out", overwrite=overwrite, reads=[p for p in paths if p.is_file()])
    page = build_page(paths)
    if not serve or out is not None:
        written = save_page(page, target)
        typer.echo(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB): open {written.resolve().as_uri()}")
    if serve:
        from pvpo.viewer.serve import PageServer

        server = PageServer(page, port)
        typer.echo(f"serving on {server.url} (loopback only); Ctrl-C to stop")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.httpd.server_close()


def register(app: typer.Typer) -> None:
    """Add `view` to the `pvpo` CLI."""
    app.command("view")(view_cmd)
