"""`pvpo eval`'s command-line layer: what it records about the model it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvpo.evaluation.cli import _model_id


def test_model_id_keeps_names_and_resolves_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy").mkdir()
    assert _model_id("policy") == str(tmp_path / "policy")  # a local folder: its absolute path
    assert _model_id("smollm2-135m-instruct") == "smollm2-135m-instruct"  # a catalog name, not cwd/name
    assert _model_id("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"  # a hub id
