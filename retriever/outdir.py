"""What `pvpo retriever build` and `link` may do with their --out folder, by pvpo's one rule for
the folders it writes (`pvpo.owned`): a new or empty folder, or an earlier build of ours
(resumed, its other files kept), is built in place. A folder holding a user's files is refused
unless --overwrite, and those files are kept either way. With --overwrite the new index is built
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
    STAGING,
    FolderKind,
    check_folder_path,
    claim,
    commit,
    entries,
    move_aside,
    put_back,
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

# Files only our builds write: meta.json (a finished build or link) and the corpus stamp, a
# build's first file (an interrupted build, which a re-run resumes).
BUILD_MARKERS = (META_FILE, "corpus.source.json")

INDEX_KIND = FolderKind(
    "index",
    "an index build",
    frozenset({*BUILD_MARKERS, CORPUS_FILE, OFFSETS_FILE, INDEX_FILE, EMB_DIR, VECTORS_FILE, DENSE_DIR, LEXICAL_DIR}),
    # an interrupted hybrid build has only its dense/ (and bm25/) folder so far
    tuple(f"{d}{m}" for d in ("", f"{DENSE_DIR}/", f"{LEXICAL_DIR}/") for m in BUILD_MARKERS),
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


@contextmanager
def build_into(out: str | Path, *, overwrite: bool, inputs: Sequence[str | Path | None] = ()) -> Iterator[Path]:
    """The folder to build into (call it with --out's lock held). Without `overwrite`: `out`
    itself, unless it holds files and is not a build of ours (ValueError naming some, the
    folder untouched). With `overwrite` and a folder holding anything: a staging folder inside
    `out` whose entries replace the earlier build's when the block ends without error (a user's
    files stay), and which is removed when it raises."""
    out = checked_out(out)
    recover(out, INDEX_KIND)
    ours, users = entries(out, INDEX_KIND)
    refuse_clashes(out, INDEX_KIND, users)
    if users and not ours and not overwrite:
        raise ValueError(
            f"--out {out} holds files that are not an index build ({shown(users)}): give a new or empty folder, "
            "or --overwrite to build beside them (they are kept)"
        )
    ours = replaceable(ours)
    if not (users or ours) or not overwrite:  # new, or an earlier build of ours resumed in place
        yield out
        claim(out, INDEX_KIND)
        return
    for p in inputs:
        if p is not None and any(_inside(Path(p), out / n) for n in ours):
            raise ValueError(f"{p} is inside --out {out}, which --overwrite would replace: build into another folder")
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with hold_signals():  # the swap: all of it or, after a kill, none (`recover` puts the old build back)
        claim(out, INDEX_KIND)
        move_aside(out, ours)
        try:
            for entry in staging.iterdir():
                os.replace(entry, out / entry.name)
            staging.rmdir()
        except BaseException:
            put_back(out, INDEX_KIND)
            raise
        commit(out)
