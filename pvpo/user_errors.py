"""Known user mistakes (a bad path, a bad value, an unreachable server) as one line naming the
cause and the fix, instead of a traceback; `pvpo --debug ...` keeps the traceback."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

# exit status of a refused command (as a bad option, click's usage error)
USER_ERROR_EXIT = 2

_traceback_requested = False


def request_traceback() -> None:
    """Keep the traceback of the next error (a subcommand's own `--debug`, e.g. `pvpo eval --debug`,
    means what the root's `pvpo --debug` means)."""
    global _traceback_requested
    _traceback_requested = True


def _is_instance(err: BaseException, module: str, name: str) -> bool:
    """isinstance against a class of a module only if that module is loaded (an error of it can
    only exist then), so this file imports nothing heavy."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return isinstance(cls, type) and isinstance(err, cls)


def describe(err: BaseException) -> str | None:
    """`error: cause` (and, where one is known, `fix: ...` on a second line) for a user mistake;
    None for anything else, which should keep its traceback."""
    if _is_instance(err, "pvpo.retriever.client", "RetrieverError"):
        code = getattr(err, "status_code", None)
        fix = (
            "check the token (--token / PVPO_RETRIEVER_TOKEN / retriever.token)"
            if code in (401, 403)
            else "is the server running? start one with `pvpo retriever serve --index DIR`, or give the right --url / retriever.url"
        )
        return f"error: {err}\n  fix: {fix}"
    if _is_instance(err, "httpx", "TransportError") or isinstance(err, ConnectionError):
        return (
            f"error: cannot reach a server: {type(err).__name__}: {err}\n"
            "  fix: check the URL and that the server is running"
        )
    if isinstance(err, FileNotFoundError | NotADirectoryError | IsADirectoryError | PermissionError):
        what = f"{err.strerror}: {err.filename}" if err.filename else str(err)
        return f"error: {what}\n  fix: check the path"
    if _is_instance(err, "pvpo.trainer.rollout.openai_client", "OpenAIError"):
        return f"error: {err}\n  fix: check the endpoint's URL, model name and key"
    if isinstance(err, ModuleNotFoundError | ImportError):  # an optional dependency (the message names it)
        return f"error: {err}"
    if isinstance(err, ValueError):  # bad input named by the code that refused it (ConfigError included)
        return f"error: {err}"
    return None


class UserErrorGroup(TyperGroup):
    """The root command group: a user mistake raised by any subcommand ends with `describe`'s lines
    on stderr and exit status 2, unless the root `--debug` option asks for the traceback."""

    # ctx is typer's vendored click Context (typer >= 0.2x ships its own click as a private module)
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as err:
            if ctx.params.get("debug") or _traceback_requested:
                raise
            message = describe(err)
            if message is None:
                raise
            typer.echo(
                f"{message}\n  (pvpo --debug {ctx.invoked_subcommand or '...'} ... shows the traceback)", err=True
            )
            ctx.exit(USER_ERROR_EXIT)
