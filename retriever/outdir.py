"""What `pvpo retriever build` and `link` may do with their --out folder, by pvpo's one rule for
the folders it writes (`pvpo.owned`): a new or empty folder, or an interrupted build of ours of
the same source (resumed, its other files kept), is built in place; a folder is a build of ours
only by the manifest a build wrote in it (a user's `meta.json` or `embeddings/` marks nothing). A
folder holding a user's files is refused unless --overwrite, and those files are kept either
way; a build of ours of another source, or a finished one, is replaced only with --overwrite.
An input (the corpus) inside the files a build writes is refused, --overwrite or not. With --overwrite the new index is built
in a staging folder inside --out and swapped in only once it is complete - the earlier build's
files moved aside, the new ones moved in, the old ones dropped - so a build that fails (an
unreadable corpus, a model that cannot be loaded, a bad index type, an interruption) leaves the
folder exactly as it was (the price: room for both until the swap). The inputs must not lie
inside a folder being replaced."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pvpo.owned import (
    RECORD,
    STAGING,
    FolderError,
    FolderKind,
    check_folder_path,
    claim,
    commit,
    entries,
    move_aside,
    put_back,
    recorded,
    recover,
    refuse_clashes,
    replaceable,
    shown,
)
from pvpo.retriever.build import CORPUS_FILE, EMB_DIR, INDEX_FILE
from pvpo.retriever.hybrid import DENSE_DIR, LEXICAL_DIR
from pvpo.retriever.index import META_FILE, OFFSETS_FILE
from pvpo.retriever.rerank import VECTORS_FILE
from pvpo.signals import hold_signals

INDEX_KIND = FolderKind(
    "index",
    "an index build",
    frozenset(
        {META_FILE, "corpus.source.json", CORPUS_FILE, OFFSETS_FILE, INDEX_FILE, EMB_DIR, VECTORS_FILE}
        | {DENSE_DIR, LEXICAL_DIR}
    ),
)


def checked_out(out: str | Path) -> Path:
    """`--out` as a path an index folder can be written at (`pvpo.owned.check_folder_path`)."""
    return check_folder_path(out, "--out")


def out_dir_state(out: Path) -> str:
    """ "new" (absent or empty), "ours" (an earlier build or link of ours) or "foreign"."""
    checked_out(out)
    if not out.exists() or not any(out.iterdir()):
        return "new"
    ours, users = entries(out, INDEX_KIND)
    return "ours" if ours and not users else "foreign"


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _refuse_inputs_inside(out: Path, inputs: Sequence[str | Path | None], what: str) -> None:
    """A one-line error when an input lies in what a build writes in `out` (a corpus at
    out/corpus.jsonl would be rewritten as `{id, contents}`), --overwrite or not."""
    for p in inputs:
        if p is None or not _inside(Path(p), out):
            continue
        top = Path(p).resolve().relative_to(out.resolve()).parts
        if top and INDEX_KIND.writes(top[0]):
            raise ValueError(
                f"{p} is inside {what} {out}, where a build writes {top[0]}: move it out of the folder, "
                "or build into another folder"
            )


def _refuse_another_build(out: Path, source: str | Path | None, ours: Sequence[str], what: str) -> None:
    """Without --overwrite: a finished build of ours, or an interrupted one of another source, is
    refused (a re-run of the same interrupted build resumes it)."""
    if not ours:
        return
    was = recorded(out, "source")
    now = None if source is None else str(Path(source).resolve())
    if META_FILE in ours:
        raise ValueError(
            f"{what} {out} already holds a finished index{f' of {was}' if was else ''}: "
            "--overwrite to replace it (kept until the new one is complete), or give another folder"
        )
    if was is not None and now is not None and was != now:
        raise ValueError(
            f"{what} {out} holds an interrupted build of {was}, not {now}: re-run that build to resume it, "
            "--overwrite to replace it, or give another folder"
        )


def check_build_target(
    out: str | Path,
    *,
    overwrite: bool = False,
    inputs: Sequence[str | Path | None] = (),
    source: str | Path | None = None,
    what: str = "--out",
) -> tuple[list[str], list[str]]:
    """Whether a build may write `out` (`what` names it in the message: `--out`,
    `retriever.index_dir`), by the rules above, reading only: a ValueError naming the folder,
    the files in the way and the fix when it may not; else (pvpo's entries, the user's)."""
    out = check_folder_path(out, what)
    _refuse_inputs_inside(out, inputs, what)
    ours, users = entries(out, INDEX_KIND)
    try:
        refuse_clashes(out, INDEX_KIND, users)
    except FolderError as e:
        raise FolderError(f"{what}: {e}") from None
    if users and not ours and not overwrite:
        fix = "or --overwrite to build beside them (they are kept)" if what == "--out" else "or a built index"
        raise ValueError(
            f"{what} {out} holds files that are not an index build ({shown(users)}): give a new or empty folder, {fix}"
        )
    ours = replaceable(ours)
    if not overwrite:
        _refuse_another_build(out, source, ours, what)
    return ours, users


@contextmanager
def build_into(
    out: str | Path,
    *,
    overwrite: bool,
    inputs: Sequence[str | Path | None] = (),
    source: str | Path | None = None,
    what: str = "--out",
) -> Iterator[Path]:
    """The folder to build into (call it with the folder's lock held), by the rules above, before
    anything is read or encoded. Without `overwrite`: `out` itself, when it is new or empty or an
    interrupted build of ours from `source` (what the build reads: its corpus or prebuilt
    index, recorded in the manifest); else a ValueError naming the files or the build in the
    way, the folder untouched (`check_build_target`). With `overwrite` and a folder holding
    anything: a staging folder inside `out` whose entries replace the earlier build's when the
    block ends without error (a user's files stay), and which is removed when it raises."""
    out = checked_out(out)
    recover(out, INDEX_KIND)  # in a folder with a build's manifest only
    ours, users = check_build_target(out, overwrite=overwrite, inputs=inputs, source=source, what=what)
    info = {} if source is None else {"source": str(Path(source).resolve())}
    if not (users or ours) or not overwrite:  # new, or an interrupted build of ours resumed in place
        existed, fresh = out.exists(), not ours
        claim(out, INDEX_KIND, info=info)
        try:
            yield out
        except BaseException:
            # a build refused or failed before it wrote a file leaves no manifest, nor a folder it made
            if fresh and [p.name for p in out.iterdir()] == [RECORD]:
                (out / RECORD).unlink()
                if not existed:
                    out.rmdir()
            raise
        return
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with hold_signals():  # the swap: all of it or, after a kill, none (`recover` puts the old build back)
        claim(out, INDEX_KIND, info=info)
        move_aside(out, ours)
        try:
            for entry in staging.iterdir():
                os.replace(entry, out / entry.name)
            staging.rmdir()
        except BaseException:
            put_back(out, INDEX_KIND)
            raise
        commit(out)
