"""Memory of training on a real vocabulary: the default token budget, the refusal of a micro-batch
that cannot fit (before allocating it), peak RSS per phase, and response logits projected for the
response positions only."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from pvpo.trainer.model import memory
from pvpo.trainer.model.device import PhaseMemory
from pvpo.trainer.model.memory import MemoryBudgetError, ModelShape, check_fits, default_max_tokens
from pvpo.trainer.rollout.trajectory import Trajectory, collate, response_logits

# SmolLM2-135M-Instruct's shape (a config only: no weights are built)
SMOL = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
)


class _Shaped(torch.nn.Module):
    def __init__(self, **cfg: int) -> None:
        super().__init__()
        self.config = Qwen2Config(**cfg)


def test_default_budget_follows_the_model_the_row_length_and_the_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Shaped(**SMOL)
    shape = ModelShape.of(model)
    assert shape is not None and shape.heads == 9
    per = shape.bytes_per_token(checkpointing=False, seq_len=1024)
    # 1.1 MiB of layer activations + logits and 2.1 MiB of attention probabilities a token at T = 1,024
    assert 3.0 < per / 2**20 < 3.5
    cpu = torch.device("cpu")
    monkeypatch.setattr(memory, "available_bytes", lambda d: 8 * 2**30)
    plain = default_max_tokens(model, cpu, checkpointing=False, seq_len=1024)
    assert plain == int(0.3 * 8 * 2**30 // per) // 256 * 256 == 512
    short = default_max_tokens(model, cpu, checkpointing=False, seq_len=128)
    assert short is not None and short > 2 * plain  # shorter rows: less attention a token
    ckpt = default_max_tokens(model, cpu, checkpointing=True, seq_len=1024)
    assert ckpt is not None and ckpt >= 4 * plain  # checkpointing keeps one layer's activations
    monkeypatch.setattr(memory, "available_bytes", lambda d: 64 * 2**30)
    assert default_max_tokens(model, cpu, checkpointing=False, seq_len=1024) == int(4 * 2**30 // per) // 256 * 256
    monkeypatch.setattr(memory, "available_bytes", lambda d: 2**20)
    assert default_max_tokens(model, cpu, checkpointing=False, seq_len=1024) == 256  # floor
    assert default_max_tokens(torch.nn.Linear(2, 2), cpu, checkpointing=False, seq_len=1024) is None


def test_a_micro_batch_that_cannot_fit_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Shaped(**SMOL)
    monkeypatch.setattr(memory, "available_bytes", lambda d: 2 * 2**30)
    check_fits(model, torch.device("cpu"), 1024, checkpointing=False, seq_len=1024)  # ~3.3 GiB estimated: half fits
    with pytest.raises(MemoryBudgetError) as err:
        check_fits(model, torch.device("cpu"), 32 * 1024, checkpointing=False, seq_len=1024)
    msg = str(err.value)
    assert "\n" not in msg and "32768 padded tokens" in msg and "2.0 GiB free" in msg
    assert "fix: lower optim.max_tokens_per_micro_batch" in msg and "model.gradient_checkpointing=true" in msg


def test_phase_memory_logs_peak_rss_on_cpu() -> None:
    mem = PhaseMemory(torch.device("cpu"))
    with mem.phase("train"):
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB touched inside the phase
        block += 1
    out = mem.pop()
    assert set(out) == {"mem/train_peak_rss_gib"}
    assert out["mem/train_peak_rss_gib"] >= 64 / 1024
    assert mem.pop() == {}


def test_the_process_peak_survives_the_phase_resets_that_hide_it_from_usr_bin_time() -> None:
    from pvpo.trainer.model.memory import peak_rss_gib, process_peak_rss_gib, reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("peak RSS is read from Linux's /proc/self (VmHWM)")
    import mmap

    size = 256 * 2**20
    block = mmap.mmap(-1, size)  # fresh pages, returned to the system on close (a heap block may not be)
    for i in range(0, size, mmap.PAGESIZE):
        block[i] = 1
    with_block = peak_rss_gib()
    block.close()
    reset_peak_rss()  # what each PhaseMemory phase does
    assert peak_rss_gib() < with_block - 0.2  # the kernel's counter forgot it
    # this one did not (VmHWM reads max(counter, current RSS), so a later read may sit a few kB lower)
    assert process_peak_rss_gib() >= with_block - 0.01


def test_a_runs_evaluations_log_their_peak_rss_with_the_step_they_follow(tmp_path) -> None:
    """The recipe's run-level peak (17.5 GiB) lay outside the rollout and train phases, and nothing
    said where: each held-out evaluation logs `mem/eval_peak_rss_gib`, on the row of the step it
    follows (the one before RL on step 1's row)."""
    import json

    from trainer_support import TINY, WORLD, OverlapSearcher

    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train
    from pvpo.trainer.model.memory import reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("peak RSS is read from Linux's /proc/self (VmHWM)")
    cfg = load_config(None, [*TINY, "run.steps=3", "run.eval_every=2", "model.device=cpu"])
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [("mem/eval_peak_rss_gib" in r, "eval/accuracy" in r) for r in rows] == [
        (True, False),  # the evaluation before RL
        (True, True),  # eval_every=2
        (True, True),  # the final one
    ]
    assert all(r["mem/eval_peak_rss_gib"] > 0 for r in rows)
    whole = [r["mem/process_peak_rss_gib"] for r in rows]
    assert whole == sorted(whole) and whole[-1] >= max(r["mem/train_peak_rss_gib"] for r in rows)


def test_response_logits_project_only_the_response_positions() -> None:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    trajs = []
    for i, (p, r) in enumerate(((5, 7), (9, 3))):
        t = Trajectory(uid=f"q{i}", prompt_ids=list(range(1, p + 1)))
        t.append_model(list(range(10, 10 + r)), [-1.0] * r)
        trajs.append(t)
    batch = collate(trajs, 0)
    projected: list[int] = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: projected.append(inp[0].shape[1]))
    with torch.no_grad():
        got = response_logits(model, batch)
        full = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits[:, batch.prompt_len - 1 : -1]
    r = batch.input_ids.shape[1] - batch.prompt_len
    assert projected == [r + 1, batch.input_ids.shape[1]]  # ours: the response's positions; a plain call: all
    torch.testing.assert_close(got, full)


def test_freed_heap_goes_back_to_the_kernel_when_a_phase_ends() -> None:
    import ctypes
    import ctypes.util

    if not memory.release_freed_heap():
        pytest.skip("no glibc malloc_trim on this platform")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 3000  # 64 KiB blocks: below glibc's mmap threshold, so on the heap
    blocks = [libc.malloc(size) for _ in range(count)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    pin = libc.malloc(size)  # a live block above them: glibc cannot shrink the heap past it by itself
    ctypes.memset(pin, 1, size)
    for b in blocks:
        libc.free(b)
    held = memory._status_kib("VmRSS")
    with PhaseMemory(torch.device("cpu")).phase("train"):
        pass
    after = memory._status_kib("VmRSS")
    libc.free(pin)
    assert held is not None and after is not None
    assert held - after > 0.8 * size * count / 1024  # ~188 MiB of freed blocks returned at the phase's end


def test_a_steps_gradients_and_autocast_weight_copies_are_counted_before_the_activations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a tied vocabulary much larger than the rest: its gradient dominates a short micro-batch
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32768,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    )
    cpu = torch.device("cpu")
    n = sum(p.numel() for p in model.parameters())
    assert memory.step_fixed_bytes(model, cpu) == 4 * n  # float32 gradients
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert memory.step_fixed_bytes(model, cpu) == 4 * n + 2 * n  # plus autocast's bf16 weight copies
    for p in model.model.layers.parameters():
        p.requires_grad_(False)  # frozen weights get no gradient (LoRA's base, say)
    frozen = sum(p.numel() for p in model.model.layers.parameters())
    assert memory.step_fixed_bytes(model, cpu) == 4 * (n - frozen)
    for p in model.parameters():
        p.requires_grad_(True)
    # what the gradients take is not the activations' to use
    per = ModelShape.of(model).bytes_per_token(checkpointing=False, seq_len=256)
    monkeypatch.setattr(memory, "available_bytes", lambda d: 4 * n + 2 * 256 * per)
    check_fits(model, cpu, 256, checkpointing=False, seq_len=256)
    monkeypatch.setattr(memory, "available_bytes", lambda d: 4 * n)
    with pytest.raises(MemoryBudgetError, match="of gradients and weight copies"):
        check_fits(model, cpu, 256, checkpointing=False, seq_len=256)
    monkeypatch.setattr(memory, "available_bytes", lambda d: 4 * n + 2**30)
    budget = default_max_tokens(model, cpu, checkpointing=False, seq_len=256)
    assert budget == int(0.3 * 2**30 // per) // 256 * 256 == 1024  # 30% of what the gradients leave


def test_the_warm_start_and_the_reference_work_log_their_own_peaks(tmp_path) -> None:
    from trainer_support import TINY, WORLD, OverlapSearcher

    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        TINY
        + ["run.steps=1", "model.warm_start_steps=2", "run.eval_base=true", "algorithm.group_sampling.enabled=true"],
    )
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    row = result.metrics[0]
    for phase in ("warm_start", "eval_base", "reference", "rollout", "train"):
        assert row[f"mem/{phase}_peak_rss_gib"] > 0, phase


_HEAP_PROBE = """
import ctypes, ctypes.util, sys
from pvpo.trainer.model import memory
if sys.argv[1] == "limit" and not memory.limit_heap_retention():
    print("no-mallopt"); raise SystemExit
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # freeing a 16 MiB mmapped block raises glibc's dynamic threshold to it
size = 8 << 20
blocks = [libc.malloc(size) for _ in range(20)]
for b in blocks:
    ctypes.memset(b, 1, size)
pin = libc.malloc(1 << 20)  # a live block above them: the heap cannot shrink past it
ctypes.memset(pin, 1, 1 << 20)
held = memory._status_kib("VmRSS")
for b in blocks:
    libc.free(b)
print(held - memory._status_kib("VmRSS"))
"""


@pytest.mark.parametrize("mode", ["limit", "default"])
def test_a_cpu_runs_large_freed_blocks_leave_the_process_at_once(mode: str) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    if out == "no-mallopt":
        pytest.skip("no glibc mallopt on this platform")
    returned_mib = int(out) / 1024
    if mode == "limit":  # 20 x 8 MiB blocks over the fixed 4 MiB threshold: mmapped, unmapped on free
        assert returned_mib > 150
    else:  # glibc's raised dynamic threshold keeps them in the heap: what the limit is for
        assert returned_mib < 50
