"""The transformers engine's own copy of the weights (rollouts beside the update,
`rollout.max_staleness > 0`): held in `rollout.copy_dtype` (auto: the update's compute dtype) so the
run does not hold a second float32 copy and a float32 KV cache beside the update, its buffers and
tied weights kept, the trainer's weights loaded into it cast; at eta 0 the engine still samples from
the trainer's own module."""

from __future__ import annotations

import pytest
import torch
from trainer_support import TINY, policy  # noqa: F401 (fixture)

from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.policy_engine import engine_factory
from pvpo.trainer.rollout.cache_args import returned_kv_cache
from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.hf_engine import HFEngine, own_copy
from pvpo.trainer.rollout.kv_cache import kv_layers


def _dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


def test_the_engines_own_copy_holds_its_weights_in_copy_dtype_keeping_buffers_and_ties(policy):
    model = policy.model
    copy = own_copy(model, "bfloat16")
    assert _dtypes(copy) == {torch.bfloat16} and _dtypes(model) == {torch.float32}  # the trainer's untouched
    buffers = dict(copy.named_buffers())
    assert all(b.dtype == dict(model.named_buffers())[n].dtype for n, b in buffers.items())  # rotary inv_freq
    assert copy.get_output_embeddings().weight is copy.get_input_embeddings().weight  # still one tied matrix
    assert sum(p.numel() * p.element_size() for p in copy.parameters()) * 2 == sum(
        p.numel() * p.element_size() for p in model.parameters()
    )
    with pytest.raises(ValueError, match="copy_dtype"):
        own_copy(model, "int8")


def test_a_16_bit_engine_copy_loads_the_trainers_weights_cast_and_samples_with_a_16_bit_kv_cache(policy):
    engine = HFEngine(policy.model, policy.tokenizer, share_weights=False, copy_dtype="bfloat16")
    trained = own_copy(policy.model, None)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    engine.sync_weights(trained)
    for (name, p), q in zip(engine.model.named_parameters(), trained.parameters(), strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q.to(torch.bfloat16)), name

    seen: list[torch.dtype] = []
    engine.model.register_forward_hook(
        lambda _m, _args, out: seen.extend(k.dtype for k, _ in kv_layers(returned_kv_cache(out)))
    )
    ids = policy.tokenizer("Oslo is the capital")["input_ids"]
    (done,) = engine.generate([ids], SamplingConfig(temperature=0.0, max_new_tokens=3, seed=0))
    assert len(done.token_ids) >= 1 and seen and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize(
    ("overrides", "copied", "dtype"),
    [
        (["rollout.max_staleness=1", "model.dtype=bfloat16"], True, torch.bfloat16),  # auto: the update's dtype
        (["rollout.max_staleness=1", "model.dtype=bfloat16", "rollout.copy_dtype=float32"], True, torch.float32),
        (["rollout.max_staleness=1", "model.dtype=float32"], True, torch.float32),
        (["rollout.max_staleness=0", "model.dtype=bfloat16"], False, torch.float32),  # eta 0: the trainer's module
    ],
    ids=["eta1-auto-bf16", "eta1-float32-kept", "eta1-auto-float32", "eta0-shared"],
)
def test_the_trainers_engine_copies_the_weights_in_rollout_copy_dtype_only_beside_the_update(
    policy, overrides, copied, dtype
):
    cfg = load_config(None, [*TINY, "rollout.engine=hf", *overrides])
    engine = engine_factory(cfg, policy.tokenizer)(policy.model)
    assert (engine.model is not policy.model) == copied  # type: ignore[attr-defined]
    assert _dtypes(engine.model) == {dtype}  # type: ignore[attr-defined]


def test_an_unknown_copy_dtype_is_refused_at_config_load():
    with pytest.raises(ConfigError, match=r"rollout\.copy_dtype"):
        load_config(None, ["rollout.copy_dtype=int8"])
