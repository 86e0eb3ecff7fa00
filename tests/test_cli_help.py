"""`--help` says what the README says: every shipped preset, the question files `--dataset` takes,
and no value type beside a flag that takes none."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.trainer.config.presets import available_presets

runner = CliRunner()


def help_text(*command: str) -> str:
    """`pvpo <command> --help` as one line of words (the rich table's borders and wrapping dropped)."""
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "100", "TERMINAL_WIDTH": "100"})
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_train_help_names_every_shipped_preset() -> None:
    text = help_text("train").replace(" ", "")  # a name may be wrapped across two lines
    assert [p for p in available_presets() if p not in text] == []
    assert len(available_presets()) >= 6


def test_the_dataset_help_names_the_raw_question_formats_it_detects() -> None:
    text = help_text("eval")
    for name in ("HotpotQA", "MuSiQue", "2WikiMultihopQA", "FlashRAG"):
        assert name in text


@pytest.mark.parametrize("command", [("train",), ("eval",), ("retriever", "serve"), ("demo",)])
def test_a_flag_shows_no_value_type(command: tuple[str, ...]) -> None:
    text = help_text(*command)
    assert "--help" in text and "<bool>" not in text
