"""The optimizer's state moved to a file while the policy is evaluated, and read back after.

An evaluation needs the policy and the rollout engine, not AdamW's two float32 moments per
parameter (1.08 GB for SmolLM2-135M). On one CPU process they share the host's memory with the
engine's KV cache and the evaluation's activations: the multi-hop recipe's final evaluation ran
1.06 GiB above its evaluation before RL (8.14 against 7.08 GiB, docs/benchmarks/real-recipe.md),
which was the run's peak. Written with `torch.save` and read back with `torch.load`, the state is
bit-for-bit the one the next update would have used. (Rejected: saving the last checkpoint before
the final evaluation and dropping the state after it: the checkpoint carries the validation curve
that evaluation completes, and evaluations every `run.eval_every` steps would keep the state.)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from pvpo.trainer.model.memory import release_freed_heap

log = logging.getLogger(__name__)


def remove_stale_spill(path: Path) -> bool:
    """Delete the spill file (`RunDir.optimizer_spill`) a killed run left: its state is older than
    the checkpoint a resume loads. Whether there was one."""
    if not path.exists():
        return False
    path.unlink()
    log.info("removed %s: a killed run's optimizer state, older than its checkpoint", path)
    return True


def spillable(optimizer: torch.optim.Optimizer, *, distributed: bool) -> bool:
    """Whether `optimizer` holds state and all of it is on the CPU in one process (a sharded
    optimizer's state under torchrun, or state on an accelerator, is left where it is)."""
    if distributed or not optimizer.state:
        return False
    return all(
        t.device.type == "cpu" for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of the tensors in `optimizer`'s state."""
    return sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )


@contextlib.contextmanager
def optimizer_state_on_disk(optimizer: torch.optim.Optimizer, path: Path, *, distributed: bool) -> Iterator[None]:
    """Inside the block `optimizer` holds no state: it waits in `path`, which is read back into the
    optimizer and deleted on leaving (an exception inside the block included). Nothing happens
    where the state cannot be spilled (`spillable`: none yet, under torchrun, or not on the CPU)."""
    if not spillable(optimizer, distributed=distributed):
        yield
        return
    size, t0 = state_bytes(optimizer), time.perf_counter()
    torch.save(optimizer.state_dict(), path)
    optimizer.state.clear()
    release_freed_heap()  # the moments' pages go back to the kernel, not to glibc's free lists
    log.debug("optimizer state, %.2f GiB, written to %s in %.1f s", size / 2**30, path, time.perf_counter() - t0)
    try:
        yield
    finally:
        optimizer.load_state_dict(torch.load(path, weights_only=True))
        path.unlink(missing_ok=True)
