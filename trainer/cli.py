"""`pvpo train`, and the config, pre-flight and run-dir steps every command that runs a Trainer shares. Heavy imports stay inside the commands so `pvpo --help` is fast."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from pvpo.trainer.config.schema import TrainConfig


def _preset_names() -> list[str]:
    """The shipped presets' names, for the help text, read without importing the config schema
    (`presets.available_presets` would load pydantic on every `pvpo --help`)."""
    from importlib import resources

    return sorted(
        p.name.removesuffix(".yaml") for p in resources.files("pvpo.configs").iterdir() if p.name.endswith(".yaml")
    )


def load_cli_config(config: Path | None, overrides: list[str]) -> TrainConfig:
    """The config: a file or a shipped preset's name (`demo`, `smoke`), or the defaults (None).
    A bad file, key or value raises (ConfigError / FileNotFoundError): `pvpo`'s one-line error."""
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    return load_config(None if config is None else resolve_config(config), overrides)


def preflight_config(cfg: TrainConfig, *, world_size: int | None = None, resume: bool = False) -> TrainConfig:
    """`cfg` once it passed every "can this run" check (`config.preflight`), made before the run
    dir's lock, any file, any model: one line and exit status 2 otherwise."""
    from pvpo.trainer.config.preflight import preflight

    preflight(cfg, world_size=world_size, resume=resume)
    return cfg


def default_run_dir(config: Path | None) -> Path:
    """`pvpo train`'s run dir when --run-dir is not given: `runs/train-<config's name>`, never the
    folder `pvpo demo` writes by default (`runs/demo`), so `pvpo train --config demo` and `pvpo demo`
    do not write one folder."""
    return Path("runs") / f"train-{config.stem if config else 'default'}"


@contextlib.contextmanager
def run_dir_session(run_dir: Path, command: str) -> Iterator[None]:
    """The run dir's lock held (`pvpo.locks`; under torchrun by rank 0 alone, for all ranks) before
    anything in it is read, so a second writer is refused before it reads a half-written run;
    an `--overwrite` a kill cut short undone (`resume.recover_run_dir`); SIGTERM ends the block as
    Ctrl-C does, and a second signal cannot cut the first one's clean-up (`pvpo.signals`); and a stop or a
    fault of the file system (a full disk, ...) ends the command with a line saying where the run
    stands and how to continue it."""
    from pvpo.locks import folder_lock
    from pvpo.owned import check_folder_path
    from pvpo.signals import stop_on_signals
    from pvpo.trainer.state.resume import recover_run_dir, where_stopped
    from pvpo.user_errors import add_note

    check_folder_path(run_dir, "--run-dir")  # a file, a symlink loop: one line before any lock is taken
    main = os.environ.get("RANK", "0") == "0"
    lock = folder_lock(run_dir, command) if main else contextlib.nullcontext()
    try:
        with lock, stop_on_signals():
            if main:
                recover_run_dir(run_dir)
            yield
    except (KeyboardInterrupt, OSError) as err:
        add_note(err, where_stopped(run_dir, command))
        raise


def train_cmd(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.sub=value overrides, e.g. run.steps=10 (`pvpo config keys` lists every key)"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help=f"YAML config file, or a shipped preset's name: {', '.join(_preset_names())}",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="where checkpoints and metrics go (default: runs/train-<config name>)"),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue from the run dir's latest checkpoint, with the run's "
            "own config.yaml (overrides: only keys safe to change, e.g. run.steps)",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="replace the run the run dir holds (checked first, kept until the new run's first checkpoint); "
            "files pvpo did not write there are kept",
        ),
    ] = False,
    nproc: Annotated[
        int,
        typer.Option(
            "--nproc",
            min=1,
            help="processes (GPUs) on this machine: runs this command "
            "under `torchrun --standalone --nproc_per_node N` (FSDP2)",
        ),
    ] = 1,
) -> None:
    """Train a search agent with PVPO (or a baseline estimator) per a YAML config."""
    if nproc > 1:
        import subprocess
        import sys

        if resume:
            from pvpo.trainer.parallel.checkpoint import check_resume_world

            check_resume_world(run_dir or default_run_dir(config), nproc)
        else:  # refused in this process, before torchrun starts any (and before torch is imported)
            preflight_config(load_cli_config(config, list(overrides or [])), world_size=nproc)
        from pvpo.trainer.parallel.distributed import torchrun_command

        raise typer.Exit(code=subprocess.call(torchrun_command(nproc, sys.argv[1:])))
    if resume and overwrite:
        raise ValueError("--resume and --overwrite contradict each other: pick one")
    run_dir = run_dir or default_run_dir(config)
    if config is None and not resume:
        typer.echo(
            f"no --config: training on the built-in defaults (synthetic world, tiny policy, no warm start, "
            f"run.steps=2) plus the overrides given, into {run_dir}; `pvpo config keys` lists every key. "
            "A preset: --config demo (or smoke)",
            err=True,
        )
    cfg = (
        None if resume else preflight_config(load_cli_config(config, list(overrides or [])))
    )  # before the run dir is touched
    with run_dir_session(run_dir, "pvpo train"):
        if cfg is None:  # a resume's config is the run's own, read under the run dir's lock
            from pvpo.trainer.parallel.checkpoint import check_resume_world
            from pvpo.trainer.state.resume import resume_config

            check_resume_world(run_dir, int(os.environ.get("WORLD_SIZE", "1")))
            cfg = preflight_config(resume_config(run_dir, list(overrides or []), config), resume=True)
        from pvpo.trainer.loop import train

        result = train(cfg, run_dir, resume=resume, overwrite=overwrite, preflighted=True)
    if not cfg.run.steps:
        typer.echo(f"done: the warm start alone (run.steps=0); its policy is {run_dir / 'initial_policy'}")
        return
    last = result.metrics[-1] if result.metrics else {}
    typer.echo(
        f"done: {result.steps_done} steps in {run_dir}; last reward/mean={last.get('reward/mean', float('nan')):.4f}"
    )


def register(app: typer.Typer) -> None:
    """Add `train` to the `pvpo` CLI (`pvpo demo` is a recipe: pvpo.recipes.cli)."""
    app.command("train")(train_cmd)
