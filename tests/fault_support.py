"""Shared by the fault tests: `pvpo train` searching the in-memory OverlapSearcher instead of a
loopback retriever (in this process, or in a child process: `python tests/fault_support.py train
...`), a trained tiny run to copy, and the lines a refused command ends with."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer_support import TINY, WORLD, OverlapSearcher

# TINY's run with a checkpoint at every step (and no TensorBoard, as in TINY)
TINY_RUN = [*TINY, "run.checkpoint_every=1"]


@contextlib.contextmanager
def overlap_session(cfg: Any, run_dir: Path, corpus_path: Path | None) -> Iterator[OverlapSearcher]:
    """Stands in for `pvpo.trainer.setup.retriever_session`: TINY's world, searched in memory."""
    yield OverlapSearcher(WORLD.passages)


def use_overlap_searcher(monkeypatch: Any) -> None:
    """`pvpo train` in this process searches `overlap_session` (no MiniLM index, no server)."""
    import pvpo.trainer.loop as loop

    monkeypatch.setattr(loop, "retriever_session", overlap_session)


def train_tiny(run: Path, *overrides: str) -> Path:
    """A TINY run trained into `run` (checkpointed at every step), in this process."""
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train

    train(
        load_config(None, [*TINY_RUN, *overrides]), run, searcher=OverlapSearcher(WORLD.passages), show_progress=False
    )
    return run


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of the run in `src` at `dst` (its lock file, beside it, is not copied)."""
    shutil.copytree(src, dst)
    return dst


def error_lines(output: str) -> list[str]:
    """The lines a refused command ends with: from its `error:` line on."""
    lines = output.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), len(lines))
    return lines[start:]


if __name__ == "__main__":  # `python tests/fault_support.py train ...`: pvpo with the in-memory searcher
    import pvpo.trainer.loop as loop
    from pvpo.cli import main

    loop.retriever_session = overlap_session  # type: ignore[assignment]
    sys.argv = ["pvpo", *sys.argv[1:]]
    main()
