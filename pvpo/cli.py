"""The `pvpo` command. Each component adds its commands through a `register(app)` function in its
own `cli` module; this file only assembles them."""

from __future__ import annotations

import importlib
import importlib.util

import typer

from pvpo.progress import quiet_library_bars
from pvpo.user_errors import UserErrorGroup

app = typer.Typer(
    name="pvpo",
    help="Train and evaluate search agents for multi-hop QA: retriever, environment, rewards, PVPO trainer.",
    no_args_is_help=True,
    add_completion=False,
    cls=UserErrorGroup,
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False,
        "--debug",
        help="Show the full traceback of an error (by default a user mistake "
        "such as a bad path or an unreachable server prints one line: the cause and the fix).",
    ),
) -> None:
    """Train and evaluate search agents for multi-hop QA: retriever, environment, rewards, PVPO trainer."""
    quiet_library_bars()  # before any command imports transformers


# Component CLIs, in the order they appear in --help. A component whose cli module is not there
# yet adds nothing; one that is there but fails to import fails loudly.
_COMPONENT_CLIS = (
    "pvpo.retriever.cli",
    "pvpo.envs.cli",
    "pvpo.trainer.cli",
    "pvpo.trainer.config.cli",
    "pvpo.evaluation.cli",
    "pvpo.models_cli",
)

for _name in _COMPONENT_CLIS:
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name).register(app)

if not any(c.name == "demo" for c in app.registered_commands):

    @app.command()
    def demo() -> None:
        """End-to-end PVPO on the synthetic world (not built yet in this version)."""
        typer.echo("pvpo demo is not available yet: the trainer component has not landed.", err=True)
        raise typer.Exit(code=2)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
