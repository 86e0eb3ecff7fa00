"""Rollout engines are registered with their spec in one decorator call, and a config naming an
engine is checked at load (name, package) without importing torch, transformers or the package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.rollout import engine as engine_mod
from pvpo.trainer.rollout.engine import ENGINES, RolloutEngine, engine_spec, register_engine

HEAVY = ("torch", "transformers", "vllm")


@pytest.mark.parametrize("name", sorted(engine_mod.ENGINES._lazy))
def test_each_built_in_engines_registering_module_imports_without_torch_or_its_package(name: str) -> None:
    module = engine_mod.ENGINES._lazy[name]
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "from pvpo.trainer.rollout.engine import engine_spec; "
        f"spec = engine_spec({name!r}); "
        f"print(spec.name, sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [name, "[]"]


def test_a_config_naming_an_engine_loads_without_importing_torch() -> None:
    code = (
        "import sys; from pvpo.trainer.config.schema import load_config; "
        "assert load_config(None, ['rollout.engine=hf']).rollout.engine == 'hf'; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_built_in_engines_specs_come_from_their_registrations() -> None:
    hf, vllm = engine_spec("hf"), engine_spec("vllm")
    assert (hf.partial_rollouts, dict(hf.copy_options), hf.own_weights, hf.package) == (
        True,
        {"share_weights": False},
        False,
        "",
    )
    assert (vllm.own_weights, vllm.loads_folder, vllm.run_dtype, vllm.package) == (True, True, True, "vllm")
    assert "pip install vllm" in vllm.install_hint
    assert vllm.launcher_options == {"distributed_executor_backend": "external_launcher"}


@pytest.fixture
def scratch_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines registered by a test are forgotten after it."""
    monkeypatch.setattr(ENGINES, "_entries", dict(ENGINES._entries))


def test_an_engine_whose_package_is_missing_is_refused_at_config_load_with_its_install_line(
    scratch_engines: None,
) -> None:
    @register_engine("needs_missing", package="pvpo_no_such_package", install_hint="`pip install pvpo-no-such-package`")
    def build(**kwargs: object) -> RolloutEngine:
        raise AssertionError("a config check builds no engine")

    assert engine_spec("needs_missing").factory is build
    with pytest.raises(ConfigError, match=r"rollout\.engine:.*pip install pvpo-no-such-package"):
        load_config(None, ["rollout.engine=needs_missing"])


def test_an_engine_naming_a_package_without_its_install_line_is_refused_at_registration(
    scratch_engines: None,
) -> None:
    with pytest.raises(ValueError, match="needs 'somepkg': give the install line"):
        register_engine("no_hint", package="somepkg")(lambda **kw: None)  # type: ignore[arg-type]
    assert "no_hint" not in ENGINES
