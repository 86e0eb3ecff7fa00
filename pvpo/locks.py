"""One writer per folder: an OS file lock (`fcntl.flock`) that a run dir (`pvpo train`, `pvpo
demo`) or an evaluation folder (`pvpo eval`) is held by while a process writes it, so a second
process writing the same files is refused instead of mixing its steps or answers into them.

The lock file sits beside the folder (`.<name>.pvpo-lock` in its parent), not inside it: an
`--overwrite` moves the folder aside and the lock must stay where the next writer looks for it,
and a folder's contents stay what the run wrote. The kernel drops the lock when its process ends,
however it ends (SIGKILL and a crash included), so a killed run never blocks its own `--resume`;
the file itself stays, and holds the PID and command of its last holder, which the refusal names.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_SUFFIX = ".pvpo-lock"

# the locks this process holds (lock file -> nesting depth): `pvpo demo` holds its run dir and
# calls code that takes the same lock again; a second flock on another descriptor of the same file
# would refuse this very process
_held: dict[Path, int] = {}


class FolderInUse(Exception):
    """Another live process holds the folder's lock; the message names it and what to do."""

    def __init__(self, folder: Path, holder: str) -> None:
        self.folder, self.holder = folder, holder
        first = holder.split(",")[0].removeprefix("PID ").strip()
        self.pid: int | None = int(first) if first.isdigit() else None
        super().__init__(
            f"{folder} is in use by another pvpo process ({holder}): only one process may write it at a time"
        )


# the longest file name most file systems take (ext4, xfs, btrfs, tmpfs: 255 bytes)
_NAME_MAX = 255


def lock_path(folder: str | Path) -> Path:
    """The lock file of `folder`: `.<name>.pvpo-lock` beside it (symlinks resolved, so two paths
    to one folder share one lock); a name too long for a file name of its own (a folder name of
    over 244 bytes) is shortened and told apart by a hash of it. A symlink loop is an
    OSError(ELOOP) naming `folder`."""
    try:
        folder = Path(folder).resolve()
    except RuntimeError:  # a symlink loop, before Python 3.13 (which raises OSError)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(folder)) from None
    name = folder.name or "root"
    if len(f".{name}{LOCK_SUFFIX}".encode()) > _NAME_MAX:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        room = _NAME_MAX - len(f".~{digest}{LOCK_SUFFIX}".encode())
        head = name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
        name = f"{head}~{digest}"
    return folder.parent / f".{name}{LOCK_SUFFIX}"


def is_lock_file(name: str) -> bool:
    """Whether a folder entry named `name` is one of these lock files (not a user's file)."""
    return name.startswith(".") and name.endswith(LOCK_SUFFIX)


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (`PID 123, pvpo train`). The holder writes right
    after it locks, so an empty file is read again for a moment."""
    for _ in range(20):
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        if text:
            return text
        time.sleep(0.01)
    return "PID unknown"


@contextlib.contextmanager
def folder_lock(folder: str | Path, command: str) -> Iterator[None]:
    """Hold `folder`'s lock for the block, without waiting: raises FolderInUse naming the holder's
    PID when another process holds it. `command` (e.g. `pvpo train`) is recorded for that
    message. Re-entrant within one process."""
    path = lock_path(folder)
    if path in _held:
        _held[path] += 1
        try:
            yield
        finally:
            _held[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUse(Path(folder), _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()}, {command}\n".encode(), 0)
        _held[path] = 1
        try:
            yield
        finally:
            del _held[path]
            with contextlib.suppress(OSError):  # a later reader finds no stale holder while the lock is free
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
