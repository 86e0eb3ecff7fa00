"""Dataset loaders (format detection, uids, answers, paragraphs) and corpus building."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared_data
from typer.testing import CliRunner

from pvpo.envs import QAExample, SyntheticWorld, corpus_from_examples, detect_format, load_dataset, read_corpus
from pvpo.envs.loaders import DataFileError
from pvpo.retriever.types import split_contents


@pytest.mark.parametrize("name,count", [("bamboogle", 125), ("nq", 1000), ("popqa", 1000), ("triviaqa", 1000)])
def test_flashrag_files_load_with_dataset_prefixed_uids(name: str, count: int) -> None:
    path = shared_data("flashrag", f"{name}.test.jsonl")
    examples = load_dataset(path)
    first = json.loads(path.read_text().splitlines()[0])
    assert len(examples) == count and len({e.uid for e in examples}) == count
    assert examples[0].uid == f"{name}/{first['id']}" and examples[0].question == first["question"].strip()
    assert list(examples[0].golden_answers) == list(dict.fromkeys(g.strip() for g in first["golden_answers"]))


def test_raw_musique_keeps_paragraphs_support_and_decomposition() -> None:
    path = shared_data("musique_mini", "questions.json")
    raw = json.loads(path.read_text())
    examples = load_dataset(path)
    assert detect_format(raw[0]).name == "musique" and len(examples) == 100
    ex, r = examples[0], raw[0]
    assert ex.uid == f"musique_mini/{r['id']}" and ex.golden_answers == (r["answer"], *r["answer_aliases"])
    assert len(ex.paragraphs) == len(r["paragraphs"])
    assert {p.title for p in ex.supporting} == {p["title"] for p in r["paragraphs"] if p["is_supporting"]}
    for step in ex.metadata["question_decomposition"]:
        assert ex.paragraphs[step["paragraph"]].is_supporting


def test_raw_hotpotqa_marks_supporting_titles_and_joins_sentences() -> None:
    path = shared_data("hotpotqa_mini", "questions.json")
    raw = json.loads(path.read_text())
    ex = load_dataset(path)[0]
    assert detect_format(raw[0]).name == "hotpotqa" and ex.uid == f"hotpotqa_mini/{raw[0]['_id']}"
    assert {p.title for p in ex.supporting} == {t for t, _ in raw[0]["supporting_facts"]}
    title, sentences = raw[0]["context"][0]
    assert ex.paragraphs[0].title == title and ex.paragraphs[0].text == "".join(sentences).strip()


def test_raw_2wiki_is_told_apart_from_hotpotqa(tmp_path: Path) -> None:
    record = {
        "_id": "abc",
        "type": "compositional",
        "question": "Who is the father of X?",
        "context": [["X", ["X is a film.", "Its director is Y."]], ["Z", ["Z is a town."]]],
        "supporting_facts": [["X", 1]],
        "evidences": [["X", "director", "Y"]],
        "answer": "Y",
    }
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([record]))
    [ex] = load_dataset(path, name="2wiki")
    assert detect_format(record).name == "2wikimultihopqa" and ex.uid == "2wiki/abc"
    assert ex.paragraphs[0].text == "X is a film. Its director is Y." and [p.title for p in ex.supporting] == ["X"]


def test_flashrag_multihop_metadata_gives_paragraphs(tmp_path: Path) -> None:
    rec = {
        "id": "dev_0",
        "question": "q?",
        "golden_answers": ["a"],
        "metadata": {
            "context": {"title": ["T1", "T2"], "sentences": [[" s1.", " s2."], ["u."]]},
            "supporting_facts": {"title": ["T2"], "sent_id": [0]},
        },
    }
    path = tmp_path / "hotpotqa.dev.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    [ex] = load_dataset(path)
    assert ex.uid == "hotpotqa/dev_0" and [(p.title, p.text, p.is_supporting) for p in ex.paragraphs] == [
        ("T1", "s1. s2.", False),
        ("T2", "u.", True),
    ]


def test_unknown_records_and_duplicate_uids_are_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(ValueError, match="unrecognised"):
        load_dataset(bad)
    with pytest.raises(ValueError, match="duplicate uid"):
        load_dataset([QAExample("d/1", "q", ("a",)), QAExample("d/1", "q2", ("b",))])
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.jsonl")


def test_a_duplicate_id_in_a_dataset_file_names_the_file_not_a_python_repr(tmp_path: Path) -> None:
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps({"id": "1", "question": q, "golden_answers": ["a"]}) + "\n" for q in "xy"))
    with pytest.raises(ValueError) as info:
        load_dataset(dup)
    assert str(info.value) == f"duplicate uid 'dup/1' in dataset {dup}: give each question its own id"


def test_corpus_command_writes_each_distinct_paragraph_once(tmp_path: Path) -> None:
    from pvpo.cli import app

    path = shared_data("musique_mini", "questions.json")
    out = tmp_path / "corpus.jsonl"
    result = CliRunner().invoke(app, ["data", "corpus", str(path), str(out)])
    assert result.exit_code == 0, result.output
    passages = read_corpus(out)
    raw = json.loads(path.read_text())
    distinct = {(p["title"].strip(), p["paragraph_text"].strip()) for r in raw for p in r["paragraphs"]}
    assert len(passages) == len(distinct) == len({p.contents for p in passages})
    assert split_contents(passages[0].contents) == (
        raw[0]["paragraphs"][0]["title"],
        raw[0]["paragraphs"][0]["paragraph_text"].strip(),
    )


def test_synthetic_command_writes_files_that_load_back_with_the_same_uids(tmp_path: Path) -> None:
    from pvpo.cli import app

    result = CliRunner().invoke(
        app, ["data", "synthetic", str(tmp_path), "--seed", "2", "--n-entities", "20", "--questions-per-hop", "10"]
    )
    assert result.exit_code == 0, result.output
    world = SyntheticWorld.generate(2, 20, questions_per_hop=10)
    loaded = load_dataset(tmp_path / "test.jsonl", name="synthetic-s2")
    assert [e.uid for e in loaded] == [e.uid for e in world.questions("test")]
    assert world.oracle_trajectory(loaded[-1]) == world.oracle_trajectory(world.questions("test")[-1])
    assert [p.contents for p in read_corpus(tmp_path / "corpus.jsonl")] == [p.contents for p in world.passages]
    assert len(corpus_from_examples(world.questions("train"))) > 0


# ---- bad data files: one error naming the file, the line and the fix -------------------
_ROW = '{"id": "%d", "question": "q%d?", "golden_answers": ["a"]}'


def test_malformed_json_on_line_2_of_a_jsonl_dataset_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(_ROW % (1, 1) + '\n{"id": "2", "question": "unterminated\n')
    with pytest.raises(DataFileError, match=r"qa.jsonl: line 2, column \d+: malformed JSON"):
        load_dataset(path)


def test_malformed_json_list_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.json"
    path.write_text("[\n" + _ROW % (1, 1) + ",\n{oops}\n]\n")
    with pytest.raises(DataFileError, match=r"qa.json: line 3, column 2: malformed JSON"):
        load_dataset(path)


def test_a_non_utf8_dataset_names_the_file_the_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_bytes((_ROW % (1, 1) + "\n").encode() + b'{"question": "\xff"}\n')
    with pytest.raises(DataFileError, match=r"qa.jsonl: line 2: byte 0xff is not UTF-8: re-save the file as UTF-8"):
        load_dataset(path)


def test_an_empty_dataset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DataFileError, match="empty.jsonl holds no questions"):
        load_dataset(path)


def test_rows_without_golden_answers_are_skipped_with_a_counting_warning_and_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(
        "\n".join(
            [_ROW % (1, 1), '{"id": "2", "question": "q2?", "golden_answers": []}', '{"id": "3", "question": "q3?"}']
        )
        + "\n"
    )
    with caplog.at_level("WARNING"):
        examples = load_dataset(path, format="flashrag")
    assert [e.uid for e in examples] == ["qa/1"]
    assert "skipped 2 of 3 records without golden answers (first at line 2)" in caplog.text


def test_a_record_that_is_not_an_object_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(_ROW % (1, 1) + "\n[1, 2]\n")
    with pytest.raises(DataFileError, match="qa.jsonl: line 2: expected a JSON object, got list"):
        load_dataset(path)


def test_parquet_datasets_read_like_jsonl(tmp_path: Path) -> None:
    import pyarrow as pa  # a dependency of the package (parquet question files)
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{"id": "1", "question": "q?", "golden_answers": ["a"]}]), tmp_path / "qa.parquet"
    )
    assert [(e.uid, e.golden_answers) for e in load_dataset(tmp_path / "qa.parquet")] == [("qa/1", ("a",))]


def test_questions_longer_than_the_limit_are_cut_with_a_warning_counting_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pvpo.envs.episode import MAX_QUESTION_CHARS, EpisodeConfig
    from pvpo.envs.loaders import bound_questions

    path = tmp_path / "qa.jsonl"
    huge = "why " * 250_000  # 1 MB
    path.write_text(
        json.dumps({"id": "1", "question": huge, "golden_answers": ["a"]})
        + "\n"
        + json.dumps({"id": "2", "question": "short?", "golden_answers": ["a"]})
        + "\n"
    )
    with caplog.at_level("WARNING"):
        examples = bound_questions(load_dataset(path), MAX_QUESTION_CHARS, path)
    assert len(examples[0].question) <= MAX_QUESTION_CHARS and examples[1].question == "short?"
    assert "1 of 2 questions longer than 4096 characters were cut" in caplog.text
    # a question that reaches the env another way is cut in the prompt too
    prompt = EpisodeConfig().prompt(QAExample("x/1", huge, ("a",)))
    assert len(prompt) < MAX_QUESTION_CHARS + 1000


def test_a_file_mixing_formats_reads_each_row_in_its_own_format(tmp_path: Path, caplog) -> None:
    """A MuSiQue row after a FlashRAG one was read as FlashRAG and "skipped ... without golden
    answers" though it has them."""
    import logging

    rows = [
        {"id": "1", "question": "q1?", "golden_answers": ["a"]},
        {"id": "2", "question": "q2?", "answer": "b", "paragraphs": [], "question_decomposition": []},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        examples = load_dataset(path)
    assert [(e.uid, e.golden_answers) for e in examples] == [("mixed/1", ("a",)), ("mixed/2", ("b",))]
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_a_generic_or_empty_file_name_names_the_dataset_by_its_folder(tmp_path: Path) -> None:
    from pvpo.envs.loaders import dataset_name_for

    assert dataset_name_for(tmp_path / "musique_mini" / "questions.json") == "musique_mini"
    assert dataset_name_for(tmp_path / "qa" / ".jsonl") == "qa"
    assert dataset_name_for(tmp_path / "bamboogle.test.jsonl") == "bamboogle"
