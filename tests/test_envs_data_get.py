"""`pvpo data get NAME`: a named question set onto this machine from a local copy (`--from`) in
FlashRAG's layout or flat, a seeded subset, records unchanged; its own files only replaced with
--overwrite; one line and exit status 2 where the hub cannot be reached or the name or split is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from pvpo.cli import app
from pvpo.envs import fetch
from pvpo.envs.loaders import load_dataset

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "quickstart" / "hotpotqa_mini" / "questions.json"
runner = CliRunner()


def flashrag_records() -> list[dict]:
    """The shipped HotpotQA questions as FlashRAG writes HotpotQA: the context and the supporting
    facts in `metadata`, in the Hugging Face layout."""
    out = []
    for r in json.loads(FIXTURE.read_text(encoding="utf-8")):
        context = {"title": [c[0] for c in r["context"]], "sentences": [c[1] for c in r["context"]]}
        facts = {"title": [f[0] for f in r["supporting_facts"]], "sent_id": [f[1] for f in r["supporting_facts"]]}
        meta = {"context": context, "supporting_facts": facts, "type": r["type"]}
        out.append({"id": r["_id"], "question": r["question"], "golden_answers": [r["answer"]], "metadata": meta})
    return out


def local_copy(root: Path, relative: str) -> list[str]:
    lines = [json.dumps(r) for r in flashrag_records()]
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


def invoke(*args: str) -> Result:
    return runner.invoke(app, ["data", "get", *args], env={"COLUMNS": "200"})


def test_get_from_a_local_copy_writes_the_split_unchanged_with_its_paragraphs(tmp_path: Path) -> None:
    lines = local_copy(tmp_path / "copy", "hotpotqa/dev.jsonl")
    result = invoke("hotpotqa", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    written = tmp_path / "data" / "hotpotqa" / "dev.jsonl"
    assert written.read_text(encoding="utf-8").splitlines() == lines
    assert f"3 of 3 questions (3 with paragraphs) from {tmp_path / 'copy' / 'hotpotqa' / 'dev.jsonl'}" in result.output
    assert written.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as `open` makes a file, not mkstemp's 0600
    examples = load_dataset(written)
    assert [len(e.paragraphs) for e in examples] == [3, 3, 3]
    manifest = json.loads((tmp_path / "data" / fetch.MANIFEST).read_text(encoding="utf-8"))
    assert list(manifest["files"]) == ["hotpotqa/dev.jsonl"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_limit_keeps_a_seeded_draw_in_file_order_and_a_flat_copy_is_found_by_alias(tmp_path: Path) -> None:
    lines = local_copy(tmp_path / "flat", "hotpotqa.train.jsonl")
    args = ("hotpot", "--split", "train", "--from", str(tmp_path / "flat"), "--limit", "2", "--seed", "3")
    first = invoke(*args, "--out", str(tmp_path / "a"))
    again = invoke(*args, "--out", str(tmp_path / "b"))
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    kept = (tmp_path / "a" / "hotpotqa" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    assert kept == (tmp_path / "b" / "hotpotqa" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(kept) == 2 and kept == [line for line in lines if line in kept]
    assert "2 of 3 questions" in first.output


def test_an_existing_file_is_replaced_only_with_overwrite_and_only_when_get_wrote_it(tmp_path: Path) -> None:
    local_copy(tmp_path / "copy", "hotpotqa/dev.jsonl")
    base = ("hotpotqa", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"))
    assert invoke(*base, "--limit", "1").exit_code == 0
    refused = invoke(*base)
    assert refused.exit_code == 2 and "exists: pass --overwrite" in refused.output
    assert len((tmp_path / "data" / "hotpotqa" / "dev.jsonl").read_text().splitlines()) == 1
    replaced = invoke(*base, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert len((tmp_path / "data" / "hotpotqa" / "dev.jsonl").read_text().splitlines()) == 3
    users = tmp_path / "mine" / "hotpotqa" / "dev.jsonl"
    users.parent.mkdir(parents=True)
    users.write_text("my notes\n")
    kept = invoke("hotpotqa", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "mine"), "--overwrite")
    assert kept.exit_code == 2 and "was not written by `pvpo data get`" in kept.output
    assert users.read_text() == "my notes\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("squad",), "no question set named 'squad'"),
        (("popqa", "--split", "train"), "popqa has no 'train' split: give --split test"),
        (("hotpotqa", "--limit", "0"), "--limit must be at least 1"),
    ],
)
def test_a_wrong_name_split_or_limit_is_one_line_before_anything_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], says: str
) -> None:
    def no_fetch(name: str, split: str) -> Path:
        raise AssertionError("fetched before the arguments were checked")

    monkeypatch.setattr(fetch, "hub_file", no_fetch)
    monkeypatch.setattr(fetch.get, "__kwdefaults__", {**(fetch.get.__kwdefaults__ or {}), "fetch": no_fetch})
    result = invoke(*args, "--out", str(tmp_path / "data"))
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "data").exists()


def test_without_the_hub_the_command_ends_with_one_line_naming_from(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "pvpo.cli", "data", "get", "musique", "--out", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--from DIR (DIR/musique_ans_v1.0_dev.jsonl)" in errors[0], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "data" / "musique").exists()


def test_get_help_explains_the_source_the_layout_and_from() -> None:
    result = runner.invoke(app, ["data", "get", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    for words in ("RUC-NLPIR/FlashRAG_datasets", "--from", "OUT/NAME/SPLIT.jsonl", "--limit", "hotpotqa", "musique"):
        assert words in text, words


def test_list_names_every_set_and_its_splits() -> None:
    result = invoke("--list")
    assert result.exit_code == 0
    assert [line.split("\t")[0] for line in result.output.splitlines()] == list(fetch.SPLITS)


def test_name_writes_the_set_under_a_folder_that_names_its_questions(tmp_path: Path) -> None:
    local_copy(tmp_path / "copy", "hotpotqa/dev.jsonl")
    args = ("hotpotqa", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"), "--name", "hotpotqa_hard")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    examples = load_dataset(tmp_path / "data" / "hotpotqa_hard" / "dev.jsonl")
    assert [e.uid.split("/")[0] for e in examples] == ["hotpotqa_hard"] * 3
    bad = invoke("hotpotqa", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"), "--name", "a/b")
    assert bad.exit_code == 2 and "cannot name a results folder" in bad.output


def test_musique_comes_as_released_with_its_paragraphs_and_is_read_from_a_copy_of_that_file(tmp_path: Path) -> None:
    assert fetch.source("musique", "dev") == ("dgslibisey/MuSiQue", "musique_ans_v1.0_dev.jsonl")
    assert fetch.source("hotpotqa", "train") == (fetch.HUB_REPO, "hotpotqa/train.jsonl")
    record = {
        "id": "2hop__1",
        "question": "Who founded the company that makes the Walkman?",
        "answer": "Masaru Ibuka",
        "answer_aliases": [],
        "paragraphs": [
            {"idx": 0, "title": "Walkman", "paragraph_text": "The Walkman is made by Sony.", "is_supporting": True},
            {"idx": 1, "title": "Sony", "paragraph_text": "Sony was founded by Masaru Ibuka.", "is_supporting": True},
        ],
        "question_decomposition": [
            {"id": 1, "question": "Walkman >> maker", "answer": "Sony", "paragraph_support_idx": 0}
        ],
        "answerable": True,
    }
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "musique_ans_v1.0_dev.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    result = invoke("musique", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    assert "1 of 1 questions (1 with paragraphs)" in result.output and "note:" not in result.output
    [example] = load_dataset(tmp_path / "data" / "musique" / "dev.jsonl")
    assert [p.title for p in example.paragraphs] == ["Walkman", "Sony"]


def test_a_set_without_paragraphs_says_a_corpus_must_come_from_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "nq.test.jsonl").write_text(
        json.dumps({"id": "1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}) + "\n",
        encoding="utf-8",
    )
    result = invoke("nq", "--from", str(tmp_path / "copy"), "--out", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    assert "(0 with paragraphs)" in result.output and "note: no question carries paragraphs" in result.output
