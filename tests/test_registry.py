"""The one Registry type behind every pluggable part: duplicates, unknown names, lazy modules."""

from __future__ import annotations

import sys
import types

import pytest

from pvpo.registry import DuplicateNameError, Registry, UnknownNameError


def test_unknown_name_error_names_the_kind_and_lists_every_known_name() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("b", 2)
    reg.register("a", 1)
    with pytest.raises(UnknownNameError) as info:
        reg.get("c")
    assert str(info.value) == "unknown widget 'c'; known: a, b"
    # callers written against either exception type keep working
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_a_second_object_under_a_taken_name_is_refused_but_the_same_object_is_a_no_op() -> None:
    reg: Registry[object] = Registry("widget")
    first = object()
    reg.register("x", first)
    assert reg.register("x", first) is first
    with pytest.raises(DuplicateNameError, match="widget 'x' is already registered"):
        reg.register("x", object())
    assert reg.get("x") is first


def test_register_as_decorator_returns_the_decorated_object() -> None:
    reg: Registry[object] = Registry("widget")

    @reg.register("f")
    def f() -> int:
        return 1

    assert reg.get("f") is f and f() == 1


def test_lazy_names_are_listed_before_import_and_imported_on_first_get(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry[int] = Registry("widget", lazy={"late": "pvpo_test_lazy_widget"})
    module = types.ModuleType("pvpo_test_lazy_widget")

    def fake_import(name: str) -> types.ModuleType:  # as Python does: in sys.modules while it runs
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, module)
            reg.register("late", 7)
        return sys.modules[name]

    monkeypatch.setattr("pvpo.registry.importlib.import_module", fake_import)
    assert "late" in reg and reg.names() == ["late"]
    assert reg.values() == []
    assert reg.get("late") == 7


def test_a_lazily_declared_name_cannot_be_taken_before_its_module_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry[int] = Registry("widget", lazy={"late": "pvpo_test_lazy_widget"})
    module = types.ModuleType("pvpo_test_lazy_widget")

    def fake_import(name: str) -> types.ModuleType:
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, module)
            reg.register("late", 7)
        return sys.modules[name]

    monkeypatch.setattr("pvpo.registry.importlib.import_module", fake_import)
    with pytest.raises(DuplicateNameError, match="'late' is already registered"):
        reg.register("late", 8)  # the owner registers 7 first; 8 is refused, not silently shadowing it
    assert reg.get("late") == 7


@pytest.mark.parametrize(
    ("lookup", "kind"),
    [
        ("pvpo.reward:get_reward", "reward"),
        ("pvpo.reward:get_protocol", "tag protocol"),
        ("pvpo.envs.templates:get_template", "prompt template"),
        ("pvpo.trainer.algorithms.spec:get_estimator", "advantage estimator"),
        ("pvpo.trainer.rollout.engine:build_engine", "rollout engine"),
        ("pvpo.retriever.index:get_backend", "retriever backend"),
        ("pvpo.trainer.reference.gt_registry:GT_SOURCES.get", "GT source"),
        ("pvpo.envs.loaders:DATASETS.get", "dataset"),
        ("pvpo.envs.loaders:FORMATS.get", "dataset format"),
    ],
)
def test_every_registry_raises_the_same_error_listing_its_names(lookup: str, kind: str) -> None:
    import importlib

    module_name, attr = lookup.split(":")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    with pytest.raises(UnknownNameError, match=rf"^unknown {kind} 'no-such-name'; known: \w"):
        obj("no-such-name")  # type: ignore[operator]
