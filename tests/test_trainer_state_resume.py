"""Run directories: a resume trains with the run's own config and refuses a
conflicting one; a fresh run refuses a directory that already holds a run unless told to
overwrite it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_support import TINY, WORLD, OverlapSearcher
from typer.testing import CliRunner

from pvpo.atomic import replaced_path
from pvpo.owned import ASIDE, RECORD
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.config.written import dump_config
from pvpo.trainer.state.checkpoint import save_checkpoint
from pvpo.trainer.state.resume import RunDirError, check_resume_config, fresh_run_dir, resume_config


def _run_with_config(tmp_path: Path, *overrides: str) -> Path:
    from pvpo.owned import claim
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "run"
    claim(run, RUN_KIND)  # a run's manifest, written before its config
    dump_config(load_config(None, ["run.steps=3", "optim.lr=0.5", *overrides]), run / "config.yaml")
    return run


def test_resume_uses_the_runs_own_config_and_allows_safe_overrides(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    cfg = resume_config(run, ["run.steps=5", "retriever.retries=2"])
    assert (cfg.optim.lr, cfg.run.steps, cfg.retriever.retries) == (0.5, 5, 2)


def test_resume_refuses_an_override_that_changes_the_training(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    with pytest.raises(RunDirError, match=r"optim.lr: run has 0.5, asked 1.0") as info:
        resume_config(run, ["optim.lr=1.0"])
    assert "run.steps" in str(info.value)  # the message lists what may change


def test_resume_refuses_a_different_config_file_naming_each_differing_key(tmp_path: Path) -> None:
    run = _run_with_config(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text("run: {steps: 3, seed: 7}\noptim: {lr: 0.5}\nrollout: {n: 8}\n")
    with pytest.raises(RunDirError) as info:
        resume_config(run, [], other)
    assert "run.seed: run has 0, asked 7" in str(info.value) and "rollout.n: run has 4, asked 8" in str(info.value)


def test_resume_refuses_fewer_steps_than_the_checkpoint_holds(tmp_path: Path) -> None:
    class Saves:
        def save_pretrained(self, path: Path) -> None:
            Path(path).mkdir(parents=True, exist_ok=True)

    run = _run_with_config(tmp_path)
    layer = torch.nn.Linear(1, 1)
    save_checkpoint(run, 3, model=Saves(), tokenizer=Saves(), optimizer=torch.optim.SGD(layer.parameters(), lr=1))
    with pytest.raises(RunDirError, match="checkpointed at step 3 but run.steps=2"):
        check_resume_config(run, load_config(run / "config.yaml", ["run.steps=2"]))


def test_resume_without_a_saved_config_needs_one(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="nothing to resume"):
        resume_config(tmp_path, [])


def _earlier_run(tmp_path: Path) -> Path:
    """A run dir holding an earlier run (its manifest and `latest`) and a user's notes.txt."""
    from pvpo.owned import claim
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "run"
    claim(run, RUN_KIND)
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_000001")
    (run / "notes.txt").write_text("mine")
    return run


def test_a_fresh_run_refuses_a_run_dir_holding_a_run_and_overwrite_moves_only_the_run_aside_until_a_checkpoint(
    tmp_path: Path,
) -> None:
    run = _earlier_run(tmp_path)
    with pytest.raises(RunDirError, match="--resume .* --overwrite"), fresh_run_dir(run):
        pass
    assert (run / "notes.txt").read_text() == "mine"
    # the new run fails before its first checkpoint: the old one comes back as it was
    with pytest.raises(ValueError, match="bad data"), fresh_run_dir(run, overwrite=True):
        assert (run / "notes.txt").read_text() == "mine" and (run / ASIDE / "checkpoints").is_dir()
        (run / "config.yaml").write_text("new")
        raise ValueError("bad data")
    assert sorted(p.name for p in run.iterdir()) == [RECORD, "checkpoints", "notes.txt"]
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    # it reaches a checkpoint: the old run is dropped then, not before; the user's file stays
    with fresh_run_dir(run, overwrite=True) as replacement:
        assert (run / ASIDE).is_dir()
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest").write_text("step_000002")
        replacement.commit()  # what save_checkpoint does
        assert not (run / ASIDE).exists()
    assert (run / "notes.txt").read_text() == "mine" and (run / "checkpoints" / "latest").read_text() == "step_000002"
    with fresh_run_dir(tmp_path / "absent"):  # nothing there: nothing to refuse
        pass


def test_a_fresh_run_refuses_a_folder_of_a_users_files_and_with_overwrite_trains_beside_them(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("chapter 1")
    with pytest.raises(RunDirError, match="thesis.txt.*--overwrite"), fresh_run_dir(mine):
        pass
    with fresh_run_dir(mine, overwrite=True):
        (mine / "config.yaml").write_text("new")
    assert (mine / "thesis.txt").read_text() == "chapter 1"
    # a user's file bearing a name a run writes is refused even with --overwrite
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index").mkdir()
    with (
        pytest.raises(RunDirError, match="index, which pvpo did not write"),
        fresh_run_dir(tmp_path / "other", overwrite=True),
    ):
        pass


def test_overwrite_refuses_a_run_dir_holding_an_input_of_the_new_run(tmp_path: Path) -> None:
    run = _earlier_run(tmp_path)
    (run / "index").mkdir()
    (run / "index" / "meta.json").write_text("{}")
    with (
        pytest.raises(RunDirError, match="meta.json is inside"),
        fresh_run_dir(run, overwrite=True, inputs=[run / "index" / "meta.json"]),
    ):
        pass
    assert (run / "index" / "meta.json").exists() and not (run / ASIDE).exists()


def test_save_checkpoint_drops_the_run_overwrite_moved_aside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ASIDE).mkdir(parents=True)
    model = torch.nn.Linear(2, 2)

    class _Saves:
        def save_pretrained(self, path: Path) -> None:
            Path(path).mkdir(parents=True, exist_ok=True)

    save_checkpoint(run, 1, model=_Saves(), tokenizer=_Saves(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert not (run / ASIDE).exists() and (run / "checkpoints" / "latest").read_text() == "step_000001"


def test_cli_refuses_a_conflicting_resume_and_an_occupied_run_dir_with_exit_2(tmp_path: Path) -> None:
    from pvpo.cli import app

    run = _run_with_config(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text("optim: {lr: 0.1}\n")
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--resume", "--config", str(other)])
    assert res.exit_code == 2 and "optim.lr" in res.output, res.output
    assert "lr: 0.5" in (run / "config.yaml").read_text()  # the run's config is left as it was
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--config", str(other)])
    assert res.exit_code == 2 and "--overwrite" in res.output, res.output
    res = runner.invoke(app, ["train", "--run-dir", str(run), "--resume", "--overwrite"])
    assert res.exit_code == 2 and "contradict" in res.output


def test_a_finished_run_resumes_with_its_own_config_for_more_steps(tmp_path: Path) -> None:
    from pvpo.trainer.loop import train

    searcher = OverlapSearcher(WORLD.passages)
    run = tmp_path / "run"
    train(load_config(None, TINY + ["run.steps=1", "optim.lr=0.003"]), run, searcher=searcher, show_progress=False)
    with pytest.raises(RunDirError):
        train(load_config(None, TINY + ["run.steps=2"]), run, searcher=searcher, show_progress=False)
    cfg = resume_config(run, ["run.steps=2"])
    assert cfg.optim.lr == 0.003
    result = train(cfg, run, resume=True, searcher=searcher, show_progress=False)
    assert [m["step"] for m in result.metrics] == [1, 2]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "steps: 2" in (run / "config.yaml").read_text()


def _user_run(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    from pvpo.owned import claim
    from pvpo.trainer.state.run_dir import RUN_KIND

    run = tmp_path / "run"
    claim(run, RUN_KIND)
    (run / "checkpoints").mkdir(parents=True)
    files = {"notes.txt": "my notes", "metrics.jsonl": '{"step": 1}\n', "checkpoints/latest": "step_000001"}
    for name, text in files.items():
        (run / name).write_text(text)
    return run, files


def test_cli_overwrite_with_a_bad_data_source_keeps_every_file_of_the_run(tmp_path: Path) -> None:
    """`pvpo train --overwrite` with a bad `data.source` refuses the value before it touches the run
    folder."""
    from pvpo.cli import app

    run, files = _user_run(tmp_path)
    res = CliRunner().invoke(
        app, ["train", "--run-dir", str(run), "--overwrite", *TINY, f"data.source={tmp_path / 'missing.jsonl'}"]
    )
    assert res.exit_code == 2 and "missing.jsonl" in res.output and "Traceback" not in res.output, res.output
    assert {n: (run / n).read_text() for n in files} == files
    assert not replaced_path(run).exists()


def test_overwrite_replaces_the_run_once_the_new_one_has_a_checkpoint_and_no_file_holds_the_token(
    tmp_path: Path,
) -> None:
    from pvpo.trainer.loop import train

    run, _ = _user_run(tmp_path)
    cfg = load_config(None, TINY + ["run.steps=1", "retriever.token=s3cret-run-token"])
    train(cfg, run, overwrite=True, searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert (run / "notes.txt").read_text() == "my notes" and not (run / ASIDE).exists()
    assert (run / "checkpoints" / "latest").read_text() == "step_000001" and (run / "config.yaml").exists()
    written = [p for p in run.rglob("*") if p.is_file()]
    assert len(written) > 5 and not [p for p in written if b"s3cret-run-token" in p.read_bytes()]


def test_the_written_config_says_a_token_was_set_but_not_its_value(tmp_path: Path) -> None:
    cfg = load_config(None, ["retriever.token=s3cret-value"])
    dump_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "s3cret-value" not in text and "retriever.token was set" in text
    assert load_config(tmp_path / "config.yaml").retriever.token is None


@pytest.mark.parametrize("url", ["http://admin:PASSWORD99@h:1", ["http://h:2", "https://TOKEN77@h:3"]])
def test_the_written_config_masks_a_retriever_urls_credentials_and_a_resume_without_them_says_so(
    tmp_path: Path, url: str | list[str]
) -> None:
    from pvpo.trainer.data import retriever_session

    cfg = load_config(None)
    dump_config(
        cfg.model_copy(update={"retriever": cfg.retriever.model_copy(update={"url": url})}), tmp_path / "config.yaml"
    )
    text = (tmp_path / "config.yaml").read_text()
    assert "PASSWORD99" not in text and "TOKEN77" not in text and "retriever.url held credentials" in text
    written = load_config(tmp_path / "config.yaml")
    assert "***@h" in str(written.retriever.url) and "h:" in str(written.retriever.url)  # still says where
    with pytest.raises(ValueError, match=r"retriever.url: its credentials are not in the run's config.yaml"):
        with retriever_session(written, tmp_path, None):
            pass
    # given again on --resume (a key a resume may change), the URL is used as given
    again = load_config(tmp_path / "config.yaml", [f"retriever.url={url}"])
    assert again.retriever.url == url


def test_a_url_without_credentials_is_written_as_it_is_without_a_comment(tmp_path: Path) -> None:
    dump_config(load_config(None, ["retriever.url=http://127.0.0.1:8000"]), tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "http://127.0.0.1:8000" in text and "held credentials" not in text


def test_resume_of_a_run_without_a_checkpoint_says_it_starts_at_step_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run_with_config(tmp_path)
    with caplog.at_level("WARNING"):
        check_resume_config(run, load_config(run / "config.yaml"))
    assert "has no checkpoint yet: --resume starts it from step 0" in caplog.text
