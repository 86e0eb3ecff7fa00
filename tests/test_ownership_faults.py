"""A user's files under the writers' flags: nothing a user owns is touched by an output flag, a
resume or a default folder. A folder or file is pvpo's only by the manifest it wrote naming it
(`pvpo.owned`); every refusal is one line, exit status 2, before anything is written. The same
faults, through the CLI as a user runs them, are rows of the fault table (`bench/faults/ownership.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_support import TINY
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.owned import RECORD, FolderError, claim
from pvpo.retriever.testing import write_tiny_corpus

NOTES = b"a user's notes\n"


def _pvpo(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})
    return res.exit_code, res.output


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(code: int, output: str, *expect: str) -> bool:
    """rc 2, an error of one line (and the --debug hint) holding each of `expect`, no traceback."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    error = lines[next((i for i, ln in enumerate(lines) if ln.startswith("error:")), len(lines)) :]
    text = " ".join(error)
    return code == 2 and 1 <= len(error) <= 2 and all(e in text for e in expect) and "Traceback" not in output


def _users_data(folder: Path) -> Path:
    """A user's data folder holding files of the names a build writes: a meta.json, a corpus with
    its own fields and an embeddings/ of their own."""
    (folder / "embeddings").mkdir(parents=True)
    (folder / "embeddings" / "vectors.npy").write_bytes(b"the user's vectors")
    (folder / "meta.json").write_text('{"project": "mine"}')
    (folder / "corpus.jsonl").write_text('{"id": "1", "title": "T", "text": "body", "url": "http://x"}\n')
    return folder


# ---- item 1: a user's folder with a meta.json and embeddings/ is not an earlier build -------------
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_build_into_a_users_folder_holding_meta_json_and_embeddings_keeps_every_file(tmp_path, overwrite) -> None:
    data = _users_data(tmp_path / "data")
    before = _files(data)
    corpus = write_tiny_corpus(tmp_path / "c.json")
    args = ["retriever", "build", "--corpus", str(corpus), "--out", str(data), "--index-type", "bm25"]
    code, output = _pvpo(*args, *(["--overwrite"] if overwrite else []))
    assert _one_line(code, output, str(data)), output
    assert _files(data) == before


# ---- item 2: a corpus inside --out is never rewritten ---------------------------------------------
def test_a_corpus_inside_what_a_build_writes_is_refused_and_left_as_it_was(tmp_path) -> None:
    corpus, out = write_tiny_corpus(tmp_path / "c.json"), tmp_path / "idx"
    assert _pvpo("retriever", "build", "--corpus", str(corpus), "--out", str(out), "--index-type", "bm25")[0] == 0
    mine = out / "corpus.jsonl"
    mine.write_text('{"id": "1", "title": "T", "text": "body", "url": "http://x"}\n')  # the user's edit
    before = _files(out)
    for extra in ([], ["--overwrite"]):
        code, output = _pvpo(
            "retriever", "build", "--corpus", str(mine), "--out", str(out), "--index-type", "bm25", *extra
        )
        assert _one_line(code, output, "inside --out", "move it out"), output
        assert _files(out) == before


# ---- item 3: a finished index of another corpus is replaced only with --overwrite -----------------
def test_a_finished_index_of_another_corpus_is_replaced_only_with_overwrite(tmp_path) -> None:
    a, out = write_tiny_corpus(tmp_path / "a.json"), tmp_path / "idx"
    b = tmp_path / "b.jsonl"
    b.write_text('{"id": "b1", "contents": "another corpus"}\n')
    assert _pvpo("retriever", "build", "--corpus", str(a), "--out", str(out), "--index-type", "bm25")[0] == 0
    before = _files(out)
    code, output = _pvpo("retriever", "build", "--corpus", str(b), "--out", str(out), "--index-type", "bm25")
    assert _one_line(code, output, "already holds a finished index", str(a.resolve()), "--overwrite"), output
    assert _files(out) == before
    code, output = _pvpo(
        "retriever", "build", "--corpus", str(b), "--out", str(out), "--index-type", "bm25", "--overwrite"
    )
    assert code == 0, output
    assert json.loads((out / "meta.json").read_text())["size"] == 1


# ---- item 4: the trainer's retriever.index_dir goes through the same check, first -----------------
def test_train_with_a_users_data_folder_as_index_dir_is_refused_before_anything_is_written(tmp_path) -> None:
    data = _users_data(tmp_path / "data")
    (data / "meta.json").unlink()  # no index there: the trainer would build one
    before = _files(data)
    run = tmp_path / "run"
    code, output = _pvpo("train", "--run-dir", str(run), *TINY, f"retriever.index_dir={data}")
    assert _one_line(code, output, "retriever.index_dir", str(data)), output
    assert _files(data) == before and not run.exists()


def test_the_trainers_index_build_refuses_a_users_folder_past_the_cli_too(tmp_path) -> None:
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import retriever_session

    data = _users_data(tmp_path / "data")
    (data / "meta.json").unlink()
    before = _files(data)
    cfg = load_config(None, [*TINY, f"retriever.index_dir={data}"])
    with pytest.raises(ValueError, match=r"retriever.index_dir|pvpo did not write"):
        with retriever_session(cfg, tmp_path / "run", write_tiny_corpus(tmp_path / "c.json")):
            pass
    assert _files(data) == before


# ---- item 5: only checkpoints the manifest names are pruned ---------------------------------------
def test_pruning_keeps_a_users_step_named_copy_and_a_users_file_inside_a_pruned_checkpoint(tmp_path) -> None:
    from pvpo.trainer.state.checkpoint import note_checkpoint, prune_checkpoints

    root = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        name = f"step_{step:06d}"
        note_checkpoint(root, name)
        (root / name / "policy").mkdir(parents=True)
        (root / name / "trainer_state.pt").write_bytes(b"state")
    (root / "step_000002_good").mkdir()
    (root / "step_000002_good" / "trainer_state.pt").write_bytes(b"the user's copy")
    (root / "step_000001" / "NOTES.md").write_bytes(NOTES)
    prune_checkpoints(root, keep=1)
    assert (root / "step_000002_good" / "trainer_state.pt").read_bytes() == b"the user's copy"
    assert (root / "step_000001" / "NOTES.md").read_bytes() == NOTES
    assert not (root / "step_000001" / "trainer_state.pt").exists() and not (root / "step_000002").exists()
    assert (root / "step_000003" / "trainer_state.pt").exists()


# ---- items 6 and 8: pvpo view --out and eval report --md / --csv ----------------------------------
def _eval_folder(tmp_path: Path) -> Path:
    from pvpo.evaluation.run import EVAL_KIND

    toy = tmp_path / "out" / "toy"
    claim(toy, EVAL_KIND)
    (toy / "predictions.jsonl").write_text('{"id": "1", "question": "q?", "golden_answers": ["a"], "output": {}}\n')
    (toy / "run.json").write_text("{}")
    return toy


@pytest.mark.parametrize("overwrite", [False, True])
def test_view_never_writes_its_page_over_a_runs_or_an_evaluations_own_files(tmp_path, overwrite) -> None:
    from pvpo.trainer.state.run_dir import RUN_KIND

    toy = _eval_folder(tmp_path)
    run = tmp_path / "run"
    claim(run, RUN_KIND)
    (run / "config.yaml").write_text("run: {}\n")
    extra = ["--overwrite"] if overwrite else []
    for target in (toy / "predictions.jsonl", run / "config.yaml", run / "checkpoints" / "latest"):
        before = _files(tmp_path)
        code, output = _pvpo("view", str(toy), "--out", str(target), *extra)
        assert _one_line(code, output, str(target), "give another path"), output
        assert _files(tmp_path) == before


def test_view_and_eval_report_replace_an_existing_file_only_with_overwrite(tmp_path) -> None:
    toy = _eval_folder(tmp_path)
    thesis, notes, table = tmp_path / "thesis.txt", tmp_path / "notes.md", tmp_path / "table.csv"
    for f in (thesis, notes, table):
        f.write_bytes(NOTES)
    code, output = _pvpo("view", str(toy), "--out", str(thesis))
    assert _one_line(code, output, str(thesis), "--overwrite"), output
    code, output = _pvpo("eval", "report", str(toy), "--md", str(notes), "--csv", str(table))
    assert _one_line(code, output, str(notes), "--overwrite"), output
    assert all(f.read_bytes() == NOTES for f in (thesis, notes, table))
    code, output = _pvpo("view", str(toy), "--out", str(thesis), "--overwrite")
    assert code == 0 and thesis.read_bytes().lower().startswith(b"<!doctype html>"), output


def test_view_refuses_to_write_its_page_over_the_predictions_file_it_reads(tmp_path) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"], "output": {}}\n')
    code, output = _pvpo("view", str(preds), "--out", str(preds), "--overwrite")
    assert _one_line(code, output, "reads"), output
    assert preds.read_text().startswith('{"id"')


# ---- item 7: a demo never replaces a training run; distinct default folders -----------------------
def test_a_demo_into_a_training_runs_folder_is_refused_in_one_line_and_the_run_kept(tmp_path) -> None:
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "R"
    claim(run, RUN_KIND, info={"command": "pvpo train"})
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step_000001")
    before = _files(run)
    code, output = _pvpo("demo", "--config", "smoke", "--run-dir", str(run))
    assert _one_line(code, output, str(run), "training run", "another --run-dir"), output
    assert _files(run) == before


def test_pvpo_train_and_pvpo_demo_default_to_different_folders() -> None:
    import inspect

    from pvpo.recipes.cli import demo_cmd
    from pvpo.trainer.cli import default_run_dir

    demo_default = inspect.signature(demo_cmd).parameters["run_dir"].default
    assert {default_run_dir(Path("demo")), default_run_dir(Path("configs/demo.yaml"))} == {Path("runs/train-demo")}
    assert demo_default == Path("runs/demo") != default_run_dir(Path("demo"))


# ---- item 9: --overwrite and nested or marker-only user files -------------------------------------
def test_overwrite_refuses_a_users_file_nested_in_checkpoints_and_keeps_every_file(tmp_path) -> None:
    from pvpo.trainer.state.checkpoint import note_checkpoint
    from pvpo.trainer.state.resume import RunDirError, fresh_run_dir
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "run"
    claim(run, RUN_KIND)
    (run / "metrics.jsonl").write_text('{"step": 2}\n')
    note_checkpoint(run / "checkpoints", "step_000002")
    (run / "checkpoints" / "step_000002").mkdir()
    (run / "checkpoints" / "step_000002" / "NOTES.md").write_bytes(NOTES)
    (run / "checkpoints" / "README").write_bytes(NOTES)
    before = _files(run)
    with pytest.raises(RunDirError, match=r"checkpoints/README.*1 more.*move it out"):
        with fresh_run_dir(run, overwrite=True):
            pass
    assert _files(run) == before


def test_eval_onto_a_folder_whose_only_marker_is_a_users_run_json_is_refused_with_or_without_overwrite(
    tmp_path,
) -> None:
    from pvpo.evaluation.run import EvalError, check_out_dir

    out = tmp_path / "out"
    (out / "toy").mkdir(parents=True)
    (out / "toy" / "run.json").write_bytes(NOTES)
    for overwrite in (False, True):
        with pytest.raises(EvalError, match="run.json.*pvpo did not write"):
            check_out_dir(out, ["toy"], overwrite=overwrite)
    assert _files(out) == {"toy/run.json": NOTES}


def test_a_folder_is_pvpos_only_by_a_manifest_naming_its_entries(tmp_path) -> None:
    from pvpo.owned import check_output_file, entries
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_000001")  # a run's marker, without a manifest
    assert entries(run, RUN_KIND) == ([], ["checkpoints"])
    (run / "notes.txt").write_bytes(NOTES)
    claim(run, RUN_KIND)  # names the run's entries not yet taken; checkpoints/ was there first
    ours, users = entries(run, RUN_KIND)
    assert RECORD in ours and users == ["checkpoints", "notes.txt"]
    assert "config.yaml" in json.loads((run / RECORD).read_text())["entries"]
    with pytest.raises(FolderError, match="give another path"):
        check_output_file(run / "config.yaml", "--out", overwrite=True)
    assert check_output_file(run / "page.html", "--out", overwrite=False) == run / "page.html"


def test_eval_rescore_never_writes_over_the_predictions_it_reads_nor_an_existing_file(tmp_path) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"], "pred": "a"}\n')
    before = preds.read_bytes()
    code, output = _pvpo("eval", "rescore", str(preds), "--out", str(preds), "--overwrite")
    assert _one_line(code, output, "reads"), output
    mine = tmp_path / "thesis.txt"
    mine.write_bytes(NOTES)
    code, output = _pvpo("eval", "rescore", str(preds), "--out", str(mine))
    assert _one_line(code, output, str(mine), "--overwrite"), output
    assert preds.read_bytes() == before and mine.read_bytes() == NOTES
    code, output = _pvpo("eval", "rescore", str(preds), "--out", str(mine), "--overwrite")
    assert code == 0 and b'"id": "1"' in mine.read_bytes(), output


def test_eval_report_refuses_md_and_csv_naming_one_file(tmp_path) -> None:
    toy = _eval_folder(tmp_path)
    table = tmp_path / "table.txt"
    code, output = _pvpo("eval", "report", str(toy), "--md", str(table), "--csv", str(table))
    assert _one_line(code, output, "--md and --csv name one file"), output
    assert not table.exists()
