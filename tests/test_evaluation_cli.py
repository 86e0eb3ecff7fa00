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


def test_engine_options_are_read_as_yaml_values_of_the_engines_keywords() -> None:
    from pvpo.evaluation.cli import parse_engine_options

    assert parse_engine_options([], "vllm") == {}
    opts = parse_engine_options(
        ["kv_cache_memory_bytes=1073741824", "enable_prefix_caching=false", "max_model_len=null"], "vllm"
    )
    assert opts == {"kv_cache_memory_bytes": 1073741824, "enable_prefix_caching": False, "max_model_len": None}
    assert parse_engine_options(["share_weights=true"], "hf") == {"share_weights": True}


@pytest.mark.parametrize(
    ("items", "engine", "message"),
    [
        (["kv_cache=1"], "vllm", "--engine-option kv_cache: not an option of engine vllm; known: ["),
        (["dtype=float32"], "vllm", "not an option of engine vllm"),  # --dtype sets it
        (["kv_cache_memory_bytes"], "vllm", "expected KEY=VALUE"),
        (["=3"], "hf", "expected KEY=VALUE"),
        (["a=1"], "openai", "the openai engine takes none"),
    ],
)
def test_a_bad_engine_option_is_a_one_line_error_naming_it(items: list[str], engine: str, message: str) -> None:
    from pvpo.evaluation.cli import parse_engine_options

    with pytest.raises(ValueError, match=message.replace("[", r"\[")) as err:
        parse_engine_options(items, engine)
    assert "\n" not in str(err.value)
    if "known" in message:
        assert "kv_cache_memory_bytes" in str(err.value) and "'dtype'" not in str(err.value)


def test_the_eval_command_refuses_an_unknown_engine_option_before_loading_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app

    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tmp_path / "none"),
            "--dataset",
            "nq",
            "--retriever-url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "out"),
            "--engine",
            "hf",
            "--engine-option",
            "kv_cache_memory_bytes=1",
        ],
    )
    assert res.exit_code != 0
    assert "--engine-option kv_cache_memory_bytes: not an option of engine hf" in res.output
    assert "Traceback" not in res.output
