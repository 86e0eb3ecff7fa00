"""Known user mistakes (a bad path, a bad value, an unreachable server) and faults of the machine
(a full disk, a read-only file system, a damaged file, a folder another process writes, SIGTERM
or Ctrl-C) as one line naming the cause and the fix, instead of a traceback; `pvpo --debug ...`
keeps the traceback. A command adds where it stopped and how to go on with `add_note`."""

from __future__ import annotations

import errno
import signal
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from pvpo.secrets import mask_exception, mask_url

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


# what an OS fault means and what to do, by errno
_OS_FAULTS = {
    errno.ENOSPC: ("no space left on the device", "free space on that disk, or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or write elsewhere"),
    errno.EROFS: ("read-only file system", "write to a writable folder, or remount that one read-write"),
    errno.EACCES: ("permission denied", "check the owner and mode of the file and its folder, or write elsewhere"),
    errno.EPERM: ("operation not permitted", "check the owner and mode of the file and its folder, or write elsewhere"),
    errno.EIO: ("input/output error", "the disk may be failing: check it (dmesg), then run again"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter name (at most 255 bytes per name on most file systems)"),
    errno.ELOOP: (
        "too many levels of symbolic links (a symlink loop)",
        "fix or remove the link, or give a real folder",
    ),
    errno.EBUSY: ("device or resource busy (a mount point?)", "give a folder inside it, or another folder"),
    errno.EXDEV: ("on another file system than its folder", "give a folder on one file system"),
    errno.ENOTDIR: ("not a folder", "check the path: a part of it is a file"),
    errno.EEXIST: ("already exists", "move it away, or give another path"),
}


def add_note(err: BaseException, note: str) -> None:
    """Add `note` to `err` (where the command stopped, how to go on): printed after the fix of its
    one-line error, and in its traceback under --debug. `BaseException.add_note` from Python 3.11,
    its attribute on 3.10."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:
        err.__notes__ = [*getattr(err, "__notes__", []), note]  # type: ignore[attr-defined]


def _notes(err: BaseException) -> str:
    """What the command that failed added about where it stopped (`add_note`), as one clause."""
    return "; ".join(getattr(err, "__notes__", []))


def os_fault(err: OSError) -> str | None:
    """`error: file: cause` and `fix: ...` for a fault of the file system (full disk, read-only,
    permission denied, I/O error), None for another OSError."""
    fault = _OS_FAULTS.get(err.errno or 0)
    if fault is None:
        return None
    cause, fix = fault
    where = f"{err.filename}: " if err.filename else ""
    notes = _notes(err)
    return f"error: {where}{cause}\n  fix: {fix}{'; ' + notes if notes else ''}"


def describe_stop(err: KeyboardInterrupt) -> tuple[str, int]:
    """The line a command stopped by SIGINT or SIGTERM ends with (what its command noted about
    where it stopped and how to go on), and its exit status (128 + the signal's number)."""
    signum = getattr(err, "signum", signal.SIGINT)
    notes = _notes(err)
    return f"stopped by {signal.Signals(signum).name}{': ' + notes if notes else ''}", 128 + int(signum)


def describe(err: BaseException) -> str | None:
    """`error: cause` (and, where one is known, `fix: ...` on a second line) for a user mistake;
    None for anything else, which should keep its traceback."""
    if _is_instance(err, "pvpo.retriever.client", "RetrieverError"):
        code = getattr(err, "status_code", None)
        fix = getattr(err, "fix", None)  # what the client knew to do (a reply of the wrong shape)
        if fix is None and code in (401, 403):
            fix = "check the token (--token / PVPO_RETRIEVER_TOKEN / retriever.token)"
        elif fix is None and isinstance(code, int) and 400 <= code < 500:
            fix = "the server refused the request itself (the reason is above): check what was asked of it"
        elif fix is None:
            fix = "is the server running? start one with `pvpo retriever serve --index DIR`, or give the right --url / retriever.url"
        return f"error: {mask_url(str(err))}\n  fix: {fix}"
    if _is_instance(err, "httpx", "TransportError") or isinstance(err, ConnectionError):
        return (
            f"error: cannot reach a server: {type(err).__name__}: {mask_url(str(err))}\n"
            "  fix: check the URL and that the server is running"
        )
    if _is_instance(err, "pvpo.locks", "FolderInUse"):
        pid = getattr(err, "pid", None)
        stop = f"stop it (kill {pid}; a killed process frees the folder at once)" if pid else "stop it"
        return f"error: {err}\n  fix: wait for that process to end, or {stop}; or write into another folder"
    if isinstance(err, OSError) and (message := os_fault(err)) is not None:
        return message
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
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM within `pvpo.signals.stop_on_signals`
            if ctx.params.get("debug") or _traceback_requested:
                raise
            line, status = describe_stop(err)
            typer.echo(line, err=True)
            ctx.exit(status)
        except Exception as err:
            if ctx.params.get("debug") or _traceback_requested:
                mask_exception(err)  # the traceback, without a URL's credentials
                raise
            message = describe(err)
            if message is None:
                raise
            typer.echo(  # a URL's credentials in any message are masked (`pvpo.secrets`)
                mask_url(f"{message}\n  (pvpo --debug {ctx.invoked_subcommand or '...'} ... shows the traceback)"),
                err=True,
            )
            ctx.exit(USER_ERROR_EXIT)
