"""Whole weights of a (possibly sharded, possibly LoRA) policy, for what needs them all in one
place (a rollout engine, an unsharded copy): gathered with `distributed.full_state_dict`, a LoRA
policy's adapters merged in (`model.lora.merged_state_dict`). Apart from `distributed.py` because
it joins that module with the LoRA one, which itself gathers through `distributed.py`."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch

from pvpo.trainer.model.lora import is_lora, merged_state_dict
from pvpo.trainer.parallel.distributed import full_state_dict, is_sharded


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights under the plain transformers model's names: `full_state_dict`, or for a
    LoRA (peft) policy its adapters merged into the base weights (`lora.merged_state_dict`). A
    collective for a sharded model."""
    return merged_state_dict(model) if is_lora(model) else full_state_dict(model)


class FullStateView:
    """What `RolloutEngine.sync_weights` reads from a model (`state_dict()`), gathered whole from
    a sharded one (a LoRA policy's adapters merged in)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return plain_state_dict(self.model)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()


def unsharded_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain module with `model`'s whole weights (a collective when `model` is sharded); a
    sharded LoRA policy gives the plain model with its adapters merged in."""
    if not is_sharded(model):
        return copy.deepcopy(model)
    from transformers import AutoModelForCausalLM

    state = plain_state_dict(model)
    config = model.get_base_model().config if is_lora(model) else model.config  # type: ignore[operator]
    dtype = next(iter(state.values())).dtype
    with torch.random.fork_rng(devices=[]):  # the random init, overwritten below, leaves the run's RNG as it was
        full = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    full = full.to(next(iter(state.values())).device)
    full.load_state_dict(state)
    full.train(model.training)
    return full
