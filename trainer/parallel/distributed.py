"""Data-parallel training over processes launched by torchrun: FSDP2 sharding, each rank's share
of the prompts, reduced metrics, and rollout engines fed gathered weights.

`torchrun --nproc_per_node K -m pvpo.cli train ...` (or `pvpo train --nproc K`) starts K
processes; `init_from_env` joins them into one process group (NCCL on CUDA, gloo on CPU). Policy
and reference are sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`, each decoder layer
then the root), so each rank holds 1/K of the weights, gradients and AdamW state.

Prompt groups are never split: each rank rolls out whole groups, a contiguous share of the step's
prompts, with its own engine, so group statistics (GRPO/RLOO baselines, PVPO's anchor lookups)
are computed locally and exactly; only statistics that span groups are reduced: the loss
normalisation (model tokens over all ranks, `micro_batch.py`), the gradient (FSDP's
reduce-scatter) and the logged metrics. Rejected alternative: splitting groups across ranks and
all-reducing group means, which costs a collective per estimator call and ties the estimators to
torch.distributed. Anchor rollouts are split the same way and the per-prompt statistics gathered.

A rollout engine needs whole weights. With vLLM each rank's engine is its own `vllm.LLM`
(`distributed_executor_backend="external_launcher"`, as TRL colocates it under torchrun) and
receives the full state dict after each step; the transformers engine samples from an unsharded
copy refreshed the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def is_distributed() -> bool:
    """Whether this process is one of several ranks. A process group of size 1 is not: vLLM starts
    one inside a single training process, and sharding the policy there broke its weight sync."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    return rank() == 0


def launched_by_torchrun() -> bool:
    """Whether this process is one of several started by torchrun (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(device: torch.device) -> None:
    """Join the torchrun process group (NCCL on CUDA, gloo on CPU) once; a no-op in a single process."""
    if (dist.is_available() and dist.is_initialized()) or not launched_by_torchrun():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")


def torchrun_command(nproc: int, cli_args: Sequence[str]) -> list[str]:
    """`torchrun --standalone --nproc_per_node nproc -m pvpo.cli ...` for the `pvpo` arguments
    `cli_args` without their `--nproc` option (what `pvpo train --nproc N` runs)."""
    import sys

    args, skip = [], False
    for a in cli_args:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            args.append(a)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "pvpo.cli",
        *args,
    ]


def shutdown(*, completed: bool = False) -> None:
    """Leave the process group: after a barrier when this rank `completed` its work, so no rank
    tears its connections down while another still talks on them; without one after a failure,
    where the others must not wait. Measured on gloo without the barrier: a rank that finished
    first aborted at exit ("terminate called without an active exception") in 3 of 20 spawned
    runs of the V0.5 value-model check; 0 of 20 with it."""
    if is_distributed():
        if completed:
            dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. writes a corpus or builds an index), the others after it,
    so they find its files instead of racing to write them."""
    if not is_main():
        barrier()
    try:
        yield
    finally:
        if is_main():
            barrier()


def _device_for_collectives() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(x: float) -> float:
    """The sum of `x` over ranks (`x` itself in a single process)."""
    if not is_distributed():
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=_device_for_collectives())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_reduce_max(n: int) -> int:
    if not is_distributed():
        return int(n)
    t = torch.tensor([int(n)], dtype=torch.long, device=_device_for_collectives())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_min(n: int) -> int:
    return -all_reduce_max(-int(n))


def all_reduce_sums(values: Sequence[float]) -> list[float]:
    """Each of `values` summed over ranks, in one collective (`values` itself in a single process)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device_for_collectives())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


def all_sum_tensor(x: torch.Tensor) -> torch.Tensor:
    """A new tensor: `x` summed over ranks in float64, back in `x`'s dtype and device (`x`'s copy
    in a single process)."""
    if not is_distributed():
        return x.detach().clone()
    t = x.detach().to(device=_device_for_collectives(), dtype=torch.float64).clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.to(device=x.device, dtype=x.dtype)


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some rank (a collective: every rank asks together)."""
    return all_reduce_max(int(bool(flag))) > 0


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank `src`'s `obj` on every rank (pickled: for small objects such as a partition or a
    report); `obj` itself in a single process."""
    if not is_distributed():
        return obj
    box: list[Any] = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: T) -> list[T]:
    """`obj` from every rank, in rank order."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def rank_share(items: Sequence[T], *, unit: int = 1) -> list[T]:
    """This rank's contiguous share of `items`, cut at multiples of `unit` (a prompt group, an
    anchor batch) so no unit is split; shares differ by at most one unit."""
    k, r = world_size(), rank()
    units = -(-len(items) // unit)
    lo, hi = (units * r) // k, (units * (r + 1)) // k
    return list(items[lo * unit : hi * unit])


def aligned_batches(offset: int, n: int, size: int) -> list[tuple[int, int, int]]:
    """`(lo, hi, start)` for each piece of this rank's `n` items (global positions `offset` to
    `offset + n`) cut where one process cuts the whole list into batches of `size`; `start` is the
    global position of that batch's first item. A rank's share of a rollout list is sampled with
    the seeds of one process's batches (seed by `start`, each item by its place in the batch), so
    a group split across batches (GT injection leaves `n - r` rollouts of a group, V0.5's rounds
    one per prompt) samples as in one process. One process: `(s, s + size, s)` for each batch."""
    out = []
    lo = 0
    while lo < n:
        start = (offset + lo) // size * size
        hi = min(n, start + size - offset)
        out.append((lo, hi, start))
        lo = hi
    return out


def exclusive_prefix_sum(n: int) -> int:
    """The sum of `n` over the ranks before this one (0 on rank 0 and in a single process)."""
    return int(sum(all_gather_objects(int(n))[: rank()]))


# counts a rank reports over its own share, summed over ranks (a step's groups, evaluated questions, ...)
COUNT_KEYS = ("adv/num_groups", "mismatch/tokens", "eval/n", "v05/extra_rollouts")


def reduce_metrics(
    metrics: Mapping[str, float], weight: float, *, sum_prefixes: Sequence[str] = ("cost/",)
) -> dict[str, float]:
    """Each metric averaged over ranks, weighted by `weight` (e.g. the rank's trajectories);
    `time/*` take the slowest rank's value, `*/min` the smallest and `*/max`, `*_max` the
    largest; counts under `sum_prefixes` and in `COUNT_KEYS` are summed; `X/std` beside `X/mean`
    is pooled (the unbiased std of all ranks' values, `weight` values each). Keys present on only
    some ranks reduce over those."""
    if not is_distributed():
        return dict(metrics)
    rows = all_gather_objects((dict(metrics), float(weight)))
    keys = sorted({k for m, _ in rows for k in m})
    out: dict[str, float] = {}
    for key in keys:
        vals = [(m[key], w) for m, w in rows if key in m]
        if key.startswith("time/") or key.endswith(("/max", "_max")):
            out[key] = max(v for v, _ in vals)
        elif key.endswith("/min"):
            out[key] = min(v for v, _ in vals)
        elif key.endswith("/std") and all(key[: -len("std")] + "mean" in m for m, _ in rows if key in m):
            out[key] = _pooled_std([(m[key[: -len("std")] + "mean"], m[key], w) for m, w in rows if key in m])
        elif key.startswith(tuple(sum_prefixes)) or key in COUNT_KEYS:
            out[key] = sum(v for v, _ in vals)
        else:
            total = sum(w for _, w in vals)
            out[key] = sum(v * w for v, w in vals) / total if total > 0 else sum(v for v, _ in vals) / len(vals)
    return out


def _pooled_std(parts: Sequence[tuple[float, float, float]]) -> float:
    """The unbiased std of the union of groups given as (mean, unbiased std, count)."""
    n = sum(c for _, _, c in parts)
    if n < 2:
        return 0.0
    mean = sum(m * c for m, _, c in parts) / n
    ss = sum((c - 1) * s * s + c * (m - mean) ** 2 for m, s, c in parts if c > 0)
    return float((ss / (n - 1)) ** 0.5)


# ---- FSDP2 ------------------------------------------------------------------------------------
def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a transformers causal LM (`model.model.layers` for Llama/Qwen2
    families, possibly under a peft wrapper), the units FSDP2 shards one at a time."""
    for mod in model.modules():
        layers = getattr(mod, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return list(layers)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no `.layers` ModuleList)")


def broadcast_from_main(model: torch.nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers (warm starts may differ in the last bits)."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def shard(model: torch.nn.Module, *, compute_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """FSDP2 over the data-parallel ranks: each decoder layer, then the root (embeddings, final
    norm, LM head, tied weights included). With a bf16/fp16 compute dtype the gathered parameters
    are cast to it and gradients reduced in float32 (`MixedPrecisionPolicy`); the sharded
    parameters, the master copy the optimizer updates, stay float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype != torch.float32
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module, *, cpu_offload: bool = False) -> dict[str, torch.Tensor]:
    """The whole, unsharded state dict (a collective for a sharded model: every rank calls it);
    plain `state_dict()` for an unsharded one."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload))
    return {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}


def clip_grad_norm(parameters: Sequence[torch.nn.Parameter], max_norm: float | None) -> float:
    """The total gradient norm over all ranks' shards, clipped to `max_norm` when set."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)
