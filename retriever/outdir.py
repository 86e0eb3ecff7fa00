"""What `pvpo retriever build` and `link` may do with their --out folder. A new or empty folder,
or an earlier build of ours (resumed, its other files kept), is built in place. A folder holding
anything else is refused unless --overwrite; then the new index is built in a sibling folder and
swapped in only once it is complete, so a build that fails - an unreadable corpus, a model that
cannot be loaded, a bad index type, an interruption - leaves the folder exactly as it was (the
price: room for both until the swap). The inputs must not lie inside a folder being replaced."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pvpo.retriever.hybrid import DENSE_DIR, LEXICAL_DIR
from pvpo.retriever.index import META_FILE

# Files only our builds write: meta.json (a finished build or link) and the corpus stamp, a
# build's first file (an interrupted build, which a re-run resumes).
BUILD_MARKERS = (META_FILE, "corpus.source.json")


def out_dir_state(out: Path) -> str:
    """ "new" (absent or empty), "ours" (an earlier build or link of ours) or "foreign"."""
    if not out.exists():
        return "new"
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder: give a folder for the index")
    if not any(out.iterdir()):
        return "new"
    # an interrupted hybrid build has only its dense/ (and bm25/) folder so far
    folders = [out, out / DENSE_DIR, out / LEXICAL_DIR]
    return "ours" if any((f / name).is_file() for f in folders for name in BUILD_MARKERS) else "foreign"


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


@contextmanager
def build_into(out: str | Path, *, overwrite: bool, inputs: Sequence[str | Path | None] = ()) -> Iterator[Path]:
    """The folder to build into. Without `overwrite`: `out` itself, unless it holds files that
    are not a build of ours (ValueError naming some, the folder untouched). With `overwrite`
    and an existing folder: a fresh sibling that replaces `out` when the block ends without
    error, and is removed when it raises."""
    out = Path(out)
    state = out_dir_state(out)
    if state == "foreign" and not overwrite:
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise ValueError(
            f"--out {out} holds files that are not an index build ({shown}): give a new or empty folder, "
            "or --overwrite to replace its contents (kept until the new index is built)"
        )
    if state == "new" or not overwrite:
        yield out
        return
    for p in inputs:
        if p is not None and _inside(Path(p), out):
            raise ValueError(f"{p} is inside --out {out}, which --overwrite would replace: build into another folder")
    staging = out.parent / f".{out.name}.pvpo-building"
    shutil.rmtree(staging, ignore_errors=True)  # left by a build that was killed
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replaced = out.parent / f".{out.name}.pvpo-replaced"
    shutil.rmtree(replaced, ignore_errors=True)
    os.replace(out, replaced)
    os.replace(staging, out)
    shutil.rmtree(replaced, ignore_errors=True)
