"""The vLLM engine's shut-and-rebuild on CPU (no sleep mode there) against a real vLLM: a shut
engine leaves nothing behind, and an engine is never shut while another one of the process runs.
Its own module: the engine tests' shared engine would be that other engine. Skipped without vLLM."""

from __future__ import annotations

import os

import pytest

from pvpo.trainer.rollout.engine import SamplingConfig, build_engine
from tests.test_trainer_rollout_vllm_engine import (
    _prompt,
    needs_vllm,
    policy,  # noqa: F401 - the engine tests' tiny policy, built again for this module
)


def _engine(policy):  # type: ignore[no-untyped-def]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import bm25s  # noqa: F401 - as in the engine tests: loaded before vLLM's start-up scan

    return build_engine(
        "vllm",
        model=policy.model,
        tokenizer=policy.tokenizer,
        dtype="bfloat16",
        max_model_len=512,
        kv_cache_memory_bytes=32 << 20,
    )


def _live_vllm_modules() -> int:
    """torch modules of vLLM's (its models' layers) that the interpreter still holds."""
    import gc

    import torch

    gc.unfreeze()  # vLLM freezes every object at start-up, which hides them from get_objects
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, torch.nn.Module) and str(getattr(type(o), "__module__", "")).startswith("vllm.")
    )


@needs_vllm
@pytest.mark.vllm
def test_a_shut_engine_leaves_neither_its_model_nor_its_tokenizers_behind(policy) -> None:  # type: ignore[no-untyped-def]
    # bf16: vLLM's CPU build repacks bf16 linear weights, the layers whose reload records held them
    modules = _live_vllm_modules()
    eng = _engine(policy)
    try:
        eng.sync_weights(policy.model)  # an in-place reload: vLLM records the layers it reloaded
        eng.sleep()
        assert _live_vllm_modules() == modules, "the shut engine's model is still alive"
        for _ in range(2):
            eng.wake_up()
            eng.generate([_prompt(policy, "Question:")], SamplingConfig(temperature=0.0, max_new_tokens=3))
            eng.sync_weights(policy.model)
            eng.sleep()
            assert _live_vllm_modules() == modules
            # vLLM 0.32 keys this cache by an engine's tokenizer-pool methods: an entry holds that
            # engine's tokenizer copies (two SmolLM2 tokenizers, 39 MiB, per shut engine)
            from vllm.utils.func_utils import _supports_kw

            assert _supports_kw.cache_info().currsize == 0, "the shut engine's tokenizer pool is still cached"
    finally:
        eng.close()


@needs_vllm
@pytest.mark.vllm
def test_an_engine_is_not_shut_while_another_engine_of_the_process_runs(policy) -> None:  # type: ignore[no-untyped-def]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    prompt = _prompt(policy, "Question:")
    first, second = _engine(policy), _engine(policy)
    try:
        first.sleep()
        assert first.llm is not None, "shutting it would take down the other engine's parallel state"
        assert second.generate([prompt], greedy)[0].token_ids == first.generate([prompt], greedy)[0].token_ids
    finally:
        second.close()
        first.close()
