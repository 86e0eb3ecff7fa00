"""`pvpo recipe gt-coverage` (pvpo.recipes.multihop.gt_coverage): how many questions of a multi-hop
file get a `dataset` GT trajectory, one table row a dataset; a folder without questions is refused
in one line before the tokenizer or any index is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app


def test_a_dataset_folder_without_questions_is_refused_in_one_line_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "musique_mini").mkdir()
    argv = ["recipe", "gt-coverage", "--tokenizer", str(tmp_path / "no-tokenizer"), "--data", str(tmp_path)]
    got = CliRunner().invoke(app, [*argv, "--datasets", "musique_mini"])
    assert got.exit_code == 2 and "holds neither questions.json nor questions.jsonl" in got.output
    assert "Traceback" not in got.output  # the folder is checked before the (missing) tokenizer is read
    got = CliRunner().invoke(app, [*argv, "--datasets", "musique_mini", "--encoder-dtype", "float16"])
    assert got.exit_code == 2 and "give float32 or bfloat16" in got.output


@pytest.mark.slow
def test_each_dataset_gets_a_row_of_written_and_dropped_trajectories(tmp_path: Path) -> None:
    """Three MuSiQue-format questions whose plan retrieves its gold paragraphs: all written, reward 1."""
    from pvpo.trainer.model.policy import train_tokenizer
    from tests.test_trainer_reference_dataset_source import P_APA, P_JOURNAL, P_OTHER, _musique_rows

    tags = [f"<{t}>" for t in ("think", "search", "information", "answer")]
    tags += [f"</{t}>" for t in ("think", "search", "information", "answer")]
    tok = train_tokenizer([p.text for p in (P_JOURNAL, P_APA, P_OTHER)], vocab_size=400, extra_tokens=tags)
    tok.save_pretrained(tmp_path / "tok")
    (tmp_path / "data" / "musique_mini").mkdir(parents=True)
    (tmp_path / "data" / "musique_mini" / "questions.json").write_text(json.dumps(_musique_rows(3)))
    argv = ["recipe", "gt-coverage", "--tokenizer", str(tmp_path / "tok"), "--data", str(tmp_path / "data")]
    argv += ["--datasets", "musique_mini", "--topk", "2", "--max-turns", "3"]
    got = CliRunner().invoke(app, argv)
    assert got.exit_code == 0, got.output
    assert "command: pvpo recipe gt-coverage --tokenizer" in got.output
    assert "| musique_mini | 3 | 3 | 0 | 0 | 0 | 0 | 3 |" in got.output
