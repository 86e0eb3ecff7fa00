"""The transformers engine's registration (`rollout.engine: hf`): its spec, read at config load, and
a factory that imports the engine (`hf_engine`, which imports torch) only when it builds one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pvpo.trainer.rollout.engine import register_engine

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from pvpo.trainer.rollout.hf_engine import HFEngine


@register_engine("hf", partial_rollouts=True, copy_options={"share_weights": False})
def build_hf(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **kwargs: Any) -> HFEngine:
    """An `HFEngine` sampling from `model` (its own copy with `share_weights=False`)."""
    from pvpo.trainer.rollout.hf_engine import HFEngine

    return HFEngine(model, tokenizer, **kwargs)


def __getattr__(name: str) -> Any:
    """`HFEngine`, imported when first asked for: the factory's return annotation names it, and
    `pvpo eval --engine-option` reads the engine's keywords from it."""
    if name == "HFEngine":
        from pvpo.trainer.rollout.hf_engine import HFEngine

        return HFEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
