"""bench/eval_table.py: the recipe's held-out table recomputed from `pvpo eval` folders, questions
matched by id across folders written in different orders, per dataset and overall, with the
paired EM differences."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

import eval_table  # noqa: E402


def _write(folder: Path, rows: dict[str, float]) -> None:
    for uid, em in rows.items():
        ds = uid.split("/")[0]
        (folder / ds).mkdir(parents=True, exist_ok=True)
        out = {"metric_score": {"em": em, "f1": em, "acc": em}, "format_ok": True, "num_searches": 2}
        with (folder / ds / "predictions.jsonl").open("a") as f:
            f.write(json.dumps({"id": uid, "output": out}) + "\n")


def test_the_table_pairs_questions_by_id_per_dataset_and_overall(tmp_path, capsys):
    warm = {"a/1": 0.0, "a/2": 1.0, "b/1": 0.0, "b/2": 0.0}
    rl = {"b/2": 1.0, "b/1": 1.0, "a/2": 1.0, "a/1": 0.0}  # another order: matched by id
    _write(tmp_path / "warm", warm)
    _write(tmp_path / "rl", rl)
    assert eval_table.main(["--warm", str(tmp_path / "warm"), "--rl", str(tmp_path / "rl")]) == 0
    text = capsys.readouterr().out
    assert "| b | 2 | after warm start | 0.000 (0.000) |" in text
    assert "| b | 2 | after RL | 1.000 (0.000) |" in text
    assert "| all | 4 | after RL | 0.750 (0.250) |" in text
    # RL - warm start on a: +0.000; on b: +1.000; overall +0.500 over 4 paired questions
    assert "| a | 2 | +0.000 (0.000) |" in text and "| all | 4 | +0.500 (0.289, +1.7 s.e.) |" in text


def test_an_answer_is_in_reach_only_when_a_retrieved_passage_holds_it_as_a_whole_phrase():
    response = "<search>q</search>\n\n<information>Doc 1(Title: X) The Sparta club, founded 1888.</information>"
    assert eval_table.answer_in_reach(response, ["sparta"]) and eval_table.answer_in_reach(response, ["The 1888"])
    assert not eval_table.answer_in_reach(response, ["Spar"])  # a word's part is not the answer
    assert not eval_table.answer_in_reach("<answer>Sparta</answer>", ["Sparta"])  # the answer itself is no passage


def test_a_folder_without_predictions_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="holds no <dataset>/predictions.jsonl"):
        eval_table.main(["--rl", str(tmp_path)])
