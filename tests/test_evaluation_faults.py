"""`pvpo eval` under faults: two processes into one folder, a predictions file with repeated or
damaged rows, SIGTERM, and model folders that cannot load. No question ever counts twice, and each
fault ends in one line naming the cause (the file, the holder's PID) and what to do."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.envs.data import QAExample
from pvpo.evaluation.run import EvalSettings, Outcome, run_eval
from pvpo.locks import FolderInUse
from tests.conftest import REPO
from tests.test_locks import hold_in_another_process

runner = CliRunner()
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
N = 6


class AnsweringPolicy:
    """An EvalPolicy answering "a" to every question, one at a time; `after_each(k)` runs after the
    k-th answer is saved (to stop the run there)."""

    def __init__(self, after_each: Callable[[int], None] | None = None) -> None:
        self.after_each, self.answered = after_each, 0

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Any,
        episode: Any,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        out = []
        for i, _ in enumerate(examples):
            o = Outcome("prompt", "<answer> a </answer>", "a", 0, 1, 3, 4, "answer", format_ok=True)
            out.append(o)
            if on_done is not None:
                on_done(i, o)
            self.answered += 1
            if self.after_each is not None:
                self.after_each(self.answered)
        return out


def questions(n: int = N) -> list[QAExample]:
    return [QAExample(f"qa/{i}", f"question {i}?", ("a",) if i % 2 else ("b",)) for i in range(n)]


def evaluate(out: Path, policy: Any = None) -> dict[str, Any]:
    meta = {"dataset": "qa", "model": "m"}
    return run_eval(policy or AnsweringPolicy(), questions(), None, EvalSettings(), out, meta=meta, show_progress=False)


def predictions(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]


def test_a_second_eval_into_a_folder_another_process_writes_is_refused_naming_its_pid(tmp_path: Path) -> None:
    out = tmp_path / "out" / "qa"
    holder = hold_in_another_process(out)
    try:
        with pytest.raises(FolderInUse, match=f"PID {holder.pid}, pvpo test"):
            evaluate(out)
        assert not out.exists()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert evaluate(out)["n"] == N


TWO_EVALS = """
import os, sys, time
sys.path.insert(0, "tests")
from test_evaluation_faults import AnsweringPolicy, evaluate
from pathlib import Path
from pvpo.locks import FolderInUse
ready = Path(sys.argv[2])
(ready / str(os.getpid())).touch()
while len(list(ready.iterdir())) < 2:  # both start answering at once
    time.sleep(0.01)
try:
    print(evaluate(Path(sys.argv[1]), AnsweringPolicy(lambda k: time.sleep(0.2)))["n"])
except FolderInUse as e:
    print("refused:", e)
"""


def test_two_concurrent_evals_into_one_folder_answer_each_question_once(tmp_path: Path) -> None:
    out, ready = tmp_path / "out" / "qa", tmp_path / "ready"
    ready.mkdir()
    args = [sys.executable, "-c", TWO_EVALS, str(out), str(ready)]
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert said[0] == str(N) and said[1].startswith("refused:") and "in use by another pvpo process" in said[1], said
    assert json.loads((out / "metrics.json").read_text())["n"] == N
    assert [p["id"] for p in predictions(out)] == [str(i) for i in range(N)]


def test_repeated_answers_in_predictions_count_once_and_the_file_is_rewritten_without_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "qa"
    evaluate(out)
    rows = (out / "predictions.jsonl").read_text().splitlines()
    (out / "predictions.jsonl").write_text("\n".join(rows + rows) + "\n")  # what two writers appending left
    with caplog.at_level(logging.WARNING):
        metrics = evaluate(out)
    assert metrics["n"] == N and json.loads((out / "metrics.json").read_text())["n"] == N
    assert len(predictions(out)) == N and f"and {N} answer(s) repeating an id" in caplog.text


def test_damaged_and_torn_prediction_lines_are_dropped_with_a_warning_and_their_questions_answered_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "qa"
    evaluate(out)
    rows = (out / "predictions.jsonl").read_text().splitlines()
    damaged = [rows[0], '{"id": "1", "quest', rows[2], "[1, 2]", rows[3], rows[4][:40]]
    (out / "predictions.jsonl").write_bytes(("\n".join(damaged)).encode())  # the last line torn: no newline
    policy = AnsweringPolicy()
    with caplog.at_level(logging.WARNING):
        metrics = evaluate(out, policy)
    assert "dropped 3 damaged or torn line(s)" in caplog.text, caplog.text
    assert policy.answered == 3 and metrics["n"] == N  # questions 1, 4 and 5 again
    assert [p["id"] for p in predictions(out)] == [str(i) for i in range(N)]


def _eval_cli(model: Path, data: Path, out: Path) -> Any:
    args = ["eval", "--model", str(model), "--dataset", str(data), "--out", str(out)]
    return runner.invoke(app, [*args, "--retriever-url", "http://127.0.0.1:9", "--quiet"], env=ENV)


def _dataset(tmp_path: Path) -> Path:
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"id": str(i), "question": f"q{i}?", "golden_answers": ["a"]}) + "\n" for i in range(5))
    )
    return data


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_eval_says_how_far_it_got_and_the_same_command_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    import pvpo.evaluation.policies as policies

    def stop_after_two(k: int) -> None:
        if k == 2:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(policies, "token_policy", lambda *a, **kw: AnsweringPolicy(stop_after_two))
    data, out = _dataset(tmp_path), tmp_path / "out"
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(RuntimeError("SIGTERM unhandled")))
    try:
        res = _eval_cli(tmp_path / "model", data, out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert res.exit_code == 128 + signum and "Traceback" not in res.output, (res.output, res.exception)
    assert res.output.splitlines()[-1] == (
        f"stopped by {signum.name}: 2 of 5 answers are saved in {out / 'qa' / 'predictions.jsonl'}: "
        "run the same command again to answer the rest"
    )
    monkeypatch.setattr(policies, "token_policy", lambda *a, **kw: AnsweringPolicy())
    res = _eval_cli(tmp_path / "model", data, out)
    assert res.exit_code == 0 and "N=5" in res.output, res.output


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pvpo.trainer.config.policy import TinyModelConfig
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy

    cfg = TinyModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32, vocab_size=300
    )
    policy = build_tiny_policy(["who is a? a is b."] * 20, cfg, tags=["search", "answer"])
    path = tmp_path_factory.mktemp("model") / "policy"
    save_policy(policy, path)
    return path


def _broken_model(model_dir: Path, tmp_path: Path, how: str) -> Path:
    broken = tmp_path / how
    if how == "empty":
        broken.mkdir()
        return broken
    import shutil

    shutil.copytree(model_dir, broken)
    if how == "no_tokenizer":
        for p in broken.glob("tokenizer*"):
            p.unlink()
    elif how == "no_weights":
        (broken / "model.safetensors").unlink()
    elif how == "truncated_weights":
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return broken


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("empty", "is empty: give a Hugging Face model folder"),
        ("no_tokenizer", "has no tokenizer (none of tokenizer.json"),
        ("no_weights", "has no weights (none of model.safetensors"),
        ("truncated_weights", "model.safetensors is damaged (SafetensorError"),
    ],
)
def test_a_model_folder_that_cannot_load_is_one_line_naming_what_it_lacks(
    model_dir: Path, tmp_path: Path, how: str, expected: str
) -> None:
    broken = _broken_model(model_dir, tmp_path, how)
    res = _eval_cli(broken, _dataset(tmp_path), tmp_path / "out")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert expected in res.output and str(broken) in res.output, res.output
    assert "empty prompt" not in res.output and "sentencepiece" not in res.output


# ---- a user's files and the names of results folders -------------------------------------------------
def test_overwrite_of_a_dataset_folder_holding_a_users_file_keeps_the_file(tmp_path: Path) -> None:
    """`pvpo eval --overwrite` promised "those files are kept" and deleted a thesis.txt in OUT/<dataset>/."""
    from pvpo.evaluation.run import EvalError

    out = tmp_path / "qa"
    out.mkdir()
    (out / "thesis.txt").write_text("chapter 1")
    with pytest.raises(EvalError, match="thesis.txt.*--overwrite"):
        evaluate(out)
    meta = {"dataset": "qa", "model": "m"}
    m = run_eval(
        AnsweringPolicy(), questions(), None, EvalSettings(), out, meta=meta, show_progress=False, overwrite=True
    )
    assert m["n"] == N and (out / "thesis.txt").read_text() == "chapter 1"
    # and again over that run, with other settings: the earlier answers are replaced, the thesis stays
    m = run_eval(
        AnsweringPolicy(), questions(), None, EvalSettings(), out, meta={**meta, "model": "m2"}, show_progress=False,
        overwrite=True,
    )  # fmt: skip
    assert m["model"] == "m2" and (out / "thesis.txt").read_text() == "chapter 1"


def _qa(path: Path, question: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": "1", "question": question, "golden_answers": ["a"]}) + "\n")
    return path


def test_datasets_in_files_of_one_name_are_named_by_their_folders_as_the_env_names_them(tmp_path: Path) -> None:
    from pvpo.envs.datasets import name_datasets, resolve_dataset
    from pvpo.envs.loaders import load_dataset

    a = _qa(tmp_path / "hotpotqa_mini" / "questions.json", "qa?")
    b = _qa(tmp_path / "musique_mini" / "questions.json", "qb?")
    named = name_datasets([resolve_dataset(str(a)), resolve_dataset(str(b))])
    assert [d.name for d in named] == ["hotpotqa_mini", "musique_mini"]
    assert [e.uid for e in load_dataset(a)] == ["hotpotqa_mini/1"]  # the env's uids: the same name


def test_two_datasets_of_one_name_are_refused_before_anything_runs_and_named_apart_with_name(tmp_path: Path) -> None:
    x = _qa(tmp_path / "x" / "hp" / "questions.json", "qx?")
    y = _qa(tmp_path / "y" / "hp" / "questions.json", "qy?")
    out = tmp_path / "out"
    args = ["eval", "--model", str(tmp_path / "no-model"), "--dataset", str(x), "--dataset", str(y)]
    args += ["--retriever-url", "http://127.0.0.1:9", "--out", str(out)]
    res = runner.invoke(app, args, env=ENV)
    assert res.exit_code == 2 and "both named 'hp'" in res.output and "--name" in res.output, res.output
    assert not out.exists()
    res = runner.invoke(app, [*args, "--name", "hp_x", "--name", "hp_y"], env=ENV)
    assert "both named" not in res.output and "no-model" in res.output, res.output  # got as far as the model
    res = runner.invoke(app, [*args, "--name", "a/b", "--name", "c"], env=ENV)
    assert res.exit_code == 2 and "'a/b'" in res.output, res.output


def test_a_users_file_where_a_datasets_results_go_is_refused_and_kept(tmp_path: Path) -> None:
    data = _qa(tmp_path / "qa.jsonl", "q?")
    out = tmp_path / "out"
    out.mkdir()
    (out / "qa").write_text("my notes")
    args = ["eval", "--model", str(tmp_path / "no-model"), "--dataset", str(data), "--retriever-url"]
    res = runner.invoke(app, [*args, "http://127.0.0.1:9", "--out", str(out), "--overwrite"], env=ENV)
    assert res.exit_code == 2 and "holds a file 'qa'" in res.output, res.output
    assert (out / "qa").read_text() == "my notes"
