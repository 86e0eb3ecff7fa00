"""A run that cannot run is refused before it starts: `pvpo train` and `pvpo demo` end in one line,
exit status 2, within seconds, with no run folder (no file at all) written and no model built, for
every refused combination the config or the pre-flight (`trainer/config/preflight.py`) knows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.preflight import check_retriever, preflight
from pvpo.trainer.config.schema import load_config

PVPO = str(Path(sys.executable).parent / "pvpo")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# (overrides, what the one line must name); {port} is a closed loopback port, {tmp} the test's folder
REFUSED = {
    "v05 beside the update": (["algorithm.estimator=v05", "rollout.max_staleness=1"], "rollout.max_staleness=0"),
    "v05_value beside the update": (
        ["algorithm.estimator=v05_value", "rollout.max_staleness=2"],
        "algorithm.estimator=v05_value",
    ),
    "ppo with Group Sampling": (
        ["algorithm.estimator=ppo", "algorithm.group_sampling.enabled=true"],
        "algorithm.group_sampling.enabled=false",
    ),
    "the oracle as GT source on a QA file": (
        ["data.source=qa.jsonl", "algorithm.group_sampling.enabled=true"],
        "algorithm.gt.source=oracle needs the synthetic world",
    ),
    "an endpoint's own log-probs as pi_gt": (
        [
            "algorithm.group_sampling.enabled=true",
            "algorithm.gt.source=model",
            "algorithm.gt.model.base_url=http://127.0.0.1:{port}/v1",
            "algorithm.gt.model.model=m",
        ],
        "algorithm.gt.logprobs=reference",
    ),
    "a reused anchor that is not there": (
        ["algorithm.anchor.reuse_from={tmp}/no-such-run"],
        "algorithm.anchor.reuse_from=",
    ),
    "a GPU the machine does not have": (["model.device=cuda:7"], "model.device="),
    "an empty model folder": (["model.path={tmp}"], "is empty: give a Hugging Face model folder"),
    "an unreachable retriever.url": (["retriever.url=http://127.0.0.1:{port}"], "retriever.url=http://127.0.0.1:"),
}


def _refused(tmp_path: Path, command: str, overrides: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    port = _closed_port()
    args = [a.format(port=port, tmp=tmp_path) for a in overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(
        [PVPO, command, "--run-dir", "run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out, time.perf_counter() - t0


@pytest.mark.parametrize("command", ["train", "demo"])
@pytest.mark.parametrize("case", REFUSED)
def test_a_run_that_cannot_run_is_refused_in_one_line_before_any_file_or_model(
    tmp_path: Path, case: str, command: str
) -> None:
    overrides, named = REFUSED[case]
    out, seconds = _refused(tmp_path, command, overrides)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("no --config:") and "shows the traceback" not in ln]
    assert len(errors) == 1 and errors[0].startswith("error: "), out.stderr
    assert named in errors[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "run").exists()
    assert sorted(os.listdir(tmp_path)) == []  # no run folder, no lock file beside it, nothing
    assert seconds < 10, f"refused after {seconds:.1f} s"


def test_the_library_entry_refuses_before_any_file_too(tmp_path: Path) -> None:
    from pvpo.trainer.loop import train

    cfg = load_config(None, [f"retriever.url=http://127.0.0.1:{_closed_port()}", "run.steps=1"])
    with pytest.raises(ValueError, match=r"^retriever.url=http://127.0.0.1:\d+: retriever unreachable"):
        train(cfg, tmp_path / "run", show_progress=False)
    assert sorted(os.listdir(tmp_path)) == []


def test_a_retriever_that_answers_passes_and_one_that_refuses_the_token_is_named(tiny) -> None:
    from pvpo.retriever.server import BackgroundServer

    with BackgroundServer(tiny, token="s3cret") as server:
        check_retriever(load_config(None, [f"retriever.url={server.url}", "retriever.token=s3cret"]))
        with pytest.raises(ValueError, match=r"retriever.url=.*401.*check the token") as refused:
            check_retriever(load_config(None, [f"retriever.url={server.url}"]))
        assert "\n" not in str(refused.value)


def test_a_resume_keeps_its_own_anchor_and_a_given_searcher_skips_the_retriever(tmp_path: Path) -> None:
    cfg = load_config(
        None, [f"algorithm.anchor.reuse_from={tmp_path / 'gone'}", f"retriever.url=http://127.0.0.1:{_closed_port()}"]
    )
    preflight(cfg, resume=True, retriever=False)  # a resume restores the anchor its first attempt copied
    with pytest.raises(ValueError, match="algorithm.anchor.reuse_from="):
        preflight(cfg, retriever=False)


def test_the_config_knows_which_shipped_estimators_sample_extra_rollouts_without_importing_them() -> None:
    from pvpo.trainer.algorithms.spec import _SHIPPED, EXTRA_ROLLOUTS, get_spec

    assert {n for n in _SHIPPED if get_spec(n).extra_rollouts} == EXTRA_ROLLOUTS


# what the config asks of the policy or of a reused anchor, known once the policy or the RL prompts
# are loaded: refused before the base evaluation and the warm start run (no eval or warm-start file)
AFTER_LOADING = {
    "a LoRA target the model lacks": (["model.lora.enabled=true", "model.lora.target_modules=[qkv]"], "qkv"),
    "a chat template the tokenizer lacks": (["model.chat_template=true"], "model.chat_template"),
    "a reused anchor missing the RL prompts": (["algorithm.anchor.reuse_from={src}"], "lacks"),
    "a GT model of another tokenizer": (
        ["algorithm.group_sampling.enabled=true", "algorithm.gt.source=model", "algorithm.gt.model.path={gt}"],
        "its tokenizer differs from the policy's",
    ),
}


@pytest.mark.parametrize("case", AFTER_LOADING)
def test_what_the_policy_or_the_prompts_refuse_comes_before_the_base_evaluation_and_warm_start(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.trainer import setup
    from pvpo.trainer.config.policy import TinyModelConfig
    from pvpo.trainer.loop import train
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy
    from pvpo.trainer.state.run_dir import RunDir

    def work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the base evaluation or the warm start ran before the refusal")

    monkeypatch.setattr(setup, "base_evaluation", work)
    monkeypatch.setattr(setup, "warm_start", work)
    src = RunDir(tmp_path / "sweep")
    src.root.mkdir()
    src.anchor.write_text('{"version": 1, "stats": {}}')
    gt = tmp_path / "gt_model"  # a tiny model whose tokenizer learned other words
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
    save_policy(build_tiny_policy(["other words entirely"] * 8, tiny, tags=[], seed=0), gt)
    overrides, named = AFTER_LOADING[case]
    base = [*TINY, "model.warm_start_steps=2", "run.eval_base=true", "run.steps=1"]
    cfg = load_config(None, [*base, *(o.format(src=src.root, gt=gt) for o in overrides)])
    run = RunDir(tmp_path / "run")
    with pytest.raises(ValueError, match=named):
        train(cfg, run.root, searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert not run.warm_start.exists() and not run.eval_before.exists() and not run.initial_policy.exists()


def test_the_gt_models_engine_is_checked_when_the_config_loads_as_the_rollout_engine_is() -> None:
    from pvpo.trainer.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"algorithm.gt.model.engine: .*unknown rollout engine 'vlm'"):
        load_config(None, ["algorithm.gt.model.engine=vlm"])
    assert load_config(None, ["algorithm.gt.model.engine=hf"]).algorithm.gt.model.engine == "hf"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["algorithm.estimator=v05", "rollout.max_staleness=1"], "rollout.max_staleness=0"),
        (["model.device=cuda:7"], "model.device="),
    ],
)
def test_pvpo_train_nproc_refuses_in_its_own_process_before_torchrun_starts_any(
    tmp_path: Path, overrides: list[str], named: str
) -> None:
    out, seconds = _refused(tmp_path, "train", ["--nproc", "2", *overrides])
    assert out.returncode == 2 and named in out.stderr, out.stderr
    assert "torchrun" not in out.stderr.lower() and "Traceback" not in out.stderr
    assert sorted(os.listdir(tmp_path)) == [] and seconds < 10


def test_a_gpu_past_the_machines_and_more_ranks_than_gpus_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pvpo.trainer.config import preflight as pf

    monkeypatch.setattr(pf, "_no_gpu_device_files", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"^model.device=cuda:2: this machine has 2 GPU\(s\), cuda:0 to cuda:1$"):
        pf.check_device(load_config(None, ["model.device=cuda:2"]), 1)
    pf.check_device(load_config(None, ["model.device=cuda:1"]), 1)
    with pytest.raises(ValueError, match=r"^4 processes on this machine but 2 GPU\(s\): give --nproc 2 or fewer"):
        pf.check_device(load_config(None, ["model.device=auto"]), 4)
    pf.check_device(load_config(None, ["model.device=auto"]), 2)
    pf.check_device(load_config(None, ["model.device=cpu"]), 4)  # CPU ranks need no GPU
