"""LoRA fine-tuning through peft (`model.lora.enabled`): adapters on the attention and MLP
projections train, the base weights stay frozen (Hu et al. 2021, arXiv:2106.09685).

What leaves the trainer is always plain, merged weights under the base model's parameter names,
so nothing downstream knows about adapters: a vLLM engine receives `W + (alpha/r) B A` after each
step (`pvpo.trainer.policy_engine.lora_engine` over `MergedLoraView`), and a checkpoint's
`policy/` folder holds the merged model (loaded
directly by transformers and vLLM) with the adapter beside it in `adapter/` (`LoraCheckpointView`),
from which a resume restores the trainable state. The transformers engine samples from the trained
module itself, adapters included, and needs no merging.

Under torchrun the peft model is sharded with FSDP2 like any policy (`distributed.shard`: each
decoder layer, adapters included, then the root), not replicated under DDP for its adapters: the
frozen base keeps float32 master weights, and a replica of it on every rank is the memory FSDP2
exists to save (a base that does not fit one GPU still trains); one sharding also keeps one
checkpoint path (DCP) and one set of collectives for every policy. FSDP2 shards frozen and
trainable parameters of one module together and reduces gradients of the trainable ones only.
The merged weights are then computed from the gathered state dict (`merge_lora_state`, the
formula peft's `merge_adapter` applies in one process).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ADAPTER_DIR = "adapter"


def is_lora(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def check_target_modules(model: torch.nn.Module, target_modules: Sequence[str]) -> None:
    """A ValueError naming `model.lora.target_modules` and the model's linear layers when one of
    `target_modules` names no module of `model`."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in present]
    if missing:
        raise ValueError(
            f"model.lora.target_modules {missing} are not modules of {type(model).__name__}; "
            f"its linear layers include {sorted(n for n in present if n.endswith('proj'))}"
        )


def add_lora(
    model: torch.nn.Module, *, r: int, alpha: int, dropout: float, target_modules: Sequence[str]
) -> torch.nn.Module:
    """`model` with LoRA adapters on `target_modules` (a peft `PeftModel`; only adapters train)."""
    from peft import LoraConfig, get_peft_model

    check_target_modules(model, target_modules)
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def lora_scalings(model: Any) -> dict[str, float]:
    """Module name (as in the peft model's state dict) -> its adapter's scaling (alpha / r), for
    every LoRA layer of `model`'s active adapter."""
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    return {
        name: float(mod.scaling[adapter])
        for name, mod in model.named_modules()
        if isinstance(mod, LoraLayer) and adapter in mod.scaling
    }


def merge_lora_state(
    state: dict[str, torch.Tensor], scalings: dict[str, float], adapter: str = "default"
) -> dict[str, torch.Tensor]:
    """The merged weights, under the base model's names, from a peft model's whole state dict:
    `W + (B @ A) * scaling` for each LoRA layer (Hu et al. 2021, arXiv:2106.09685, Eq. 3; peft's
    `get_delta_weight` for a linear layer), adapters dropped, `base_model.model.` and
    `.base_layer` removed from the names."""
    out: dict[str, torch.Tensor] = {}
    suffix = ".base_layer.weight"
    for name, t in state.items():
        if "lora_" in name:
            continue
        if name.endswith(suffix) and name[: -len(suffix)] in scalings:
            mod = name[: -len(suffix)]
            a, b = state[f"{mod}.lora_A.{adapter}.weight"], state[f"{mod}.lora_B.{adapter}.weight"]
            t = t + (b @ a) * scalings[mod]
        key = name.replace(".base_layer.", ".").removeprefix("base_model.model.")
        out[key] = t.detach().clone()
    return out


def merged_state_dict(model: Any, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The merged weights of a peft model under the base model's names (copies; the model is
    left unmerged, ready to train on). A sharded model's are merged from its gathered state dict
    (a collective), or from `state` when the caller has gathered it already."""
    from pvpo.trainer.parallel.distributed import full_state_dict, is_sharded

    if state is not None or is_sharded(model):
        full = state if state is not None else full_state_dict(model)
        return merge_lora_state(full, lora_scalings(model), model.active_adapter)
    model.merge_adapter()
    try:
        out = {}
        for name, t in model.get_base_model().state_dict().items():
            if "lora_" in name:
                continue
            out[name.replace(".base_layer.", ".")] = t.detach().clone()
        return out
    finally:
        model.unmerge_adapter()


class MergedLoraView:
    """What `RolloutEngine.sync_weights` reads (`state_dict()`), merged."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return merged_state_dict(self.model)

    def parameters(self) -> Any:
        return self.model.parameters()


def apply_lora(model: torch.nn.Module, cfg: Any) -> Any:
    """The policy with adapters per `cfg` (`ModelConfig.lora`)."""
    return add_lora(model, r=cfg.r, alpha=cfg.alpha, dropout=cfg.dropout, target_modules=cfg.target_modules)


class LoraCheckpointView:
    """Stands for a peft model in `checkpoint.save_checkpoint`: `save_pretrained(<ckpt>/policy)`
    writes the merged model there and the adapter to `<ckpt>/adapter`. A sharded model's whole
    state dict, gathered by the caller, comes as `state_dict`."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def save_pretrained(
        self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None, **kwargs: Any
    ) -> None:
        path = Path(path)
        if state_dict is None:
            self.model.save_pretrained(path.parent / ADAPTER_DIR)
        else:  # peft picks the adapter's entries out of the whole state dict
            self.model.save_pretrained(path.parent / ADAPTER_DIR, state_dict=state_dict)
        base = self.model.get_base_model()
        base.save_pretrained(path, state_dict=merged_state_dict(self.model, state_dict), **kwargs)


def checkpoint_view(model: Any) -> Any:
    """What to hand `save_checkpoint` as the model: a `LoraCheckpointView` for a peft model."""
    return LoraCheckpointView(model) if is_lora(model) else model


def checkpointed_module(model: Any) -> Any:
    """The module behind what `checkpoint_view` returned (the peft model behind its view)."""
    return model.model if isinstance(model, LoraCheckpointView) else model


def load_lora_weights(model: Any, ckpt: str | Path) -> None:
    """Restore a peft model's adapters from a checkpoint's `adapter/` folder."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(ckpt) / ADAPTER_DIR
    files = sorted(folder.glob("adapter_model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no adapter_model.safetensors: is this a LoRA run's checkpoint?")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    if unexpected:
        raise ValueError(f"{folder}: adapter keys the model does not have: {unexpected[:5]}")
