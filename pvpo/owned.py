"""One rule for every folder pvpo writes (a training run, an evaluation's dataset folder, an
index): what pvpo may delete is what it wrote, in a folder it recorded as its own; a user's file
is never deleted, with or without `--overwrite`.

- A command that starts writing a folder records its kind in `.pvpo-folder.json` inside it
  (`claim`). A folder written before that record existed is recognised by its kind's markers
  (`FolderKind.markers`: a run's `checkpoints/latest`, an evaluation's `run.json`, an index's
  `meta.json`).
- In a folder of that kind, the entries the kind writes (`FolderKind.entries`, and the temporary
  files of their atomic writes) are pvpo's; every other entry is the user's. In any other folder
  every entry is the user's.
- `--overwrite` replaces pvpo's entries only (`replacing`): they are moved into `.pvpo-replaced/`
  inside the folder - renames on one file system, so a mount point or a read-only parent does not
  matter - and the user's stay where they are. The replaced entries are dropped only when the new
  content is worth keeping (`commit`: a run's first checkpoint, an evaluation's first answer, a
  complete index), and put back if the command fails or is stopped before.
- A user's entry bearing a name the new content writes is refused, with or without --overwrite.
- The moves run with SIGINT and SIGTERM held (`pvpo.signals.hold_signals`). A replacement that a
  SIGKILL cut short is undone by the next command on the folder (`recover`, called with the
  folder's lock held), which puts the replaced entries back and never deletes them unless the
  replacement was committed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvpo.atomic import atomic_write_json, atomic_write_text
from pvpo.signals import hold_signals

log = logging.getLogger(__name__)

RECORD = ".pvpo-folder.json"
ASIDE = ".pvpo-replaced"  # the replaced entries, until the new content is committed
DROPPING = ".pvpo-replaced.dropping"  # committed: being deleted
MOVED = "moved.json"  # in ASIDE: the names moved there, written before the first move
STAGING = ".pvpo-building"  # new content built whole before it is swapped in (an index)
_OURS_ALWAYS = (RECORD, ASIDE, DROPPING, STAGING)
# the temporary forms of an entry: atomic_write_dir's `name.tmp`, atomic_write_text's
# `.name.<random>.tmp`, a restore's `name.restore`, numpy's `name.tmp.npy`
_TEMP_SUFFIXES = (".tmp", ".restore", ".tmp.npy")


class FolderError(ValueError):
    """A folder that cannot be written as asked; the message names it, the entries in the way and
    what to do (a ValueError: `pvpo`'s one-line error, exit status 2)."""


@dataclass(frozen=True)
class FolderKind:
    """What one kind of folder holds: `name` (recorded), `noun` (for messages: "a training run"),
    the top-level `entries` it writes (exact names, and `patterns`: shell globs such as
    `step_*`), and the `markers` by which a folder of it written before the record existed is
    recognised (paths relative to the folder)."""

    name: str
    noun: str
    entries: frozenset[str]
    markers: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    looks_ours: Callable[[Path], bool] | None = None  # a finer test than a marker's presence

    def _entry(self, name: str) -> bool:
        return name in self.entries or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def is_temp(self, name: str) -> bool:
        """Whether `name` is the temporary file of an atomic write of one of the kind's entries."""
        for suffix in _TEMP_SUFFIXES:
            if name.endswith(suffix) and self._entry(name[: -len(suffix)]):
                return True
        if name.startswith(".") and name.endswith(".tmp"):  # `.name.<random>.tmp`
            base = name[1:-4].rsplit(".", 1)[0]
            return self._entry(base)
        return False

    def writes(self, name: str) -> bool:
        """Whether an entry called `name` is one this kind writes (a temporary form included)."""
        return name in _OURS_ALWAYS or self._entry(name) or self.is_temp(name)


def check_folder_path(folder: str | Path, what: str) -> Path:
    """`folder` as a path pvpo can write a folder at: refused (FolderError naming it) when it is a
    file, a symlink that leads nowhere (a loop or a dangling link), or under a file."""
    folder = Path(folder)
    try:
        folder.resolve(strict=False)
    except (RuntimeError, OSError) as e:  # RuntimeError: a symlink loop before Python 3.13
        raise FolderError(f"{what} {folder} cannot be resolved ({e}): fix the link, or give a real folder") from None
    if folder.is_symlink() and not folder.exists():
        raise FolderError(
            f"{what} {folder} is a symlink to nothing ({os.readlink(folder)}): fix it, or give another folder"
        )
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{what} {folder} is a file: give a folder")
    for parent in folder.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise FolderError(f"{what} {folder}: {parent} is a file, not a folder: give another path")
            break
    return folder


def _record_kind(folder: Path) -> str | None:
    try:
        doc = json.loads((folder / RECORD).read_bytes())
    except (OSError, ValueError):
        return None
    return doc.get("kind") if isinstance(doc, dict) else None


def is_ours(folder: str | Path, kind: FolderKind) -> bool:
    """Whether `folder` is one pvpo wrote as `kind`: its record says so, or (written before the
    record existed) it holds one of the kind's markers."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    recorded = _record_kind(folder)
    if recorded is not None:
        return recorded == kind.name
    return any((folder / m).is_file() for m in kind.markers) or (
        kind.looks_ours is not None and kind.looks_ours(folder)
    )


def entries(folder: str | Path, kind: FolderKind) -> tuple[list[str], list[str]]:
    """(pvpo's entries, the user's entries) of `folder`, each sorted; both empty when it does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return [], []
    names = sorted(p.name for p in folder.iterdir())
    if not is_ours(folder, kind):
        return [], names
    return [n for n in names if kind.writes(n)], [n for n in names if not kind.writes(n)]


def replaceable(names: Sequence[str]) -> list[str]:
    """Of pvpo's entries `names`, those a replacement moves aside: all but this module's own
    bookkeeping (the record, the replaced and staging folders)."""
    return [n for n in names if n not in _OURS_ALWAYS]


def users_entries(folder: str | Path, kind: FolderKind) -> list[str]:
    """The entries of `folder` pvpo did not write as `kind` (the user's), sorted."""
    return entries(folder, kind)[1]


def remove_temp_files(folder: str | Path, kind: FolderKind) -> list[str]:
    """Remove the temporary files that killed atomic writes of `kind`'s entries left in `folder`
    (call it with the folder's lock held: no write of ours is under way); their names."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = sorted(p.name for p in folder.iterdir() if kind.is_temp(p.name))
    for name in gone:
        _remove(folder / name)
    return gone


def shown(names: Sequence[str], most: int = 3) -> str:
    """`a, b, c and 4 more`: a few names for a message."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def claim(folder: str | Path, kind: FolderKind) -> None:
    """Create `folder` if needed and record it as `kind`'s (call it before writing anything in it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if _record_kind(folder) != kind.name:
        atomic_write_json(folder / RECORD, {"kind": kind.name, "written_by": "pvpo"})


def refuse_clashes(
    folder: Path, kind: FolderKind, users: Sequence[str], *, error: type[Exception] = FolderError
) -> None:
    """`error` (FolderError) when one of the user's entries bears a name `kind` writes: pvpo
    would write into it or replace it."""
    clash = [n for n in users if kind.writes(n)]
    if clash:
        raise error(
            f"{folder} holds {shown(clash)}, which pvpo did not write there but {kind.noun} writes: "
            "move it out of the folder, or give another folder"
        )


def recover(folder: str | Path, kind: FolderKind) -> str | None:
    """Finish or undo a replacement that was cut short (SIGKILL, a crash): a committed one is
    dropped, any other put back - the new content's entries removed, the replaced ones moved back
    - and a build left in staging removed. Only in a folder of `kind`'s (in any other these names
    are the user's). Call it with the folder's lock held. Returns what it did, for a log line, or
    None when there was nothing to do."""
    folder = Path(folder)
    if not is_ours(folder, kind):
        return None
    did = None
    if (folder / DROPPING).exists():
        shutil.rmtree(folder / DROPPING, ignore_errors=True)
        did = "removed a replaced version whose replacement was committed"
    if (folder / STAGING).exists():
        shutil.rmtree(folder / STAGING, ignore_errors=True)
    aside = folder / ASIDE
    if aside.is_dir() and not aside.is_symlink():
        with hold_signals():
            put_back(folder, kind)
        did = f"put back what an interrupted --overwrite had moved aside in {folder}"
    return did


def _moved(aside: Path) -> list[str] | None:
    """The names `move_aside` listed before moving them; None when the list is missing or damaged."""
    try:
        names = json.loads((aside / MOVED).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(names, list):
        return None
    return [n for n in names if isinstance(n, str) and "/" not in n and n not in (".", "..")]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def put_back(folder: Path, kind: FolderKind) -> None:
    """Undo a replacement (`move_aside`): what is in `.pvpo-replaced/` comes back, replacing any
    new entry of its name; the new content's other entries go, when the list of what was moved
    says which those are (an entry on it that was never moved is the old one, left). Call it with
    SIGINT and SIGTERM held."""
    aside = folder / ASIDE
    moved = _moved(aside)
    back = [p.name for p in aside.iterdir() if p.name != MOVED and not p.name.startswith(f".{MOVED}.")]
    if moved is not None:
        for name in replaceable(entries(folder, kind)[0]):
            if name not in back and name not in moved:  # written by the new content alone
                _remove(folder / name)
    for name in back:
        if os.path.lexists(folder / name):
            _remove(folder / name)
        os.replace(aside / name, folder / name)
    shutil.rmtree(aside)


@dataclass
class Replacement:
    """A replacement under way (`replacing`): `commit()` once the new content is worth keeping."""

    folder: Path
    active: bool = False

    def commit(self) -> None:
        """Drop the replaced entries (the new content is worth keeping); nothing when none were moved."""
        if self.active:
            commit(self.folder)
            self.active = False


def commit(folder: str | Path) -> None:
    """Drop what a replacement moved aside in `folder` (the new content is worth keeping): renamed
    first, so a kill mid-delete leaves something `recover` deletes, never something it puts back."""
    folder = Path(folder)
    aside = folder / ASIDE
    if not aside.exists():
        return
    with hold_signals():
        os.replace(aside, folder / DROPPING)
    shutil.rmtree(folder / DROPPING, ignore_errors=True)


def move_aside(folder: Path, names: Sequence[str]) -> None:
    """Move `names` (pvpo's entries of `folder`) into its `.pvpo-replaced/`, their list written
    first, so `recover` can put them back after a kill at any point."""
    aside = folder / ASIDE
    with hold_signals():
        aside.mkdir()
        atomic_write_text(aside / MOVED, json.dumps(list(names)))
        for name in names:
            os.replace(folder / name, aside / name)


@contextlib.contextmanager
def replacing(
    folder: str | Path,
    kind: FolderKind,
    *,
    overwrite: bool,
    refusal: str,
    inputs: Sequence[str | Path | None] = (),
    error: type[Exception] = FolderError,
) -> Iterator[Replacement]:
    """`folder` made ready for new content of `kind` for the block, by the rule above: a folder
    holding the user's files is refused unless `overwrite` (they are kept either way), one
    holding earlier content of pvpo's is refused with `refusal` (what to pass instead) unless
    `overwrite`; then that content is moved aside until `Replacement.commit()`, and put back if
    the block raises (a stop included) before. `inputs`: paths the new content reads, refused
    when they lie in what is being replaced; `error`: the exception type of a refusal. Call it
    with the folder's lock held."""
    folder = Path(folder)
    recover(folder, kind)
    ours, users = entries(folder, kind)
    ours = replaceable(ours)
    refuse_clashes(folder, kind, users, error=error)
    if ours and not overwrite:
        raise error(f"{folder} already holds {kind.noun} ({shown(ours)}): {refusal}")
    if users and not overwrite:
        raise error(
            f"{folder} holds files pvpo did not write ({shown(users)}): give a new or empty folder, "
            "or --overwrite to write beside them (they are kept)"
        )
    for p in inputs:
        if p is None:
            continue
        resolved = Path(p).resolve()
        if any(resolved.is_relative_to((folder / n).resolve()) for n in ours):
            raise error(
                f"{p} is inside {folder}, in what --overwrite replaces: move it out, or write into another folder"
            )
    existed, recorded = folder.exists(), _record_kind(folder) == kind.name
    claim(folder, kind)
    replacement = Replacement(folder)
    try:
        if ours:
            replacement.active = True
            move_aside(folder, ours)  # a signal held during the moves arrives at their end: put back below
        yield replacement
    except BaseException:
        with hold_signals():
            if replacement.active and (folder / ASIDE).exists():
                put_back(folder, kind)
                log.warning("%s is back as it was: the new content failed or stopped before it was complete", folder)
            # a start refused before it wrote anything leaves no record in a user's folder (what it
            # did write, a resume may use: a run's anchor, an evaluation's answers)
            if not recorded and not replaceable(entries(folder, kind)[0]):
                (folder / RECORD).unlink(missing_ok=True)
            if not existed and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
