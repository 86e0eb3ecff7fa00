"""One device, at scale: token-budget micro-batches that reproduce the whole batch's gradient,
bf16 autocast and gradient checkpointing on CPU, the Search-R1 prompt template, the placement
config keys, and (marked gpu) the same on CUDA."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.templates import get_template, render_prompt
from pvpo.reward import RESEARCH, SEARCH_R1
from pvpo.trainer.config.schema import ConfigError, TinyModelConfig, load_config
from pvpo.trainer.model.device import place_policy_model, placement
from pvpo.trainer.model.micro_batch import accumulate, micro_batches, plan_micro_batches, row_lengths, trim_columns
from pvpo.trainer.model.policy import build_tiny_model, train_tokenizer
from pvpo.trainer.model.update import batch_logprobs, loss_config, micro_batch_loss
from pvpo.trainer.parallel.distributed import torchrun_command
from pvpo.trainer.rollout.trajectory import Trajectory, collate

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=300)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], vocab_size=300)


def _model(tok):
    return build_tiny_model(tok, TINY, seed=1)


def _trajs(n: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories of very different lengths, env tokens between model turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = Trajectory(uid=f"q{i // 2}", prompt_ids=[rng.randrange(1, vocab) for _ in range(rng.randint(3, 12))])
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(2, 30)
            t.append_model([rng.randrange(1, vocab) for _ in range(k)], [-rng.random() * 3 for _ in range(k)])
            t.append_env([rng.randrange(1, vocab) for _ in range(rng.randint(0, 9))])
        t.reward = rng.random()
        out.append(t)
    return out


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


# ---- micro-batching ----------------------------------------------------------------------------
def test_plan_keeps_every_row_once_within_the_token_budget():
    pl, rl = [5, 40, 3, 12, 7, 90], [30, 10, 2, 50, 8, 5]
    plan = plan_micro_batches(range(6), pl, rl, max_tokens=100)
    assert sorted(i for m in plan for i in m) == list(range(6))
    for m in plan:
        assert len(m) == 1 or len(m) * (max(pl[i] for i in m) + max(rl[i] for i in m)) <= 100
    # a forced minimum count splits the largest micro-batches, then pads with empty ones
    assert len(plan_micro_batches(range(2), pl, rl, max_tokens=10_000, min_count=4)) == 4
    assert plan_micro_batches([0, 1], pl, rl, parts=2, min_count=3)[-1] == []


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_micro_batches_accumulate_the_gradient_of_the_whole_batch(tok, agg):
    model = _model(tok)
    batch = collate(_trajs(8, len(tok)), tok.pad_token_id)
    cfg = load_config(None, [f"optim.loss_agg={agg}", "optim.kl_coef=0.05", "optim.entropy_coef=0.01"])
    loss_cfg = loss_config(cfg.optim, norm_len=batch.loss_mask.shape[-1])
    adv = torch.linspace(-1, 1, len(batch))
    ref_lp = batch.old_logprobs - 0.1

    def loss_fn(mb):
        ix, r = mb.rows, mb.r
        loss, stats, _ = micro_batch_loss(
            model, mb.batch, adv[ix], loss_cfg, temperature=1.0, ref_logprobs=ref_lp[ix, :r]
        )
        return loss, stats

    whole, _, _ = micro_batch_loss(model, batch, adv, loss_cfg, temperature=1.0, ref_logprobs=ref_lp)
    whole.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    micros = micro_batches(batch, list(range(len(batch))), agg=agg, max_tokens=96)
    assert len(micros) >= 3 and all(mb.batch.input_ids.numel() <= 96 or len(mb.rows) == 1 for mb in micros)
    loss, _ = accumulate(micros, loss_fn)
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    for g, e in zip(_grads(model), expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_trimmed_micro_batches_give_the_same_logprobs(tok):
    model = _model(tok).eval()
    batch = collate(_trajs(6, len(tok), seed=3), tok.pad_token_id)
    full = batch_logprobs(model, batch, 0.7, micro=len(batch))
    small = batch_logprobs(model, batch, 0.7, max_tokens=64)
    m = batch.attention_mask[:, batch.prompt_len :] > 0
    torch.testing.assert_close(small[m], full[m], rtol=1e-4, atol=1e-5)
    sub, r = trim_columns(batch.select([2]))
    pl, rl = row_lengths(batch)
    assert sub.input_ids.shape[1] == pl[2] + rl[2] and r == rl[2]


# ---- precision and activation checkpointing ----------------------------------------------------
def test_bf16_autocast_computes_in_bf16_and_keeps_float32_master_weights(tok):
    where = placement("cpu", "bfloat16")
    model = place_policy_model(_model(tok), where)
    batch = collate(_trajs(4, len(tok)), tok.pad_token_id)
    with torch.no_grad():
        fp32 = batch_logprobs(model, batch, 1.0)
        with where.autocast():
            bf16 = batch_logprobs(model, batch, 1.0)
            logits = model(input_ids=batch.input_ids[:, :4]).logits
    assert logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    m = batch.loss_mask > 0
    gap = (bf16 - fp32)[m].abs().max()
    assert 0 < float(gap) < 0.1  # bf16 rounding shows, but stays small on log-probs of ~-6


def test_gradient_checkpointing_gives_the_same_gradients(tok):
    batch = collate(_trajs(4, len(tok), seed=5), tok.pad_token_id)
    cfg = load_config(None, [])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    grads = []
    for ckpt in (False, True):
        model = place_policy_model(_model(tok), placement("cpu", "float32", gradient_checkpointing=ckpt)).train()
        flag = (
            "is_activation_checkpointing"
            if hasattr(type(model), "is_activation_checkpointing")
            else "is_gradient_checkpointing"
        )
        assert getattr(model, flag) == ckpt
        loss, _, _ = micro_batch_loss(model, batch, adv, loss_config(cfg.optim), temperature=1.0)
        loss.backward()
        grads.append(_grads(model))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_one_training_step_in_bf16_with_checkpointing_and_token_micro_batches(tmp_path):
    from test_trainer_core import TINY as TINY_RUN
    from test_trainer_core import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "run.steps=1",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "optim.max_tokens_per_micro_batch=256",
            "optim.kl_coef=0.05",
            "model.device=cpu",
        ],
    )
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    row = result.metrics[-1]
    assert row["step"] == 1 and torch.isfinite(torch.tensor(row["loss/mini_batch"])) and row["grad_norm"] > 0


# ---- templates and config ----------------------------------------------------------------------
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: who wrote hamlet?\n"
)


def test_search_r1_template_is_search_r1s_training_prompt():
    assert render_prompt("search_r1", SEARCH_R1, "  who wrote hamlet ") == SEARCH_R1_PROMPT
    assert render_prompt("search_r1", SEARCH_R1, "who wrote hamlet?") == SEARCH_R1_PROMPT
    ep = EpisodeConfig(protocol="search_r1", prompt_template="search_r1")
    assert (
        ep.prompt(QAExample(uid="a", question="who wrote hamlet", golden_answers=["Shakespeare"])) == SEARCH_R1_PROMPT
    )
    # tags follow the protocol in use; the default template and plain format strings still work
    assert "<result> and </result>" in render_prompt("search_r1", RESEARCH, "q")
    assert render_prompt("default", SEARCH_R1, "q") == f"{SEARCH_R1.instruction()} Question: q\n"
    assert render_prompt("Q: {question}", SEARCH_R1, "q") == "Q: q"
    assert get_template("search_r1").prompt_template == "search_r1"


def test_config_names_bad_placement_keys_and_lists_the_choices():
    with pytest.raises(ConfigError, match=r"model\.device.*auto"):
        load_config(None, ["model.device=tpu"])
    with pytest.raises(ConfigError, match=r"model\.attn_implementation.*sdpa"):
        load_config(None, ["model.attn_implementation=xformers"])
    with pytest.raises(ConfigError, match=r"env\.prompt_template.*search_r1"):
        load_config(None, ["env.prompt_template=nope"])
    cfg = load_config(
        None, ["model.device=cuda:1", "optim.max_tokens_per_micro_batch=4096", "env.prompt_template=search_r1"]
    )
    assert (cfg.model.device, cfg.optim.max_tokens_per_micro_batch) == ("cuda:1", 4096)


def test_auto_device_is_cpu_without_cuda_and_flash_attention_falls_back_to_sdpa():
    where = placement("auto", "bfloat16", "flash_attention_2")
    if not torch.cuda.is_available():
        assert where.device.type == "cpu" and where.attn_implementation == "sdpa"
        with pytest.raises(ValueError, match="CUDA is not available"):
            placement("cuda")


def test_nproc_shortcut_runs_the_same_command_under_torchrun():
    cmd = torchrun_command(2, ["train", "--config", "c.yaml", "--nproc", "2", "run.steps=3", "--nproc=2"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[5:] == ["-m", "pvpo.cli", "train", "--config", "c.yaml", "run.steps=3"]


# ---- GPU ---------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_tiny_qwen2_trains_in_bf16_on_cuda_with_the_hf_engine(tmp_path):
    from test_trainer_core import TINY as TINY_RUN
    from test_trainer_core import WORLD, OverlapSearcher

    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "run.steps=2",
            "model.device=cuda",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "optim.max_tokens_per_micro_batch=512",
        ],
    )
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    rows = result.metrics
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["mem/train_peak_gib"] > 0 and r["mem/rollout_peak_gib"] > 0 for r in rows)


@pytest.mark.gpu
@gpu
def test_bf16_update_on_cuda_matches_float32_within_bf16_rounding(tok):
    where = placement("cuda", "bfloat16")
    model = place_policy_model(_model(tok), where)
    ref = copy.deepcopy(model)
    batch = collate(_trajs(4, len(tok)), tok.pad_token_id).to(where.device)
    with torch.no_grad():
        fp32 = batch_logprobs(ref, batch, 1.0)
        with where.autocast():
            bf16 = batch_logprobs(model, batch, 1.0)
    m = batch.loss_mask > 0
    assert float((bf16 - fp32)[m].abs().max()) < 0.1


# ---- LoRA --------------------------------------------------------------------------------------
def test_lora_trains_only_adapters_and_checkpoints_a_merged_hf_folder_that_resumes(tmp_path):
    from test_trainer_core import TINY as TINY_RUN
    from test_trainer_core import WORLD, OverlapSearcher
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


def test_the_search_r1_recipe_loads_with_search_r1s_limits():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "configs" / "search_r1_nq_hotpotqa_qwen2.5_3b.yaml"
    cfg = load_config(recipe, ["rollout.engine=hf"])  # the vllm engine needs vLLM installed to validate
    assert (cfg.rollout.n, cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.retriever.topk) == (5, 4, 500, 3)
    assert (cfg.env.prompt_template, cfg.model.dtype, cfg.algorithm.estimator) == ("search_r1", "bfloat16", "pvpo")


def test_a_saved_hf_model_folder_trains_with_search_r1s_prompt_and_chat_template(tmp_path):
    from test_trainer_core import TINY as TINY_RUN
    from test_trainer_core import WORLD, OverlapSearcher
    from transformers import AutoModelForCausalLM

    from pvpo.trainer.loop import train
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy
    from pvpo.trainer.setup import episode_config

    texts = [p.contents for p in WORLD.passages] + [q.question for q in WORLD.questions("train")]
    policy = build_tiny_policy(texts, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                                                      intermediate_size=64, vocab_size=400),
                               tags=("think", "search", "information", "answer"))  # fmt: skip
    policy.tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    folder = tmp_path / "hf_model"
    save_policy(policy, folder)
    over = [
        *TINY_RUN,
        f"model.path={folder}",
        "model.chat_template=true",
        "env.prompt_template=search_r1",
        "run.steps=1",
    ]
    cfg = load_config(None, over)
    ex = WORLD.questions("train")[0]
    assert (
        episode_config(cfg)
        .prompt(ex)
        .startswith("Answer the given question. You must conduct reasoning inside <think>")
    )
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "checkpoints" / "step_000001" / "policy"))
    assert saved.config.num_hidden_layers == 1
