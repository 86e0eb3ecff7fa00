"""`pvpo demo`: the end-to-end recipe around a Trainer (the synthetic world, its index served on
loopback, the run, its plots and summary table). Heavy imports stay inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pvpo.trainer.cli import load_cli_config, preflight_config, run_dir_session


def demo_cmd(
    overrides: Annotated[list[str] | None, typer.Argument(help="key.sub=value overrides of the demo config")] = None,
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-c",
            help="YAML config file or shipped preset name (default: the demo preset shipped with the package)",
        ),
    ] = Path("demo"),
    run_dir: Annotated[Path, typer.Option("--run-dir", help="output folder")] = Path("runs/demo"),
    fresh: Annotated[bool, typer.Option("--fresh/--resume", help="start over, or continue a previous demo run")] = True,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="run in a --run-dir that holds files a run does not write (they are kept)",
        ),
    ] = False,
) -> None:
    """End to end on CPU: synthetic world, MiniLM index served on loopback, tiny policy, warm start,
    PVPO training, held-out accuracy before/after, metrics + reward-curve plot + summary table."""
    cfg = load_cli_config(
        config, list(overrides or [])
    )  # a missing file or preset is an error, never the built-in defaults
    preflight_config(cfg, resume=not fresh)  # before the run dir is touched
    from pvpo.recipes.demo import run_demo

    with run_dir_session(run_dir, "pvpo demo"):
        summary = run_demo(cfg, run_dir, fresh=fresh, overwrite=overwrite, preflighted=True)
    typer.echo(summary)


def register(app: typer.Typer) -> None:
    """Add `demo` to the `pvpo` CLI."""
    app.command("demo")(demo_cmd)
