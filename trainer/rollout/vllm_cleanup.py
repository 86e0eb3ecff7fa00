"""What a shut vLLM engine leaves behind in vLLM 0.32's process-wide state, dropped so that the
engine's memory goes back (the CPU engine is shut for each update: `vllm_engine.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def forget_reload_records(llm: Any) -> None:
    """Drop what vLLM's in-place reload recorded about `llm`'s layers. vLLM 0.32 keeps it in a
    module-level WeakKeyDictionary (`reload.layerwise.LAYERWISE_INFO`) whose values reach back to
    their layer keys (a parameter's `weight_loader` is bound to its layer), so a model that was
    ever reloaded outlives its engine: measured 0.4 GiB kept per shut engine for SmolLM2."""
    try:
        from vllm.model_executor.model_loader.reload import layerwise
    except ImportError:  # a vLLM without the in-place reload keeps no such records
        return
    records = getattr(layerwise, "LAYERWISE_INFO", None)
    if records is None:
        return

    def forget(model: torch.nn.Module) -> None:
        for module in model.modules():
            records.pop(module, None)

    llm.apply_model(forget)


def clear_signature_cache() -> None:
    """Empty vLLM's cache of callables' keyword support (`utils.func_utils._supports_kw`, an
    unbounded-lifetime lru_cache): its keys are an engine's tokenizer-pool methods, which keep
    that engine's tokenizer copies alive after shutdown (measured: two tokenizers, ~39 MiB, per
    shut SmolLM2 engine). Entries are recomputed on the next call."""
    try:
        from vllm.utils import func_utils
    except ImportError:
        return
    clear = getattr(getattr(func_utils, "_supports_kw", None), "cache_clear", None)
    if clear is not None:
        clear()
