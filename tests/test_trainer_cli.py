"""What `pvpo train` says or refuses before it trains on something the user did not mean."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.trainer.config.schema import ConfigError, load_config


def test_warm_start_on_a_qa_file_needs_its_own_questions_named_by_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model.warm_start_steps=5 on data.source='qa.jsonl' needs data.warm_start"):
        load_config(None, ["model.warm_start_steps=5", "data.source=qa.jsonl"])
    assert load_config(None, ["model.warm_start_steps=0", "data.source=qa.jsonl"]).data.source == "qa.jsonl"
    both = ["model.warm_start_steps=5", "data.source=qa.jsonl", "data.warm_start_examples=8"]
    assert load_config(None, both).data.warm_start_examples == 8
    assert load_config(None, ["model.warm_start_steps=5"]).model.warm_start_steps == 5  # synthetic: fine


def test_train_without_config_says_it_uses_the_defaults(tmp_path: Path) -> None:
    # a bad override stops it right after the notice, before any training
    res = CliRunner().invoke(app, ["train", "--run-dir", str(tmp_path / "r"), "run.steps=0"])
    assert res.exit_code == 2
    assert "no --config: training on the built-in defaults" in res.output
    assert "run.steps" in res.output
