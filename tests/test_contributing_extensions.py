"""CONTRIBUTING.md's "add an estimator" and "add an engine" steps, followed as written: every file
and name the steps point to exists, the decorator arguments they show are the decorator's, and the
toy estimator and toy engine on the page, registered from tmp modules, each train one step on the
smoke config."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import OverlapSearcher

from pvpo.envs.synthetic import SyntheticWorld
from pvpo.registry import Registry
from pvpo.trainer.algorithms import spec as estimator_spec
from pvpo.trainer.config.schema import TrainConfig, load_config
from pvpo.trainer.rollout import engine as engine_mod

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "CONTRIBUTING.md").read_text()
SECTIONS = {"estimator": "### An advantage estimator", "engine": "### A rollout engine"}
DECORATORS: dict[str, Callable[..., Any]] = {
    "estimator": estimator_spec.register_estimator,
    "engine": engine_mod.register_engine,
}


def section(kind: str) -> str:
    """The page's section for `kind`, up to the next heading."""
    start = PAGE.index(SECTIONS[kind])
    end = PAGE.find("\n#", start + len(SECTIONS[kind]))
    return PAGE[start : end if end >= 0 else len(PAGE)]


def toy_code(kind: str) -> str:
    """The section's one Python block, unindented from its list item."""
    (block,) = re.findall(r"```python\n(.*?)\n\s*```", section(kind), flags=re.S)
    lines = block.splitlines()
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[indent:] for x in lines) + "\n"


def top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize("kind", sorted(SECTIONS))
def test_the_files_and_names_the_steps_point_to_exist(kind: str) -> None:
    text = section(kind).split("```python")[0] + section(kind).split("```")[-1]
    paths = {p for p in re.findall(r"`([\w./-]+\.py)\b[^`]*`", text) if "/" in p}
    assert paths, f"the {kind} steps name no file"
    missing = sorted(p for p in paths if not (REPO / p).is_file())
    assert not missing, f"CONTRIBUTING.md ({kind}) names files that do not exist: {missing}"
    pairs = re.findall(r"`([A-Za-z_]\w*)` in `([\w./-]+\.py)`", text)
    assert pairs, f"the {kind} steps name no definition"
    for name, path in pairs:
        assert name in top_level_names(REPO / path), f"CONTRIBUTING.md ({kind}): no `{name}` in {path}"


@pytest.mark.parametrize("kind", sorted(SECTIONS))
def test_the_decorator_arguments_the_steps_show_are_the_decorators(kind: str) -> None:
    decorator = DECORATORS[kind]
    shown = re.findall(rf"`@{decorator.__name__}\((.*?)\)`", section(kind))
    assert shown, f"the {kind} steps show no @{decorator.__name__}(...)"
    params = set(inspect.signature(decorator).parameters)
    for call in shown:
        keywords = set(re.findall(r"(\w+)=", call))
        assert keywords <= params, f"@{decorator.__name__} takes no {sorted(keywords - params)}"


def register_toy(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Import the page's toy from a module of its own in `tmp_path`, its registration forgotten
    after the test; the name it registered."""
    registry: Registry[Any] = estimator_spec.ESTIMATORS if kind == "estimator" else engine_mod.ENGINES
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    before = set(registry._entries)
    module = f"toy_{kind}_from_contributing"
    (tmp_path / f"{module}.py").write_text(toy_code(kind))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.import_module(module)
    (name,) = set(registry._entries) - before
    return name


def one_step(cfg: TrainConfig, run_dir: Path) -> list[dict[str, Any]]:
    from pvpo.trainer.loop import train

    s = cfg.data.synthetic
    world = SyntheticWorld.generate(
        s.seed, s.n_entities, n_relations=s.n_relations, max_hops=s.max_hops, questions_per_hop=s.questions_per_hop
    )
    result = train(cfg, run_dir, searcher=OverlapSearcher(world.passages), show_progress=False)
    assert [m["step"] for m in result.metrics] == [1]
    assert all(v is None or math.isfinite(v) for v in result.metrics[0].values() if isinstance(v, float))
    return result.metrics


# A training test below takes 4-5 s after another has imported torch and transformers, 19-67 s
# alone (2 cores shared at load ~10), hence slow.
SMOKE = str(REPO / "configs" / "smoke.yaml")
ONE_STEP = ["run.steps=1", "run.tensorboard=false", "data.max_train_examples=2", "data.max_eval_examples=1"]


@pytest.mark.slow
def test_the_pages_toy_estimator_trains_one_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = register_toy("estimator", tmp_path, monkeypatch)
    registered = estimator_spec.ESTIMATORS.get(name)
    calls: list[int] = []

    def counted(rewards: Any, uids: Any, **kwargs: Any) -> Any:
        calls.append(len(uids))
        return registered.fn(rewards, uids, **kwargs)

    monkeypatch.setitem(estimator_spec.ESTIMATORS._entries, name, dataclasses.replace(registered, fn=counted))
    cfg = load_config(SMOKE, [*ONE_STEP, f"algorithm.estimator={name}"])
    metrics = one_step(cfg, tmp_path / "run")
    assert calls and metrics[0]["grad_norm"] > 0


@pytest.mark.slow
def test_the_pages_toy_engine_trains_one_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = register_toy("engine", tmp_path, monkeypatch)
    built = engine_mod.engine_spec(name)
    engines: list[Any] = []

    def counted(**kwargs: Any) -> Any:
        engines.append(built.factory(**kwargs))
        return engines[-1]

    monkeypatch.setitem(engine_mod.ENGINES._entries, name, dataclasses.replace(built, factory=counted))
    cfg = load_config(SMOKE, [*ONE_STEP, f"rollout.engine={name}"])
    metrics = one_step(cfg, tmp_path / "run")
    assert engines and metrics[0]["response_length"] > 0
