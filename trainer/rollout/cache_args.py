"""How a transformers forward takes and returns its KV cache, across transformers versions."""

from __future__ import annotations

import inspect
from typing import Any


def kv_cache_keyword(model: Any) -> str:
    """The keyword the model's forward takes its KV cache by: `cache` where the forward names it (as
    in transformers 5.24, which deprecates `past_key_values` for removal in 5.40), else
    `past_key_values` (earlier versions, and forwards that hide their signature). A peft wrapper
    passes its keywords through to the model it wraps, so that model's forward decides. Read it
    once per engine, not per decoding step: it inspects a signature."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def returned_kv_cache(out: Any) -> Any:
    """The KV cache a forward returned: its `cache` field where the output type has one
    (as in transformers 5.24), else `past_key_values`."""
    return out.cache if "cache" in getattr(out, "__dataclass_fields__", {}) else out.past_key_values
