"""`pvpo config keys` (every key with its default and description) and `pvpo config show` (a
resolved config as YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

config_app = typer.Typer(
    name="config",
    help="List the training config's keys, or show a resolved config.",
    no_args_is_help=True,
    add_completion=False,
)


@config_app.command("keys")
def keys_cmd(
    prefix: Annotated[str | None, typer.Argument(help="only keys starting with this, e.g. rollout or optim.lr")] = None,
) -> None:
    """Every config key with its default, type and description."""
    from pvpo.trainer.config.docs import config_keys, format_keys

    found = [
        k for k in config_keys() if prefix is None or k.key == prefix or k.key.startswith(prefix.rstrip(".") + ".")
    ]
    if not found:
        sections = sorted({k.key.split(".")[0] for k in config_keys()})
        raise ValueError(f"no config key starts with {prefix!r}; sections: {sections}")
    typer.echo(format_keys(found))


@config_app.command("show")
def show_cmd(
    overrides: Annotated[list[str] | None, typer.Argument(help="key.sub=value overrides")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML file or shipped preset name (default: the built-in defaults)"),
    ] = None,
) -> None:
    """The config `pvpo train` would run with, every key resolved, as YAML (a secret shown as ***)."""
    import yaml

    from pvpo.secrets import mask_config
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(None if config is None else resolve_config(config), list(overrides or []))
    typer.echo(yaml.safe_dump(mask_config(cfg.model_dump(mode="json")), sort_keys=False).rstrip())


def register(app: typer.Typer) -> None:
    """Add `pvpo config ...` to the `pvpo` CLI."""
    app.add_typer(config_app, name="config")
