"""The rollout engine over the policy: built as its `EngineSpec` says, over whole weights under
torchrun, fed merged weights when the policy has LoRA adapters and the engine keeps its own copy.
Here, above the model and parallel rooms, because it joins them with the rollout room's engines
(neither of those rooms imports rollout)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.model.lora import MergedLoraView, apply_lora, is_lora
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.parallel.whole_weights import FullStateView, unsharded_copy
from pvpo.trainer.rollout.engine import EngineSpec, RolloutEngine, ViewSyncEngine, build_engine, engine_spec


def gathered_weights_engine(inner: RolloutEngine) -> RolloutEngine:
    """A rank's own engine over whole weights: `sync_weights(sharded)` gathers them first."""
    return ViewSyncEngine(inner, lambda m: FullStateView(m) if ddp.is_sharded(m) else m)  # type: ignore[arg-type,return-value]


def engine_for(
    build: Callable[..., RolloutEngine],
    model: torch.nn.Module,
    *,
    spec: EngineSpec,
    dtype: str,
    options: Mapping[str, Any],
    own_copy: bool = False,
    copy_dtype: str | None = None,
) -> RolloutEngine:
    """A rollout engine over `model`: `build(model=..., **options)` in a single process; under
    torchrun, over whole weights behind `gathered_weights_engine`: an engine with its own weights
    is given the module (a sharded one as an unsharded copy) and joins torchrun's launcher, one
    that samples from its module is given an unsharded copy. The run decides `dtype: auto` where
    the engine's spec asks (`EngineSpec.options`). `own_copy`: never sample from `model` itself
    (rollouts beside the update, which writes it), in a single process through the spec's
    `copy_options`, and an engine that copies (its `copy_options` not empty) is given the copy's
    dtype as `copy_dtype` (`rollout.copy_dtype`, resolved; None: the model's own)."""
    distributed = ddp.is_distributed()
    opts = spec.options(options, dtype=dtype, distributed=distributed)
    if not distributed:
        copying = dict(spec.copy_options) if own_copy else {}
        if copying and copy_dtype is not None:
            copying["copy_dtype"] = copy_dtype
        return build(model=model, **opts, **copying)
    if spec.own_weights and not ddp.is_sharded(model):
        return gathered_weights_engine(build(model=model, **opts))
    return gathered_weights_engine(build(model=unsharded_copy(model), **opts))


def engine_factory(cfg: TrainConfig, tokenizer: Any) -> Callable[[torch.nn.Module], RolloutEngine]:
    """`make(model)`: the configured rollout engine over `model`, with its `rollout.<engine>`
    options (under torchrun: over this rank's whole copy of the weights, `engine_for`), over its
    own copy of the weights when rollouts run beside the update (`rollout.max_staleness > 0`), in
    `rollout.copy_dtype` (auto: the update's compute dtype, `model.dtype` as the run resolved it)."""
    r = cfg.rollout
    copy_dtype = cfg.model.dtype if r.copy_dtype == "auto" else r.copy_dtype

    def make(model: torch.nn.Module) -> RolloutEngine:
        return engine_for(
            lambda **kw: build_engine(r.engine, tokenizer=tokenizer, **kw),
            model,
            spec=engine_spec(r.engine),
            dtype=cfg.model.dtype,
            options=r.engine_options(),
            own_copy=r.max_staleness > 0,
            copy_dtype=copy_dtype,
        )

    return make


def lora_engine(inner: RolloutEngine) -> RolloutEngine:
    """An engine with its own copy of the weights, fed merged LoRA weights after each step."""
    return ViewSyncEngine(inner, lambda m: MergedLoraView(m) if is_lora(m) else m)  # type: ignore[arg-type,return-value]


def owns_weights(engine: RolloutEngine, model: torch.nn.Module) -> bool:
    """True when `engine` samples from its own copy of the weights (vLLM, a copying transformers
    engine), not from `model` itself: such an engine needs syncing, and can be shut and built again."""
    return getattr(engine, "model", None) is not model


def with_lora(model: torch.nn.Module, engine: RolloutEngine, cfg: Any) -> tuple[torch.nn.Module, RolloutEngine]:
    """Add adapters per `cfg` (`ModelConfig.lora`) to the policy; an engine that samples from the
    policy module itself now samples from the adapted one, any other is wrapped to receive merged
    weights."""
    shares = not owns_weights(engine, model)
    peft_model = apply_lora(model, cfg)
    if shares:
        engine.model = peft_model  # type: ignore[attr-defined]
        return peft_model, engine
    return peft_model, lora_engine(engine)


@contextlib.contextmanager
def engine_asleep(engine: RolloutEngine) -> Iterator[None]:
    """`engine` asleep for the block (its KV cache free while the trainer holds activations and
    grads), awake again after it (evaluation and the next rollouts sample)."""
    engine.sleep()
    try:
        yield
    finally:
        engine.wake_up()
