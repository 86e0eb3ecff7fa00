"""Index files under faults: a cut `index.faiss` or `meta.json` is one line naming the file and
how to rebuild the index; a damaged `corpus.offsets.npy` (a cache) is rebuilt, with a warning
naming it; a disk that fills up while the index is written is the full-disk error, with no
temporary file left."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.atomic import DamagedFileError
from pvpo.retriever.index import load_retriever
from pvpo.retriever.testing import TINY_QUERIES, build_tiny_index


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_index(tmp_path_factory.getbasetemp() / "retriever")


def _damaged_copy(index_dir: Path, tmp_path: Path, name: str) -> Path:
    copy = Path(shutil.copytree(index_dir, tmp_path / "index"))
    if not (copy / "corpus.offsets.npy").exists():  # written on first open
        load_retriever(copy, device="cpu").close()
    (copy / name).write_bytes((copy / name).read_bytes()[:20])
    return copy


@pytest.mark.parametrize("name", ["index.faiss", "meta.json"])
def test_a_cut_index_file_is_one_line_naming_it_and_how_to_rebuild(index_dir: Path, tmp_path: Path, name: str) -> None:
    from pvpo.cli import app

    bad = _damaged_copy(index_dir, tmp_path, name)
    with pytest.raises(DamagedFileError, match=rf"{bad / name} is damaged \(.*\): rebuild the index"):
        load_retriever(bad, device="cpu")
    res = CliRunner().invoke(app, ["retriever", "serve", "--index", str(bad), "--port", "9"])  # refused before serving
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"error: {bad / name} is damaged" in res.output


def test_a_damaged_offsets_cache_is_rebuilt_with_a_warning_naming_it(
    index_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = _damaged_copy(index_dir, tmp_path, "corpus.offsets.npy")
    with caplog.at_level(logging.WARNING):
        retriever = load_retriever(bad, device="cpu")
    try:
        assert f"{bad / 'corpus.offsets.npy'} is damaged" in caplog.text and "rebuilding it" in caplog.text
        query, title = TINY_QUERIES[0]
        assert retriever.search([query], topk=1)[0][0].title == title
    finally:
        retriever.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_retriever(bad, device="cpu").close()
    assert "damaged" not in caplog.text  # the rebuilt cache is whole


def test_a_full_disk_while_the_index_is_written_is_the_no_space_error_naming_it(
    index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import faiss

    import pvpo.atomic
    from pvpo.retriever.build import build_index

    out = Path(shutil.copytree(index_dir, tmp_path / "index"))  # its embeddings are reused: nothing is encoded
    (out / "meta.json").unlink()
    (out / "index.faiss").unlink()

    def write_on_a_full_disk(index: object, path: str) -> None:
        Path(path).write_bytes(b"half an index")
        raise RuntimeError("Error in faiss::FileIOWriter::operator() at impl/io.cpp:113: Error: 'ret == nitems' failed")

    monkeypatch.setattr(faiss, "write_index", write_on_a_full_disk)
    monkeypatch.setattr(pvpo.atomic, "_free_bytes", lambda path: 0)
    with pytest.raises(OSError) as info:
        build_index(index_dir.parent / "tiny_corpus.json", out, show_progress=False, batch_size=64)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(out / "index.faiss"))
    assert not (out / "index.faiss.tmp").exists() and not (out / "index.faiss").exists()
