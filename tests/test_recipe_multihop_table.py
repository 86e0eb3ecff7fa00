"""`pvpo recipe table` (pvpo.recipes.multihop.table, by_type): the recipe's held-out table recomputed from `pvpo eval` folders, questions
matched by id across folders written in different orders, per dataset and overall, with the
paired EM differences."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.recipes.multihop.table import answer_in_reach


def _table(argv: list[str]) -> tuple[int, str]:
    """`pvpo recipe table ARGV`: its exit status and what it printed."""
    got = CliRunner().invoke(app, ["recipe", "table", *argv])
    return got.exit_code, got.output


def _write(folder: Path, rows: dict[str, float]) -> None:
    for uid, em in rows.items():
        ds = uid.split("/")[0]
        (folder / ds).mkdir(parents=True, exist_ok=True)
        out = {"metric_score": {"em": em, "f1": em, "acc": em}, "format_ok": True, "num_searches": 2}
        with (folder / ds / "predictions.jsonl").open("a") as f:
            f.write(json.dumps({"id": uid, "output": out}) + "\n")


def test_the_table_pairs_questions_by_id_per_dataset_and_overall(tmp_path):
    warm = {"a/1": 0.0, "a/2": 1.0, "b/1": 0.0, "b/2": 0.0}
    rl = {"b/2": 1.0, "b/1": 1.0, "a/2": 1.0, "a/1": 0.0}  # another order: matched by id
    _write(tmp_path / "warm", warm)
    _write(tmp_path / "rl", rl)
    code, text = _table(["--warm", str(tmp_path / "warm"), "--rl", str(tmp_path / "rl")])
    assert code == 0, text
    assert text.startswith(f"command: pvpo recipe table --warm {tmp_path / 'warm'} --rl {tmp_path / 'rl'}\n")
    assert "| b | 2 | after warm start | 0.000 (0.000) |" in text
    assert "| b | 2 | after RL | 1.000 (0.000) |" in text
    assert "| all | 4 | after RL | 0.750 (0.250) |" in text
    # RL - warm start on a: +0.000; on b: +1.000; overall +0.500 over 4 paired questions
    assert "| a | 2 | +0.000 (0.000) |" in text and "| all | 4 | +0.500 (0.289, +1.7 s.e.) |" in text


def test_an_answer_is_in_reach_only_when_a_retrieved_passage_holds_it_as_a_whole_phrase():
    response = "<search>q</search>\n\n<information>Doc 1(Title: X) The Sparta club, founded 1888.</information>"
    assert answer_in_reach(response, ["sparta"]) and answer_in_reach(response, ["The 1888"])
    assert not answer_in_reach(response, ["Spar"])  # a word's part is not the answer
    assert not answer_in_reach("<answer>Sparta</answer>", ["Sparta"])  # the answer itself is no passage


def test_a_folder_without_predictions_is_refused_naming_it_in_one_line(tmp_path):
    code, text = _table(["--rl", str(tmp_path)])
    assert code == 2 and f"error: {tmp_path} holds no <dataset>/predictions.jsonl" in text and "Traceback" not in text
    code, text = _table([])
    assert code == 2 and "give at least one of --base, --warm, --rl" in text


def _questions(root: Path) -> list[Path]:
    """A 2WikiMultihopQA file (two comparison questions, one compositional) and a MuSiQue one
    (a 2-hop and a 3-hop question), each in its dataset's own format."""
    wiki = root / "2wikimultihopqa" / "questions.jsonl"
    wiki.parent.mkdir(parents=True)
    rows = [("c1", "comparison", "no"), ("c2", "comparison", "yes"), ("k1", "compositional", "Paris")]
    wiki.write_text(
        "".join(
            json.dumps({"_id": i, "type": t, "question": f"q {i}?", "answer": a, "context": [], "evidences": []}) + "\n"
            for i, t, a in rows
        )
    )
    musique = root / "musique_dev" / "questions.jsonl"
    musique.parent.mkdir(parents=True)
    hops = [("2hop__1_2", 2, "Rome"), ("3hop1__1_2_3", 3, "Oslo")]
    musique.write_text(
        "".join(
            json.dumps(
                {
                    "id": i,
                    "question": f"q {i}?",
                    "answer": a,
                    "answer_aliases": [],
                    "paragraphs": [],
                    "question_decomposition": [{"question": f"hop {k}", "answer": "x"} for k in range(n)],
                }
            )
            + "\n"
            for i, n, a in hops
        )
    )
    return [wiki, musique]


GOLD = {
    "2wikimultihopqa/c1": "no",
    "2wikimultihopqa/c2": "yes",
    "2wikimultihopqa/k1": "Paris",
    "musique_dev/2hop__1_2": "Rome",
    "musique_dev/3hop1__1_2_3": "Oslo",
}


def _predictions(folder: Path, em: dict[str, float], reach: set[str], fmt: float = 1.0) -> None:
    """A `pvpo eval` folder: each question's EM, and its gold in the retrieved passages for `reach`."""
    for uid, gold in GOLD.items():
        ds = uid.split("/")[0]
        (folder / ds).mkdir(parents=True, exist_ok=True)
        seen = f"Doc 1(Title: T) It is {gold} indeed." if uid in reach else "Doc 1(Title: T) Nothing here."
        out = {
            "metric_score": {"em": em.get(uid, 0.0), "f1": 0.0, "acc": 0.0},
            "format_ok": fmt,
            "num_searches": 1,
            "final_response": f"<search>q</search>\n\n<information>{seen}</information>",
        }
        with (folder / ds / "predictions.jsonl").open("a") as f:
            f.write(json.dumps({"id": uid, "golden_answers": [gold], "output": out}) + "\n")


def test_the_by_type_table_joins_predictions_with_each_datasets_types_and_counts_the_seeds_spread(tmp_path):
    from pvpo.stats import seeds_contrast, seeds_difference

    questions = _questions(tmp_path / "data")
    c1, c2, k1 = "2wikimultihopqa/c1", "2wikimultihopqa/c2", "2wikimultihopqa/k1"
    _predictions(tmp_path / "warm", {c1: 1}, reach={k1}, fmt=0.0)
    _predictions(tmp_path / "rl0", {c1: 1, c2: 1}, reach={k1})
    _predictions(tmp_path / "rl1", {c1: 1, k1: 1}, reach={k1, "musique_dev/2hop__1_2"})
    _predictions(tmp_path / "sft0", {}, reach=set())
    _predictions(tmp_path / "sft1", {c1: 1}, reach={k1})
    argv = ["--by-type", *(w for q in questions for w in ("--questions", str(q))), "--warm", str(tmp_path / "warm")]
    argv += ["--rl", str(tmp_path / "rl0"), "--rl", str(tmp_path / "rl1")]
    argv += ["--sft", str(tmp_path / "sft0"), "--sft", str(tmp_path / "sft1")]
    code, text = _table(argv)
    assert code == 0, text
    # levels: the mean over seeds; EM where in reach summed over the seeds' in-reach questions
    assert "| 2wikimultihopqa | comparison | 2 | warm start | 0.500 | 0.000 | n/a (0/0) | 0.000 |" in text
    assert "| 2wikimultihopqa | comparison | 2 | RL (2 seeds) | 0.750 | 0.000 | n/a (0/0) | 1.000 |" in text
    assert "| 2wikimultihopqa | compositional | 1 | RL (2 seeds) | 0.500 | 1.000 | 0.500 (1/2) | 1.000 |" in text
    assert "| 2wikimultihopqa | compositional | 1 | SFT (2 seeds) | 0.000 | 0.500 | 0.000 (0/1) | 1.000 |" in text
    assert "| musique_dev | 2-hop | 1 | RL (2 seeds) | 0.000 | 0.500 |" in text  # MuSiQue by its hop count
    assert "| musique_dev | 3-hop | 1 | warm start |" in text
    assert (
        "| 2wikimultihopqa | all | 3 | warm start | 0.333 |" in text
        and "| all | all | 5 | SFT (2 seeds) | 0.100 |" in text
    )
    # differences with the seeds' spread: RL - warm start and RL - SFT on 2Wiki's comparison questions
    rl = [[1.0, 1.0], [1.0, 0.0]]
    d = seeds_difference([1.0, 0.0], rl)
    c = seeds_contrast(rl, [[0.0, 0.0], [1.0, 0.0]])
    row = next(x for x in text.splitlines() if x.startswith("| 2wikimultihopqa | comparison | 2 | +"))
    assert row.split(" | ")[3].startswith(f"+{d['mean']:.3f} ({d['se']:.3f}")
    assert row.split(" | ")[7].startswith(f"+{c['mean']:.3f} ({c['se']:.3f}")
    assert "RL - warm start: EM | RL - warm start: answer in reach | SFT - warm start: EM" in text


def test_the_by_type_table_names_a_question_no_question_file_holds(tmp_path):
    questions = _questions(tmp_path / "data")
    _predictions(tmp_path / "warm", {}, reach=set())
    with (tmp_path / "warm" / "musique_dev" / "predictions.jsonl").open("a") as f:
        f.write(
            json.dumps(
                {
                    "id": "musique_dev/4hop1__9",
                    "golden_answers": ["x"],
                    "output": {"metric_score": {"em": 0, "f1": 0, "acc": 0}},
                }
            )
            + "\n"
        )
    code, text = _table(["--by-type", "--questions", str(questions[0]), "--warm", str(tmp_path / "warm")])
    assert code == 2 and "'musique_dev/2hop__1_2' (and 2 more) is in none of the --questions files" in text
    code, text = _table(["--rl", str(tmp_path / "warm"), "--rl", str(tmp_path / "warm")])
    assert code == 2 and "read by --by-type" in text
    code, text = _table(["--by-type", "--warm", str(tmp_path / "warm")])
    assert code == 2 and "--by-type needs --questions" in text
