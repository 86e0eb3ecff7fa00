"""LoRA fine-tuning through peft (`model.lora.enabled`): adapters on the attention and MLP
projections train, the base weights stay frozen (Hu et al. 2021, arXiv:2106.09685).

What leaves the trainer is always plain, merged weights under the base model's parameter names,
so nothing downstream knows about adapters: a vLLM engine receives `W + (alpha/r) B A` after each
step (`pvpo.trainer.policy_engine.lora_engine` over `MergedLoraView`), and a checkpoint's `policy/` folder holds the merged model (loaded
directly by transformers and vLLM) with the adapter beside it in `adapter/` (`LoraCheckpointView`),
from which a resume restores the trainable state. The transformers engine samples from the trained
module itself, adapters included, and needs no merging. Single process only: under torchrun the
run stops at start-up with an error (FSDP2 over peft modules is not covered here).
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


def add_lora(
    model: torch.nn.Module, *, r: int, alpha: int, dropout: float, target_modules: Sequence[str]
) -> torch.nn.Module:
    """`model` with LoRA adapters on `target_modules` (a peft `PeftModel`; only adapters train)."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in present]
    if missing:
        raise ValueError(
            f"model.lora.target_modules {missing} are not modules of {type(model).__name__}; "
            f"its linear layers include {sorted(n for n in present if n.endswith('proj'))}"
        )
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The merged weights of a peft model under the base model's names (copies; the model is
    left unmerged, ready to train on)."""
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
    """The policy with adapters per `cfg` (`ModelConfig.lora`); single process only."""
    from pvpo.trainer.parallel.distributed import is_distributed

    if is_distributed():
        raise ValueError(
            "model.lora.enabled is single-process only; run without torchrun (--nproc 1) or set model.lora.enabled=false"
        )
    return add_lora(model, r=cfg.r, alpha=cfg.alpha, dropout=cfg.dropout, target_modules=cfg.target_modules)


class LoraCheckpointView:
    """Stands for a peft model in `checkpoint.save_checkpoint`: `save_pretrained(<ckpt>/policy)`
    writes the merged model there and the adapter to `<ckpt>/adapter`."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> None:
        path = Path(path)
        self.model.save_pretrained(path.parent / ADAPTER_DIR)
        base = self.model.get_base_model()
        base.save_pretrained(path, state_dict=merged_state_dict(self.model), **kwargs)


def checkpoint_view(model: Any) -> Any:
    """What to hand `save_checkpoint` as the model: a `LoraCheckpointView` for a peft model."""
    return LoraCheckpointView(model) if is_lora(model) else model


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
