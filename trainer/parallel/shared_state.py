"""The method's own state under torchrun: made once, the same on every rank, written by rank 0.

PVPO's reference machinery and the estimators' states are built from the whole training pool,
not from a rank's share of a step, so every rank must hold the same copy:

- the anchor: its prompts split over the ranks, the statistics gathered
  (`reference.machinery.build_anchor_sharded`);
- Group Sampling's partition: computed by every rank from that same anchor, then rank 0's copy
  (its report holds rank 0's timings) broadcast (`torch.distributed.broadcast_object_list`), so
  the prompt pool each step draws from is one list;
- the GT set: each rank asks the GT source for its share of the never-solved prompts and every
  rank receives all the trajectories (`reference/sharded_gt.py`); pi_gt from the sharded reference is then
  computed by every rank on the same list (FSDP's forwards are collectives), so every rank caches
  the same records; the GT source's cost is counted once (rank 0);
- the files (`anchor.json`, `group_sampling.json`, `gt_cache.json`, `value_model.json`) are
  written by rank 0 alone, atomically (`pvpo.atomic`); on resume rank 0 restores them from the
  checkpoint and every rank reads them;
- the estimators' states get the collectives they need through `data_parallel`
  (`algorithms.data_parallel.DataParallel`): PPO's critic sharded like the policy, V0.5's value
  model fed every rank's entries, GDPO's and PPO's batch statistics pooled over the ranks.

With deterministic GT sources (`oracle`, `dataset`) two ranks build what one process builds; a
sampling source (`model`) samples each rank's share with its attempt's seed.
"""

from __future__ import annotations

from typing import Any

import torch

from pvpo.trainer.algorithms.data_parallel import SINGLE, DataParallel
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.parallel.whole_weights import unsharded_copy


def data_parallel(compute_dtype: torch.dtype = torch.float32) -> DataParallel:
    """The collectives of this torchrun run for an estimator's state (a single process's outside
    torchrun); `shard` applies FSDP2 with the policy's compute dtype."""
    if not ddp.is_distributed():
        return SINGLE

    def shard(module: torch.nn.Module) -> torch.nn.Module:
        return ddp.shard(module, compute_dtype=compute_dtype)

    def all_gather(obj: Any) -> list[Any]:
        return ddp.all_gather_objects(obj)

    return DataParallel(
        world_size=ddp.world_size(),
        is_main=ddp.is_main(),
        all_gather=all_gather,
        all_sum=ddp.all_sum_tensor,
        all_max=ddp.all_reduce_max,
        any_rank=ddp.any_rank,
        shard=shard,
        whole=unsharded_copy,
        clip_grad_norm=lambda params, max_norm: ddp.clip_grad_norm(list(params), max_norm),
    )
