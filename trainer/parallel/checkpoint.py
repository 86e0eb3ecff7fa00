"""Checkpoints of a sharded (FSDP2) run, through `torch.distributed.checkpoint` (DCP), and a
training run's choice between them and one process's (`save_run_checkpoint`, `load_run_checkpoint`).

Layout of `<run>/checkpoints/step_NNNNNN/`, the same names as a single-process checkpoint where
they mean the same thing:

- `dcp/`: model and AdamW state, each rank writing its own shards in parallel (DCP's
  `get_state_dict` / `save` / `load` / `set_state_dict`); a resume on the same world size reads
  them back shard for shard (DCP also reshards onto another world size, untested here); the
  sharded modules an estimator trains (PPO's critic: `modules`) and their optimizers are saved
  beside the policy, under their own names, in the same DCP checkpoint;
- `policy/`: the whole weights as a Hugging Face folder (gathered, written by rank 0), which
  transformers' `from_pretrained` and vLLM load directly for evaluation and serving (a LoRA
  policy's merged, with `adapter/` beside it, as in one process: `lora.LoraCheckpointView`);
- `trainer_state.pt`: step, world size, extra state and rank 0's RNG (what `latest_checkpoint`
  and `load_trainer_state` read); `rank_R/trainer_state.pt`: rank R's RNG;
- `run_state/`: copies of the run's state files (anchor, ...), as `checkpoint.save_checkpoint`.

The directory is written as `<name>.tmp` and renamed by rank 0 after every rank has finished, then
named in `latest`, so a crash at any moment leaves the previous checkpoint whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pvpo.atomic import atomic_write_text
from pvpo.trainer.model.lora import checkpointed_module, is_lora, load_lora_weights
from pvpo.trainer.parallel.distributed import barrier, full_state_dict, is_distributed, is_main, rank, world_size
from pvpo.trainer.state.checkpoint import (
    KEPT_CHECKPOINTS,
    LATEST,
    POLICY_DIR,
    STATE_FILES_DIR,
    TRAINER_STATE,
    CheckpointError,
    load_trainer_state,
    load_weights,
    note_checkpoint,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    step_name,
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
    keep: int = KEPT_CHECKPOINTS,
    state_files: Sequence[str | Path] = (),
    modules: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]] | None = None,
) -> Path:
    """Save the state after `step` optimizer steps (a collective: every rank calls it); keep the
    newest `keep` checkpoints. `model` is the policy or its `lora.checkpoint_view`; `modules`:
    name -> (sharded module, its optimizer) saved beside it."""
    import torch.distributed.checkpoint as dcp

    root = RunDir(run_dir).checkpoints
    final = root / step_name(step)
    tmp = root / f"{step_name(step)}.tmp"
    if is_main():
        note_checkpoint(root, final.name)  # named in the manifest before it is written (`pvpo.owned`)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    module = checkpointed_module(model)
    dcp.save(_dcp_state(module, optimizer, modules), checkpoint_id=str(tmp / "dcp"))
    full = full_state_dict(module, cpu_offload=True)  # collective; rank 0 writes it
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
        prune_checkpoints(root, keep)
    barrier()
    return final


def _dcp_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    modules: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]] | None,
) -> dict[str, Any]:
    """What DCP saves and loads: `model`/`optimizer`, and `<name>`/`<name>_optimizer` per module."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: dict[str, Any] = {}
    for name, (mod, opt) in {"model": (model, optimizer), **(modules or {})}.items():
        msd, osd = get_state_dict(mod, opt)
        out[name], out["optimizer" if name == "model" else f"{name}_optimizer"] = msd, osd
    return out


def load_sharded_checkpoint(
    ckpt: str | Path,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    modules: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]] | None = None,
) -> dict[str, Any]:
    """Restore model, optimizer, the `modules` saved beside them and this rank's RNG from a
    checkpoint written by `save_sharded_checkpoint`; returns rank 0's trainer state (step, extra).
    A checkpoint of another world size, or a single-process one, is a CheckpointError naming both."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

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
    module = checkpointed_module(model)
    target = _dcp_state(module, optimizer, modules)
    dcp.load(target, checkpoint_id=str(ckpt / "dcp"))
    for name, (mod, opt) in {"model": (module, optimizer), **(modules or {})}.items():
        osd = target["optimizer" if name == "model" else f"{name}_optimizer"]
        set_state_dict(mod, opt, model_state_dict=target[name], optim_state_dict=osd)
    set_rng_state(load_trainer_state(ckpt / f"rank_{rank()}")["rng"])
    return state


def save_run_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    state_files: Sequence[str | Path],
    modules: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer]],
) -> Path:
    """A training run's checkpoint of `step`: under torchrun the sharded one, the estimator's
    sharded `modules` (PPO's critic) beside the policy in DCP; in one process
    `state.checkpoint.save_checkpoint` (a state's modules are then in its `extra`)."""
    if is_distributed():
        return save_sharded_checkpoint(
            run_dir,
            step,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            extra=extra,
            state_files=state_files,
            modules=modules,
        )
    return save_checkpoint(
        run_dir, step, model=model, tokenizer=tokenizer, optimizer=optimizer, extra=extra, state_files=state_files
    )


def load_run_checkpoint(
    ckpt: Path, *, model: Any, optimizer: torch.optim.Optimizer, modules: Mapping[str, Any]
) -> dict[str, Any]:
    """Restore a training run's weights (a LoRA policy's adapters), optimizer, RNG and, under
    torchrun, the estimator's sharded `modules` from `ckpt`; its trainer state (step, extra)."""
    if is_distributed():
        return load_sharded_checkpoint(ckpt, model=model, optimizer=optimizer, modules=modules)
    load_lora_weights(model, ckpt) if is_lora(model) else load_weights(model, ckpt)
    state = load_trainer_state(ckpt)
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return state


def check_resume_world(run_dir: str | Path, nproc: int) -> None:
    """Before `pvpo train --resume` launches `nproc` processes: a CheckpointError naming the
    latest checkpoint when it was saved by another number of processes (a single-process
    checkpoint under torchrun, a sharded one without it), so the refusal is one line from this
    process instead of one traceback per rank and torchrun's report."""
    from pvpo.trainer.state.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return
    state = load_trainer_state(ckpt, mmap=True)
    saved = int(state.get("world_size", 1)) if state.get("format") == "dcp" else 1
    if saved != nproc:
        how = "without --nproc" if saved == 1 else f"with --nproc {saved}"
        raise CheckpointError(
            f"{ckpt} was saved by {saved} process(es), this resume asks for {nproc}: resume it {how}, "
            "or train into a new --run-dir"
        )
