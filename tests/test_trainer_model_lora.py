"""LoRA through peft: only the adapters train, checkpoints hold a merged HF folder that resumes and
loads into the plain model with the adapted outputs."""

from __future__ import annotations

import pytest
import torch

from pvpo.trainer.config.policy import TinyModelConfig
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.policy import build_tiny_model, train_tokenizer

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=300)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], vocab_size=300)


def _model(tok):
    return build_tiny_model(tok, TINY, seed=1)


# ---- LoRA --------------------------------------------------------------------------------------
def test_lora_trains_only_adapters_and_checkpoints_a_merged_hf_folder_that_resumes(tmp_path):
    from trainer_support import TINY as TINY_RUN
    from trainer_support import WORLD, OverlapSearcher
    from transformers import AutoModelForCausalLM

    from pvpo.trainer.loop import train

    over = [
        *TINY_RUN,
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "optim.lr=0.05",
        "optim.kl_coef=0.05",
        "optim.entropy_coef=0.05",
    ]  # entropy: a gradient even when every reward is 0
    searcher = OverlapSearcher(WORLD.passages)
    run = tmp_path / "run"
    train(load_config(None, [*over, "run.steps=1"]), run, searcher=searcher, show_progress=False)
    ckpt = run / "checkpoints" / "step_000001"
    assert (ckpt / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(ckpt / "policy"))  # a plain HF folder, adapters merged in
    base = AutoModelForCausalLM.from_pretrained(str(run / "initial_policy"))
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert changed and all(
        k.split(".")[-2] in targets and k.endswith(".weight") for k in changed
    )  # only adapted projections

    result = train(load_config(None, [*over, "run.steps=2"]), run, resume=True, searcher=searcher, show_progress=False)
    assert [r["step"] for r in result.metrics] == [1, 2]
    again = AutoModelForCausalLM.from_pretrained(str(run / "checkpoints" / "step_000002" / "policy"))
    assert any(not torch.equal(v, merged.state_dict()[k]) for k, v in again.state_dict().items())


def test_merged_lora_weights_load_into_the_plain_model_and_give_the_adapted_outputs(tok):
    from pvpo.trainer.model.lora import add_lora, merged_state_dict

    peft_model = add_lora(_model(tok), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at 0: give the adapters an effect
    plain = _model(tok)
    plain.load_state_dict(merged_state_dict(peft_model))  # base names, nothing missing or extra
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, peft_model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(_model(tok)(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-3)
    with pytest.raises(ValueError, match="not modules"):
        add_lora(_model(tok), r=4, alpha=8, dropout=0.0, target_modules=["qkv"])
