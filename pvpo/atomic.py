"""Crash-safe files: atomic replacement (a reader sees the old file or the new one, never half of
one), fsynced JSON-lines appends, a JSON-lines reader that survives a write torn by a crash, and
the errors a damaged file or a full disk raise (one line each at the CLI: `pvpo.user_errors`).

Every component writes its state through these (run dirs, checkpoints, anchors, GT caches, value
models, evaluation predictions and metrics), so "nothing lost on a crash" is argued once, here.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# below this many free bytes, a write that failed inside a library (which reports no errno) failed
# because the disk filled up
_NEARLY_FULL = 1 << 20


class DamagedFileError(ValueError):
    """A file that is there but cannot be read as what it should be (truncated, corrupted, not the
    format its name says). The message names the file, the cause and what to do; a ValueError, so
    `pvpo` prints it as one line with exit status 2."""

    def __init__(self, path: str | Path, cause: str, fix: str) -> None:
        self.filename, self.cause, self.fix = str(path), cause, fix
        super().__init__(f"{path} is damaged ({cause}): {fix}")


def read_json(path: str | Path, *, fix: str) -> Any:
    """The JSON document in `path`; a file that is not JSON is a DamagedFileError naming it, with
    `fix` as what to do."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes())
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError
        raise DamagedFileError(path, f"not JSON: {e}", fix) from None


def _free_bytes(path: Path) -> int:
    """Bytes this process may still write on `path`'s file system (root may use the reserved blocks)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def disk_full_error(err: BaseException, path: str | Path) -> OSError | None:
    """`OSError(ENOSPC)` naming `path` when `err`, raised by a library writing under `path`, was the
    disk filling up (torch's zip writer says only `unexpected pos ...`, safetensors `os error 28`);
    None when it was something else. Call it before removing what the failed write left."""
    if isinstance(err, OSError) or not isinstance(err, Exception):
        return None
    text = str(err)
    full = "No space left" in text or "os error 28" in text or "StorageFull" in text
    try:
        full = full or _free_bytes(Path(path)) < _NEARLY_FULL
    except OSError:
        pass
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) if full else None


def replaced_path(path: str | Path) -> Path:
    """Where a folder being replaced (`--overwrite` of a run or an evaluation) waits, hidden beside
    it, until its replacement has written something worth keeping."""
    path = Path(path)
    return path.parent / f".{path.name}.pvpo-replaced"


def _umask() -> int:
    """The process's umask, read from /proc/self/status where Linux gives it: setting it to read it
    (`os.umask`) would, for that moment, let a file another thread creates be written 0666."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _plain_file_mode(path: str | Path) -> int:
    """The permission bits `open(path, "w")` would leave `path` with: an existing file's own, else
    0666 less the umask (0644 under the usual 022)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary file in the same folder, fsynced, then
    renamed over `path`. A crash leaves the old file or the new one; the temporary file is removed
    on failure. The file gets the mode a plain `open` would give it (`_plain_file_mode`), not the
    temporary file's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), _plain_file_mode(path))
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = None, sort_keys: bool = False) -> Path:
    """`data` as JSON (non-ASCII kept as is), written atomically (`atomic_write_text`)."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, ensure_ascii=False)
    return atomic_write_text(path, text + ("\n" if indent is not None else ""))


def atomic_write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """One JSON object per line, written atomically (a rewrite of a whole JSON-lines file)."""
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def atomic_write_dir(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on an empty `<path>.tmp` folder, then rename it to `path` (replacing it),
    so `path` is absent, the old folder, or complete: never half written. A `write` that raises
    leaves no `.tmp` folder behind; one that failed because the disk filled up raises
    `OSError(ENOSPC)` whatever the library that wrote reported (`disk_full_error`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException as err:
        full = disk_full_error(err, path)  # before the partial files go and free the space again
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from err
        raise
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def append_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append `rows` to a JSON-lines file in one write, flushed and fsynced: a kill leaves whole
    appends or one torn last line (which `read_jsonl` drops). One small fsync per call: callers
    append a step or a batch at a time, which takes seconds."""
    blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (`[]` when it does not exist).

    A torn last line (no newline, or not JSON: a crash mid-append) is dropped with a warning, and
    with `repair` cut off the file, so the next append starts on a clean line. A line that is not
    JSON before the last is damage a crash cannot cause: a ValueError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    rows: list[dict[str, Any]] = []
    good = 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        try:
            if not line.endswith(b"\n"):
                raise ValueError("no newline at the end")
            if line.strip():
                rows.append(json.loads(line))
        except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            if not last:
                raise ValueError(
                    f"{path}:{i + 1}: not a JSON line ({e}); only a torn last line is dropped. Fix or remove that line"
                ) from None
            log.warning("%s: dropping a torn last line (%d bytes): %s", path, len(line), e)
            break
        good += len(line)
    if repair and good < len(data):
        with path.open("r+b") as f:
            f.truncate(good)
    return rows
