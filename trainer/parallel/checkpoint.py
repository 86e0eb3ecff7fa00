"""Checkpoints of a sharded (FSDP2) run, through `torch.distributed.checkpoint` (DCP).

Layout of `<run>/checkpoints/step_NNNNNN/`, the same names as a single-process checkpoint where
they mean the same thing:

- `dcp/`: model and AdamW state, each rank writing its own shards in parallel (DCP's
  `get_state_dict` / `save` / `load` / `set_state_dict`); a resume on the same world size reads
  them back shard for shard (DCP also reshards onto another world size, untested here);
- `policy/`: the whole weights as a Hugging Face folder (gathered, written by rank 0), which
  transformers' `from_pretrained` and vLLM load directly for evaluation and serving;
- `trainer_state.pt`: step, world size, extra state and rank 0's RNG (what `latest_checkpoint`
  and `load_trainer_state` read); `rank_R/trainer_state.pt`: rank R's RNG;
- `run_state/`: copies of the run's state files (anchor, ...), as `checkpoint.save_checkpoint`.

The directory is written as `<name>.tmp` and renamed by rank 0 after every rank has finished, then
named in `latest`, so a crash at any moment leaves the previous checkpoint whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pvpo.atomic import atomic_write_text
from pvpo.trainer.parallel.distributed import barrier, full_state_dict, is_main, rank, world_size
from pvpo.trainer.state.checkpoint import (
    LATEST,
    POLICY_DIR,
    STATE_FILES_DIR,
    TRAINER_STATE,
    CheckpointError,
    load_trainer_state,
    rng_state,
    set_rng_state,
)
from pvpo.trainer.state.run_dir import RunDir


def save_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    state_files: Sequence[str | Path] = (),
) -> Path:
    """Save the state after `step` optimizer steps (a collective: every rank calls it); keep the
    newest `keep` checkpoints."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = RunDir(run_dir).checkpoints
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    full = full_state_dict(model, cpu_offload=True)  # collective; rank 0 writes it
    (tmp / f"rank_{rank()}").mkdir(exist_ok=True)
    torch.save({"rng": rng_state(), "rank": rank()}, tmp / f"rank_{rank()}" / TRAINER_STATE)
    if is_main():
        model.save_pretrained(tmp / POLICY_DIR, state_dict=full)
        tokenizer.save_pretrained(tmp / POLICY_DIR)
        for f in map(Path, state_files):
            if f.exists():
                (tmp / STATE_FILES_DIR).mkdir(exist_ok=True)
                shutil.copy2(f, tmp / STATE_FILES_DIR / f.name)
        state = {"rng": rng_state(), "step": step, "extra": extra or {}, "world_size": world_size(), "format": "dcp"}
        torch.save(state, tmp / TRAINER_STATE)
    del full
    barrier()
    if is_main():
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_text(root / LATEST, final.name)
        old = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for p in old[:-keep] if keep > 0 else []:
            shutil.rmtree(p, ignore_errors=True)
    barrier()
    return final


def load_sharded_checkpoint(ckpt: str | Path, *, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG from a checkpoint written by
    `save_sharded_checkpoint`; returns rank 0's trainer state (step, extra). A checkpoint of
    another world size, or a single-process one, is a CheckpointError naming both."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    ckpt = Path(ckpt)
    state = load_trainer_state(ckpt)
    saved_world = state.get("world_size")
    if state.get("format") != "dcp" or not (ckpt / "dcp").is_dir():
        raise CheckpointError(f"{ckpt} is a single-process checkpoint; resume it without torchrun (or start a new run)")
    if saved_world != world_size():
        raise CheckpointError(
            f"{ckpt} was saved by {saved_world} ranks, this run has {world_size()}: resume with "
            f"--nproc_per_node matching {saved_world}"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    target: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(target, checkpoint_id=str(ckpt / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"])
    set_rng_state(load_trainer_state(ckpt / f"rank_{rank()}")["rng"])
    return state
