"""The `pvpo` command. Each component adds its commands through a `register(app)` function in its
own `cli` module; this file only assembles them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import typer
import typer.core

from pvpo.progress import quiet_library_bars
from pvpo.signals import ignore_stop_signals, stops_end_the_process
from pvpo.user_errors import UserErrorGroup


def _flags_show_no_type() -> None:
    """A flag's help row without a value type: typer's rich help writes `<bool>` beside `--help`,
    `--resume`, ..., which take no value (click's plain help already leaves it out)."""
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or shown is None or getattr(shown, "flags_untyped", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if getattr(self, "is_flag", False) and not getattr(self, "count", False) else shown(self, ctx)

    display_type_rich.flags_untyped = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich


_flags_show_no_type()


class _Command(typer.Typer):
    """The `pvpo` app; run as the command (the console script calls it), a stop signal ends the
    process, so after one the signals stay ignored while its line is printed and the process
    ends (`pvpo.signals`). Tests invoke the app's click command, which leaves them as they were."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stops_end_the_process()
        try:
            return super().__call__(*args, **kwargs)
        finally:  # the process ends here: a late Ctrl-C must not cut into its shutdown
            ignore_stop_signals()


app = _Command(
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
    "pvpo.recipes.cli",
    "pvpo.recipes.multihop.cli",
    "pvpo.trainer.config.cli",
    "pvpo.evaluation.cli",
    "pvpo.viewer.cli",
    "pvpo.models_cli",
)


def _components(argv: list[str]) -> tuple[str, ...]:
    """The component CLIs to register: the retriever's alone for `pvpo [--debug] retriever ...`,
    so a retriever server starts without importing the environment's and the trainer's modules
    (gymnasium, the config schema: 1.5 s of its start on 2 loaded cores); all of them otherwise."""
    words = [a for a in argv[1:] if not a.startswith("-")]
    return ("pvpo.retriever.cli",) if words[:1] == ["retriever"] else _COMPONENT_CLIS


for _name in _components(sys.argv):
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
