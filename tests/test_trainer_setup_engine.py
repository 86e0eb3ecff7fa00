"""The trainer's rollout-engine wiring: engine choice and options from config, sleep
around the update, the sampler/trainer log-prob mismatch logged every step, and truncated
importance correction applied to the loss when enabled."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_trainer_loop import _rollout, search_biased
from trainer_support import TINY, WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.model.update import batch_logprobs, policy_update
from pvpo.trainer.rollout import engine as engine_mod
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.rollout.trajectory import collate

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="checks the error raised when vLLM is absent")
def test_choosing_the_vllm_engine_without_vllm_fails_at_config_load_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.engine:.*pip install vllm"):
        load_config(None, ["rollout.engine=vllm"])


@pytest.mark.parametrize("installed", [False, True])
def test_the_auto_engine_is_vllm_where_vllm_is_installed_and_hf_otherwise(
    monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "vllm":
            return object() if installed else None
        return real(name, *args)

    monkeypatch.setattr(engine_mod.importlib.util, "find_spec", find_spec)
    assert load_config(None, ["rollout.engine=auto"]).rollout.engine == ("vllm" if installed else "hf")


@pytest.fixture
def vllm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let configs name the vllm engine on a machine without vLLM (the engine is never built)."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return object() if name == "vllm" else real(name, package)

    monkeypatch.setattr(engine_mod.importlib.util, "find_spec", find_spec)


def test_engine_options_are_the_selected_engines_section(vllm_allowed: None) -> None:
    cfg = load_config(
        None,
        [
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.3",
            "rollout.vllm.kv_cache_memory_bytes=268435456",
            "rollout.vllm.enable_sleep_mode=true",
        ],
    )
    opts = cfg.rollout.engine_options()
    assert (opts["gpu_memory_utilization"], opts["kv_cache_memory_bytes"], opts["enable_sleep_mode"]) == (
        0.3,
        1 << 28,
        True,
    )
    assert {"dtype", "tensor_parallel_size", "max_model_len", "enforce_eager"} <= set(opts)
    assert load_config(None, ["rollout.vllm.tensor_parallel_size=2"]).rollout.engine_options() == {}
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.gpu_memory_utilization"):
        load_config(None, ["rollout.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"rollout\.importance_correction\.cap"):
        load_config(None, ["rollout.importance_correction.cap=0.5"])


class EventEngine(HFEngine):
    """An HF engine that records generate / sync / sleep / wake_up calls in order."""

    def __init__(self, *a, events: list[str], **kw) -> None:
        super().__init__(*a, **kw)
        self.events = events

    def generate(self, prompts, sampling):
        self.events.append("generate")
        return super().generate(prompts, sampling)

    def async_session(self, executor):  # the agent loop's way in: one "generate" per session
        self.events.append("generate")
        return super().async_session(executor)

    def sync_weights(self, model) -> None:
        self.events.append("sync")
        super().sync_weights(model)

    def sleep(self) -> None:
        self.events.append("sleep")

    def wake_up(self) -> None:
        self.events.append("wake")


def test_trainer_builds_the_engine_with_its_options_sleeps_it_for_the_update_and_logs_the_mismatch(
    tmp_path, monkeypatch: pytest.MonkeyPatch, vllm_allowed: None
) -> None:
    import pvpo.trainer.loop as train_mod
    import pvpo.trainer.policy_engine as engine_build

    built: list[tuple[str, dict]] = []
    events: list[str] = []

    def fake_build(name: str, *, model, tokenizer, **options):
        built.append((name, options))
        return EventEngine(model, tokenizer, events=events)

    monkeypatch.setattr(engine_build, "build_engine", fake_build)
    cfg = load_config(
        None,
        TINY
        + [
            "run.steps=2",
            "optim.mini_batches=2",
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.25",
            "rollout.vllm.max_model_len=512",
        ],
    )
    result = train_mod.train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert [name for name, _ in built] == ["vllm"]  # no reference engine: no refresh, no KL
    assert built[0][1]["gpu_memory_utilization"] == 0.25 and built[0][1]["max_model_len"] == 512
    # each update runs between a sleep and a wake_up: weights synced, nothing generated meanwhile
    asleep = [
        events[events.index("sleep", s) + 1 : events.index("wake", events.index("sleep", s))]
        for s in [i for i, e in enumerate(events) if e == "sleep"]
    ]
    assert len(asleep) == 2 and all(seg == ["sync", "sync"] for seg in asleep)
    for row in result.metrics:  # the HF engine samples with the trainer's own weights and kernels
        assert row["mismatch/tokens"] > 0
        assert row["mismatch/abs_mean"] < 1e-3 and row["mismatch/abs_max"] < 1e-2
        assert row["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-3)


def _update(policy, batch, adv, *, correction=None, optim=()):  # noqa: F811
    cfg = load_config(None, ["optim.grad_clip=null", "optim.mini_batches=1", *optim])
    frozen = [p.detach().clone() for p in policy.model.parameters()]
    opt = torch.optim.SGD(policy.model.parameters(), lr=0.0)
    with search_biased(policy):  # the bias the rollouts were sampled with
        stats = policy_update(policy.model, opt, batch, adv, cfg.optim, temperature=1.0, seed=0, importance=correction)
    assert all(torch.equal(a, b) for a, b in zip(frozen, policy.model.parameters()))
    return stats


def test_importance_correction_uses_the_trainers_logprobs_and_capped_weights(policy) -> None:  # noqa: F811
    _, trajs = _rollout(policy)
    batch = collate(trajs, policy.tokenizer.pad_token_id)
    adv = torch.ones(len(batch))
    model_tok = batch.loss_mask > 0
    on = load_config(None, ["rollout.importance_correction.enabled=true", "rollout.importance_correction.cap=2.0"])
    off = load_config(None, ["rollout.importance_correction.cap=2.0"])
    base = _update(policy, batch, adv, correction=off.rollout.importance_correction)
    assert base["mismatch/abs_mean"] < 1e-3 and base["mismatch/truncated_frac"] == 0.0
    # a sampler that put 3 nats less on every sampled token than the trainer: ratios e^3 > cap
    perturbed = collate(trajs, policy.tokenizer.pad_token_id)
    perturbed.old_logprobs[model_tok] -= 3.0
    raw = _update(policy, perturbed, adv, correction=off.rollout.importance_correction)
    assert raw["mismatch/abs_mean"] == pytest.approx(3.0, abs=1e-3) and raw["mismatch/truncated_frac"] == 1.0
    assert raw["ratio_mean"] == pytest.approx(float(torch.exp(torch.tensor(3.0))), rel=1e-2)  # off-policy ratios
    fixed = _update(policy, perturbed, adv, correction=on.rollout.importance_correction)
    # denominator = lp_train_old: ratios back at 1; every weight capped at 2 doubles loss and gradient
    assert fixed["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert fixed["pg_loss"] == pytest.approx(2.0 * base["pg_loss"], rel=1e-3)
    assert fixed["grad_norm"] == pytest.approx(2.0 * base["grad_norm"], rel=1e-3)
    assert fixed["mismatch/abs_mean"] == raw["mismatch/abs_mean"]


def test_gt_trajectories_keep_their_own_denominator_and_unit_weight(policy) -> None:  # noqa: F811
    from pvpo.trainer.model.update import importance_terms

    _, trajs = _rollout(policy)
    batch = collate(trajs, policy.tokenizer.pad_token_id)
    batch.is_gt[0] = True
    batch.old_logprobs[0][batch.loss_mask[0] > 0] = -7.0  # pi_gt: a different policy's log-probs
    policy.model.train()
    with search_biased(policy):
        lp = batch_logprobs(policy.model, batch, 1.0)
    on = load_config(None, ["rollout.importance_correction.enabled=true"]).rollout.importance_correction
    old, w, stats = importance_terms(lp, batch, on)
    assert torch.equal(old[0], batch.old_logprobs[0]) and torch.equal(old[1:], lp[1:])
    assert torch.equal(w[0], batch.loss_mask[0])
    assert stats["mismatch/abs_max"] < 1e-2  # the GT row's pi_gt gap is not a sampler mismatch


def test_anchor_refresh_from_the_reference_samples_from_a_reference_engine_built_with_the_same_options(
    tmp_path, monkeypatch: pytest.MonkeyPatch, vllm_allowed: None
) -> None:
    import pvpo.trainer.loop as train_mod
    import pvpo.trainer.policy_engine as engine_build

    built: list[tuple[dict, list[str]]] = []

    def fake_build(name: str, *, model, tokenizer, **options):
        events: list[str] = []
        built.append((options, events))
        return EventEngine(model, tokenizer, events=events)

    monkeypatch.setattr(engine_build, "build_engine", fake_build)
    cfg = load_config(
        None,
        TINY
        + [
            "run.steps=2",
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.2",
            "algorithm.anchor.refresh_every=1",
            "algorithm.anchor.refresh_from=reference",
        ],
    )
    train_mod.train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert len(built) == 2 and built[0][0] == built[1][0] and built[1][0]["gpu_memory_utilization"] == 0.2
    ref_events = built[1][1]
    # built for the refresh after step 1 (the step-0 anchor comes from the policy, then identical),
    # it samples once for the whole refresh, then sleeps; it never receives weights
    assert (
        ref_events[0] == "wake" and ref_events[-1] == "sleep" and "generate" in ref_events and "sync" not in ref_events
    )
