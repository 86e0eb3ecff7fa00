"""Atomic training checkpoints: weights + tokenizer, optimizer, RNG states and the step counter.

A checkpoint is written to `<run>/checkpoints/step_000042.tmp`, renamed into place, and only
then named in `<run>/checkpoints/latest` (itself replaced atomically), so a crash at any moment
leaves the previous checkpoint usable.

Loading trusts nothing in the run directory: `trainer_state.pt` is read with
`torch.load(weights_only=True)` (the RNG states are saved as plain lists and tensors, so no
pickled global is needed), and `latest` must name a `step_NNNNNN` directory directly under
`checkpoints/` (a pointer such as `../../x` is refused, not followed).
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pvpo.atomic import atomic_write_dir, atomic_write_text
from pvpo.owned import commit as commit_replacement
from pvpo.owned import entries, forget, is_ours, note
from pvpo.trainer.state.best import BestFileError, best_checkpoint_name
from pvpo.trainer.state.run_dir import CHECKPOINT_KIND, STEP_KIND, RunDir
from pvpo.trainer.state.state_files import check_state_files

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_[0-9]{6,}")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or read; the message names the file, the value and
    what to do (a ValueError: `pvpo`'s one-line error, rc 2)."""


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as types `torch.load(weights_only=True)` accepts:
    Python's state is a tuple of ints, NumPy's key array becomes a list (an ndarray would need the
    `numpy._core.multiarray._reconstruct` global allow-listed)."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"] = {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])}
    return {"python": random.getstate(), "numpy": np_state, "torch": torch.random.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np_state = state["numpy"]
    if isinstance(np_state, dict):  # a tuple is the legacy form, an ndarray inside
        np_state = {
            **np_state,
            "state": {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]},
        }
    np.random.set_state(np_state)
    torch.random.set_rng_state(state["torch"])


# a checkpoint's layout: step_NNNNNN/{policy/, trainer_state.pt, run_state/}, and checkpoints/latest
POLICY_DIR = "policy"  # weights + tokenizer, loadable by transformers and vLLM
TRAINER_STATE = "trainer_state.pt"  # optimizer, RNG, step, extra
STATE_FILES_DIR = "run_state"  # copies of the run's state files (anchor, GT cache, ...) at the checkpoint's step
LATEST = "latest"
KEPT_CHECKPOINTS = 2  # the newest ones; the best validation step's is kept beside them (`prune_checkpoints`)


def step_name(step: int) -> str:
    """The folder of `step`'s checkpoint under `checkpoints/`."""
    return f"step_{step:06d}"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any] | None = None,
    keep: int = KEPT_CHECKPOINTS,
    state_files: Sequence[str | Path] = (),
) -> Path:
    """Save the state after `step` optimizer steps; keep the newest `keep` checkpoints. Each of
    `state_files` that exists is copied in (`restore_state_files` puts them back on resume)."""
    root = RunDir(run_dir).checkpoints
    note_checkpoint(root, step_name(step))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp / POLICY_DIR)
        tokenizer.save_pretrained(tmp / POLICY_DIR)
        for f in map(Path, state_files):
            if f.exists():
                (tmp / STATE_FILES_DIR).mkdir(exist_ok=True)
                shutil.copy2(f, tmp / STATE_FILES_DIR / f.name)
        state = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "step": step, "extra": extra or {}}
        torch.save(state, tmp / TRAINER_STATE)

    final = atomic_write_dir(root / step_name(step), write)
    atomic_write_text(root / LATEST, final.name)
    # what an --overwrite moved aside (resume.fresh_run_dir) goes once the new run can resume
    commit_replacement(run_dir)
    prune_checkpoints(root, keep)
    return final


def note_checkpoint(root: Path, name: str) -> None:
    """Name checkpoint `name` in `root`'s manifest (`pvpo.owned`) before it is written. A
    checkpoints folder written before it had one adopts its `step_NNNNNN` folders: the run's
    manifest names the folder, and only a run writes those exact names."""
    adopt = (
        []
        if is_ours(root, CHECKPOINT_KIND) or not root.is_dir()
        else [p.name for p in root.iterdir() if _STEP_DIR.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    )
    note(root, CHECKPOINT_KIND, *adopt, name)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Remove all but the newest `keep` of the checkpoints `root`'s manifest names (keep <= 0:
    remove none; a folder without a manifest: none), and never the one `best.json` names (the
    best validation EM); with a damaged best.json, none. Only a checkpoint's own files go: a
    user's file inside one stays, in its folder (then no longer named as the run's)."""
    try:
        best = best_checkpoint_name(root)
    except BestFileError as e:
        log.warning("kept every checkpoint: %s", e)
        return
    ours = entries(root, CHECKPOINT_KIND)[0]
    old = sorted(n for n in ours if _STEP_DIR.fullmatch(n) and (root / n).is_dir() and not (root / n).is_symlink())
    for name in old[:-keep] if keep > 0 else []:
        if name == best:
            continue
        path = root / name
        mine, users = _checkpoint_entries(path)
        for entry in mine:
            target = path / entry
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if users:
            log.warning(
                "pruned checkpoint %s but kept the folder: it holds %s, which the run did not write", path, users
            )
        else:
            shutil.rmtree(path, ignore_errors=True)
        forget(root, name)


def _checkpoint_entries(path: Path) -> tuple[list[str], list[str]]:
    """(the checkpoint's own entries, a user's) of checkpoint folder `path`."""
    names = sorted(p.name for p in path.iterdir())
    return [n for n in names if STEP_KIND.writes(n)], [n for n in names if not STEP_KIND.writes(n)]


def restore_state_files(ckpt: str | Path, state_files: Sequence[str | Path]) -> None:
    """Make each of `state_files` what it was when `ckpt` was saved: copied back from the
    checkpoint, or removed if it did not exist then (it was written after the checkpoint). Every
    saved copy is checked first (`state_files.read_state_file`), so a damaged one is a
    DamagedFileError naming it and nothing is restored, the run's own files left as they were."""
    ckpt = Path(ckpt)
    saved = ckpt / STATE_FILES_DIR
    fix = _what_to_do(ckpt.parent, ckpt.parent / LATEST, but=ckpt.name)
    check_state_files([saved / Path(f).name for f in state_files], fix=fix)
    for f in map(Path, state_files):
        src = saved / f.name
        if src.exists():
            tmp = f.with_name(f.name + ".restore")
            shutil.copy2(src, tmp)
            os.replace(tmp, f)
        else:
            f.unlink(missing_ok=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint named by `latest`, or None when the run has none.

    Raises CheckpointError when `latest` names anything but a `step_NNNNNN` directory directly
    under `checkpoints/` (after resolving symlinks)."""
    root = RunDir(run_dir).checkpoints
    marker = root / LATEST
    if not marker.exists():
        return None
    name = marker.read_text(encoding="utf-8", errors="replace").strip()
    path = root / name
    if not _STEP_DIR.fullmatch(name) or path.resolve().parent != root.resolve():
        raise CheckpointError(
            f"{marker} names {name!r}: expected a step_NNNNNN directory inside {root}, refusing to load it; "
            + _what_to_do(root, marker)
        )
    state = path / TRAINER_STATE
    if not state.is_file():
        raise CheckpointError(
            f"{marker} names {name}, which is gone or incomplete ({state} missing); " + _what_to_do(root, marker)
        )
    if not zipfile.is_zipfile(state):  # torch.save writes a zip: a cut file has no central directory
        raise CheckpointError(f"{state} is damaged (truncated?); " + _what_to_do(root, marker, but=name))
    return path


def _what_to_do(root: Path, marker: Path, *, but: str = "") -> str:
    """How to go on from a bad `latest`: resume from another complete checkpoint, or start over."""
    others = sorted(
        p.name
        for p in root.glob("step_*")
        if p.is_dir() and _STEP_DIR.fullmatch(p.name) and p.name != but and zipfile.is_zipfile(p / TRAINER_STATE)
    )
    if others:
        return f"to resume from {others[-1]}, write `{others[-1]}` into {marker} (complete checkpoints: {', '.join(others)})"
    return "no complete checkpoint is left: start over with --overwrite"


def load_trainer_state(ckpt: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """The optimizer/RNG/step dict of a checkpoint (weights load through `from_pretrained`).

    Read with `weights_only=True`: tensors, numbers, strings and containers only, so a tampered
    file cannot run code; anything else is a CheckpointError naming the file. `mmap`: tensors
    are mapped, not read (for a look at the small entries of a large optimizer state)."""
    path = Path(ckpt) / TRAINER_STATE
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, OSError) as e:  # a damaged zip or a cut pickle
        raise CheckpointError(
            f"{path} is damaged ({e}); delete {path.parent} and resume from an earlier checkpoint"
        ) from None
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} holds more than tensors and plain values, refusing to unpickle it: {e}"
        ) from None


def recorded_config(ckpt: str | Path) -> dict[str, str] | None:
    """The config record (`resume.config_record`) a checkpoint was saved with, in its trainer
    state's `extra["config"]`; None for a checkpoint saved without one."""
    record = load_trainer_state(ckpt, mmap=True).get("extra", {}).get("config")
    return record if isinstance(record, dict) else None


def _numpy_array_globals() -> list[Any]:
    """The globals a pickled NumPy uint32 array needs: checkpoints written before `rng_state`
    saved NumPy's key as a list hold one. `_reconstruct` builds only allow-listed array types."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_weights(model: torch.nn.Module, ckpt: str | Path) -> None:
    """Load a checkpoint's policy weights into `model` in place."""
    from transformers import AutoModelForCausalLM

    from pvpo.trainer.model.policy import WEIGHT_FILES, damaged_model_file

    ckpt = Path(ckpt)
    try:
        saved = AutoModelForCausalLM.from_pretrained(str(ckpt / POLICY_DIR), dtype=next(model.parameters()).dtype)
    except Exception as err:  # re-raised as it was unless the weights file is damaged
        fix = _what_to_do(ckpt.parent, ckpt.parent / LATEST, but=ckpt.name)
        raise damaged_model_file(ckpt / POLICY_DIR, err, WEIGHT_FILES, fix) from err
    model.load_state_dict(saved.state_dict())
