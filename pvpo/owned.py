"""One rule for every folder and file pvpo writes (a training run, its checkpoints, an
evaluation's dataset folder, an index, a page or a table): what pvpo may replace or delete is
what a manifest it wrote names; a user's file is never modified, moved or deleted, with or without
`--overwrite`, and an existing output file is replaced only with `--overwrite`.

- A command that starts writing a folder writes its manifest, `.pvpo-folder.json`, inside it
  (`claim`): the folder's kind, the command, and the names of the entries pvpo writes there - the
  kind's fixed names (`FolderKind.entries`), reserved when the folder is claimed (one already taken
  by a user's file is refused: `refuse_clashes`), and each entry of a pattern (a checkpoint's
  `step_000042`) as it is written (`note`). A folder without a manifest is the user's, whatever
  it holds: a `meta.json`, a `run.json` or a `checkpoints/latest` of a user's marks nothing.
- In a folder with a manifest, the entries it names (and the temporary files of their atomic
  writes) are pvpo's; every other entry is the user's. A manifest written before it named entries
  (`{"kind": ...}` alone) names the kind's entries.
- `--overwrite` replaces pvpo's entries only (`replacing`): they are moved into `.pvpo-replaced/`
  inside the folder - renames on one file system, so a mount point or a read-only parent does not
  matter - and the user's stay where they are. A user's file nested in one of pvpo's folders (a
  NOTES.md in a checkpoint) is refused before anything moves (`foreign_nested`). The replaced
  entries are dropped only when the new content is worth keeping (`commit`: a run's first
  checkpoint, an evaluation's first answer, a complete index), and put back if the command fails
  or is stopped before.
- The moves run with SIGINT and SIGTERM held (`pvpo.signals.hold_signals`). A replacement that a
  SIGKILL cut short is undone by the next command on the folder (`recover`, called with the
  folder's lock held), which puts the replaced entries back and never deletes them unless the
  replacement was committed.
- An output file (`check_output_file`: a page, a table) is written only where no file is, or
  with `--overwrite`, and never over a file a manifest names.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


_KINDS: dict[str, FolderKind] = {}


@dataclass(frozen=True)
class FolderKind:
    """What one kind of folder holds: `name` (recorded), `noun` (for messages: "a training run"),
    the top-level `entries` it writes (exact names, and `patterns`: shell globs such as
    `step_[0-9]*`, each recorded by `note` as it is written), and `nested`: (glob, kind) pairs
    saying which of its entries are folders of a kind of their own (a run's `checkpoints`), whose
    content `foreign_nested` checks before a replacement moves them."""

    name: str
    noun: str
    entries: frozenset[str]
    patterns: tuple[str, ...] = ()
    nested: tuple[tuple[str, FolderKind], ...] = ()

    def _entry(self, name: str) -> bool:
        return name in self.entries or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def is_temp(self, name: str) -> bool:
        """Whether `name` is the temporary file of an atomic write of one of the kind's entries."""
        return any(self._entry(base) for base in _temp_bases(name))

    def writes(self, name: str) -> bool:
        """Whether an entry called `name` is one this kind writes (a temporary form included)."""
        return name in _OURS_ALWAYS or self._entry(name) or self.is_temp(name)

    def __post_init__(self) -> None:
        _KINDS.setdefault(self.name, self)  # an output file's check reads any kind's manifest

    def nested_kind(self, name: str) -> FolderKind | None:
        """The kind of the folder entry `name`, when it is a folder of a kind of its own."""
        return next((k for pattern, k in self.nested if fnmatch.fnmatchcase(name, pattern)), None)


def _temp_bases(name: str) -> list[str]:
    """The entries `name` would be the temporary file of (atomic_write_dir's `name.tmp`,
    atomic_write_text's `.name.<random>.tmp`, a restore's `name.restore`, numpy's `name.tmp.npy`)."""
    bases = [name[: -len(s)] for s in _TEMP_SUFFIXES if name.endswith(s) and len(name) > len(s)]
    if name.startswith(".") and name.endswith(".tmp"):
        bases.append(name[1:-4].rsplit(".", 1)[0])
    return bases


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


def _record(folder: Path) -> dict[str, Any] | None:
    """The manifest pvpo wrote in `folder`, or None (none, or not one of pvpo's)."""
    try:
        doc = json.loads((folder / RECORD).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("kind"), str) else None


def _record_kind(folder: Path) -> str | None:
    doc = _record(folder)
    return None if doc is None else doc["kind"]


def _listed(doc: dict[str, Any]) -> set[str] | None:
    """The entries a manifest names; None for one written before manifests named them."""
    names = doc.get("entries")
    if not isinstance(names, list):
        return None
    return {n for n in names if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")}


def recorded(folder: str | Path, key: str) -> str | None:
    """What `folder`'s manifest says under `key` (`claim`'s `info`: "command", "source"), if it says."""
    doc = _record(Path(folder))
    value = None if doc is None else doc.get(key)
    return value if isinstance(value, str) else None


def is_ours(folder: str | Path, kind: FolderKind) -> bool:
    """Whether `folder` holds a manifest pvpo wrote for `kind` (nothing else makes it pvpo's)."""
    folder = Path(folder)
    return folder.is_dir() and _record_kind(folder) == kind.name


def _ours_test(folder: Path, kind: FolderKind, *, named_by_parent: bool) -> Callable[[str], bool] | None:
    """Which entries of `folder` are pvpo's: those its manifest names (and their temporary forms);
    in a folder without a manifest of its own that its parent's names (`named_by_parent`: a
    checkpoint), those `kind` writes. None: the folder is the user's."""
    doc = _record(folder)
    if doc is None or doc["kind"] != kind.name:
        return kind.writes if named_by_parent and doc is None else None
    listed = _listed(doc)
    if listed is None:
        return kind.writes
    return lambda n: n in _OURS_ALWAYS or n in listed or any(b in listed for b in _temp_bases(n))


def entries(folder: str | Path, kind: FolderKind) -> tuple[list[str], list[str]]:
    """(pvpo's entries, the user's entries) of `folder`, each sorted; both empty when it does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return [], []
    names = sorted(p.name for p in folder.iterdir())
    ours = _ours_test(folder, kind, named_by_parent=False)
    if ours is None:
        return [], names
    return [n for n in names if ours(n)], [n for n in names if not ours(n)]


def foreign_nested(folder: str | Path, kind: FolderKind, names: Sequence[str]) -> list[str]:
    """The user's entries inside pvpo's folder entries `names` of `folder`, at any depth `kind`'s
    `nested` kinds reach (paths relative to `folder`, sorted): what replacing those folders whole
    would move and delete."""
    folder = Path(folder)
    found: list[str] = []
    for name in names:
        sub_kind = kind.nested_kind(name)
        sub = folder / name
        if sub_kind is None or sub.is_symlink() or not sub.is_dir():
            continue
        ours = _ours_test(sub, sub_kind, named_by_parent=True)
        inside = sorted(p.name for p in sub.iterdir())
        mine = [n for n in inside if ours is not None and ours(n)]
        found += [f"{name}/{n}" for n in inside if n not in mine]
        found += [f"{name}/{p}" for p in foreign_nested(sub, sub_kind, mine)]
    return sorted(found)


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
    ours = _ours_test(folder, kind, named_by_parent=True) if folder.is_dir() else None
    if ours is None:
        return []
    gone = sorted(
        p.name for p in folder.iterdir() if _temp_bases(p.name) and ours(p.name) and p.name not in _OURS_ALWAYS
    )
    for name in gone:
        _remove(folder / name)
    return gone


def shown(names: Sequence[str], most: int = 3) -> str:
    """`a, b, c and 4 more`: a few names for a message."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def claim(
    folder: str | Path, kind: FolderKind, *, names: Sequence[str] = (), info: Mapping[str, str] | None = None
) -> None:
    """Create `folder` if needed and write its manifest as `kind`'s (call it before writing
    anything in it): the names it named before, `names`, and each of the kind's fixed entries no
    user's file takes; `info` (the command, a build's source) recorded beside them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = _record(folder)
    doc = doc if doc is not None and doc["kind"] == kind.name else None
    listed = None if doc is None else _listed(doc)
    if doc is not None and listed is None:  # a manifest from before they named entries: the kind's
        listed = {p.name for p in folder.iterdir() if kind.writes(p.name) and p.name not in _OURS_ALWAYS}
    listed = set(listed or ())
    listed |= {n for n in kind.entries if not os.path.lexists(folder / n)} | set(names)
    new = {**(doc or {}), **(info or {}), "kind": kind.name, "written_by": "pvpo", "entries": sorted(listed)}
    if new != doc:
        atomic_write_json(folder / RECORD, new)


def note(folder: str | Path, kind: FolderKind, *names: str) -> None:
    """Name `names` in `folder`'s manifest (claimed as `kind`'s if it is not yet) before they are written."""
    claim(folder, kind, names=names)


def forget(folder: str | Path, *names: str) -> None:
    """Drop `names` from `folder`'s manifest, once pvpo has deleted them."""
    folder = Path(folder)
    doc = _record(folder)
    listed = None if doc is None else _listed(doc)
    if doc is None or listed is None or not listed & set(names):
        return
    atomic_write_json(folder / RECORD, doc | {"entries": sorted(listed - set(names))})


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


def refuse_nested(folder: Path, kind: FolderKind, ours: Sequence[str], *, error: type[Exception] = FolderError) -> None:
    """`error` when a user's file lies inside one of pvpo's folders `ours` of `folder` that a
    replacement would move whole (and later delete)."""
    nested = foreign_nested(folder, kind, ours)
    if nested:
        raise error(
            f"{folder / nested[0]} is not pvpo's, and --overwrite replaces the folder holding it"
            f"{f' ({len(nested) - 1} more such files)' if len(nested) > 1 else ''}: move it out of {folder}, "
            "then run again"
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
    info: Mapping[str, str] | None = None,
) -> Iterator[Replacement]:
    """`folder` made ready for new content of `kind` for the block, by the rule above: a folder
    holding the user's files is refused unless `overwrite` (they are kept either way), one
    holding earlier content of pvpo's is refused with `refusal` (what to pass instead) unless
    `overwrite`; then that content is moved aside until `Replacement.commit()`, and put back if
    the block raises (a stop included) before. `inputs`: paths the new content reads, refused
    when they lie in what is being replaced; `error`: the exception type of a refusal. Call it
    with the folder's lock held. A user's file inside one of pvpo's folders (`foreign_nested`) is
    refused, with or without `overwrite`; `info` is recorded in the manifest (`claim`)."""
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
    refuse_nested(folder, kind, ours, error=error)
    for p in inputs:
        if p is None:
            continue
        resolved = Path(p).resolve()
        if any(resolved.is_relative_to((folder / n).resolve()) for n in ours):
            raise error(
                f"{p} is inside {folder}, in what --overwrite replaces: move it out, or write into another folder"
            )
    existed, recorded = folder.exists(), _record_kind(folder) == kind.name
    claim(folder, kind, info=info)
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


def _owner(path: Path) -> tuple[Path, str] | None:
    """The folder whose manifest names `path` or a folder holding it, and that kind's noun; None
    when no manifest of pvpo's does."""
    for folder in path.parents:
        doc = _record(folder)
        kind = None if doc is None else _KINDS.get(doc["kind"])
        if kind is None:
            continue
        top = path.relative_to(folder).parts[0]
        ours = _ours_test(folder, kind, named_by_parent=False)
        if ours is not None and ours(top):
            return folder, kind.noun
    return None


def check_output_file(path: str | Path, what: str, *, overwrite: bool, reads: Sequence[str | Path] = ()) -> Path:
    """`path` as a file an output (a page, a table) may be written at, by the rule above: never
    a file a manifest of pvpo's names (a run's config.yaml, an evaluation's predictions) or one
    inside such a folder, never one of the files being read (`reads`), and an existing file only
    with `overwrite`. A FolderError naming `what` (the option) and the fix otherwise; call it
    before anything is read or computed."""
    path = Path(path)
    if path.is_dir():
        raise FolderError(f"{what} {path} is a folder: give a file name, e.g. {path / 'out.html'}")
    resolved = path.resolve()
    for r in reads:
        if Path(r).resolve() == resolved:
            raise FolderError(f"{what} {path} is a file this command reads: give another path")
    owner = _owner(resolved)
    if owner is not None:
        raise FolderError(
            f"{what} {path} is a file of {owner[1]} pvpo wrote in {owner[0]} (its .pvpo-folder.json names it), "
            "never replaced by another command: give another path"
        )
    if os.path.lexists(path) and not overwrite:
        raise FolderError(f"{what} {path} exists: give another path, or --overwrite to replace it")
    return path


def check_output_files(
    outputs: Mapping[str, str | Path | None], *, overwrite: bool, reads: Sequence[str | Path] = ()
) -> None:
    """`check_output_file` of each output given (option -> path; None: not asked for), and two
    options naming one file refused."""
    given = {what: Path(p) for what, p in outputs.items() if p is not None}
    for what, path in given.items():
        check_output_file(path, what, overwrite=overwrite, reads=reads)
    seen: dict[Path, str] = {}
    for what, path in given.items():
        if path.resolve() in seen:
            raise FolderError(f"{seen[path.resolve()]} and {what} name one file, {path}: give two")
        seen[path.resolve()] = what
