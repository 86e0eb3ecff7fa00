"""The transformers engine hands the KV cache to a forward under the name that forward takes
(`cache` in transformers 5.24, `past_key_values` before), so generation raises no deprecation
warning where the new name exists and still works where it does not."""

from __future__ import annotations

import asyncio
import inspect
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from trainer_support import WORLD, policy  # noqa: F401 (fixture)

from pvpo.trainer.rollout.cache_args import kv_cache_keyword, returned_kv_cache
from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.rollout.hf_scheduler import ContinuousBatcher


class _NewForward:
    def forward(self, input_ids: Any, cache: Any = None, use_cache: bool = True) -> None: ...


class _OldForward:
    def forward(self, input_ids: Any, past_key_values: Any = None, use_cache: bool = True) -> None: ...


class _HiddenForward:  # peft's wrapper: *args, **kwargs
    def forward(self, *args: Any, **kwargs: Any) -> None: ...


@dataclass
class _NewOutput:
    logits: Any = None
    cache: Any = None


def test_the_cache_goes_under_the_name_the_forward_takes():
    assert kv_cache_keyword(_NewForward()) == "cache"
    assert kv_cache_keyword(_OldForward()) == "past_key_values"
    assert kv_cache_keyword(_HiddenForward()) == "past_key_values"
    peft_like = _HiddenForward()
    peft_like.get_base_model = lambda: _NewForward()  # type: ignore[attr-defined]
    assert kv_cache_keyword(peft_like) == "cache"  # the wrapped model's forward decides


def test_the_returned_cache_is_read_under_either_name():
    kv = object()
    assert returned_kv_cache(_NewOutput(cache=kv)) is kv
    assert returned_kv_cache(SimpleNamespace(logits=None, past_key_values=kv)) is kv


def test_generation_with_the_installed_transformers_raises_no_cache_deprecation(policy, monkeypatch):
    if "cache" not in inspect.signature(policy.model.forward).parameters:
        pytest.skip("this transformers' forward takes past_key_values only: nothing is deprecated")
    from transformers.utils import generic

    said: list[str] = []  # transformers logs the output attribute's deprecation once per process
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a, **k: said.append(str(msg)))
    eng = HFEngine(policy.model, policy.tokenizer)
    prompts = [policy.tokenizer.encode(q.question) for q in WORLD.questions("train")[:3]]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=6)

    async def batched() -> list[Any]:
        with ThreadPoolExecutor(1) as pool:
            sched = ContinuousBatcher(eng, pool, max_batch=4)
            return list(await asyncio.gather(*(sched.generate(p, sampling) for p in prompts)))

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")  # the forward's keyword
        sync = eng.generate(prompts, sampling)
        cont = asyncio.run(batched())
    assert not [m for m in said if "past_key_values" in m]
    assert [c.token_ids for c in sync] == [c.token_ids for c in cont] and all(c.token_ids for c in sync)


def test_a_lora_wrapped_policy_passes_the_cache_under_the_wrapped_models_name(policy):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    if "cache" not in inspect.signature(policy.model.forward).parameters:
        pytest.skip("this transformers' forward takes past_key_values only: nothing is deprecated")
    import copy

    wrapped = get_peft_model(copy.deepcopy(policy.model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert kv_cache_keyword(wrapped) == "cache"
    prompts = [policy.tokenizer.encode(q.question) for q in WORLD.questions("train")[:2]]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        out = HFEngine(wrapped, policy.tokenizer).generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert all(c.token_ids for c in out)
