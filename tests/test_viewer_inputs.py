"""`pvpo view` on what it should not trust: files without ids or with bad values, damaged lines, a
YAML alias bomb, a response of megabytes, a Host header naming another site, a busy port. Each
ends in a page (the bad episode marked) or one line naming the file, never a traceback, a hang or
a silent mispairing."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.viewer.page import build_page, page_data, save_page
from pvpo.viewer.serve import PageServer, local_host
from pvpo.viewer.sources import ViewError, read_source

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def _item(question: str, answer: str, gold: str, ident: str | None = None, **output: object) -> dict:
    right = float(answer == gold)
    item: dict = {
        "question": question,
        "golden_answers": [gold],
        "output": {
            "final_response": f"<answer> {answer} </answer>",
            "pred": answer,
            "metric_score": {"em": right, "f1": right, "acc": right},
            **output,
        },
    }
    if ident is not None:
        item["id"] = ident
    return item


def _folder(path: Path, items: list[dict], dataset: str = "toy") -> Path:
    (path / dataset).mkdir(parents=True)
    (path / dataset / "predictions.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    return path


# ---- pairing two evaluations ------------------------------------------------------------------------
def test_two_evaluations_without_ids_pair_by_question_text(tmp_path: Path) -> None:
    a = _folder(
        tmp_path / "a", [_item("Capital of France?", "Paris", "Paris"), _item("Capital of Peru?", "Quito", "Lima")]
    )
    b = _folder(
        tmp_path / "b", [_item("capital of peru?", "Lima", "Lima"), _item("Capital of France?", "Lyon", "Paris")]
    )
    data = page_data([read_source(a), read_source(b)])
    assert data["paired_by"] == "question text"
    a_eps, b_eps = data["episodes"]
    paired = [(a_eps[i]["q"], b_eps[j]["q"], flip) for i, j, flip in data["pairs"]]
    assert paired == [
        ("Capital of France?", "Capital of France?", "lost"),
        ("Capital of Peru?", "capital of peru?", "gained"),
    ]


def test_two_evaluations_without_ids_of_different_questions_are_refused_not_paired(tmp_path: Path) -> None:
    a = _folder(
        tmp_path / "a", [_item("Capital of France?", "Paris", "Paris"), _item("Capital of Peru?", "Lima", "Lima")]
    )
    b = _folder(
        tmp_path / "b", [_item("Who wrote Emma?", "Austen", "Austen"), _item("Who wrote Ulysses?", "x", "Joyce")]
    )
    with pytest.raises(ViewError, match="share no question"):
        page_data([read_source(a), read_source(b)])


def test_evaluations_whose_questions_repeat_without_ids_are_refused_naming_why(tmp_path: Path) -> None:
    twice = [_item("Capital?", "Paris", "Paris"), _item("Capital?", "Lima", "Lima")]
    a, b = _folder(tmp_path / "a", twice), _folder(tmp_path / "b", twice)
    res = runner.invoke(app, ["view", str(a), str(b), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 2 and "cannot be paired" in res.output and "some episodes record no id" in res.output
    assert "question texts repeat on side A" in res.output.splitlines()[0] and "Traceback" not in res.output


def test_ids_that_name_other_questions_on_each_side_pair_by_text(tmp_path: Path) -> None:
    a = _folder(tmp_path / "a", [_item("Q one?", "x", "x", "0"), _item("Q two?", "y", "x", "1")])
    b = _folder(tmp_path / "b", [_item("Q two?", "x", "x", "0"), _item("Q one?", "y", "x", "1")])
    data = page_data([read_source(a), read_source(b)])
    a_eps, b_eps = data["episodes"]
    assert data["paired_by"] == "question text"
    assert [(a_eps[i]["q"], b_eps[j]["q"]) for i, j, _ in data["pairs"]] == [("Q one?", "Q one?"), ("Q two?", "Q two?")]


def test_episodes_without_ids_get_keys_of_their_own(tmp_path: Path) -> None:
    src = read_source(
        _folder(tmp_path / "a", [_item("One?", "x", "x"), _item("Two?", "x", "x", "7"), _item("3?", "x", "x", "7")])
    )
    assert [e["k"] for e in src.episodes] == ["toy/#1", "toy/7", "toy/#3"]


# ---- bad values and damaged lines ---------------------------------------------------------------------
def _run_dir(path: Path, episodes: list[dict], config: str = "env:\n  protocol: search_r1\n") -> Path:
    path.mkdir()
    (path / "config.yaml").write_text(config)
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    rows = [
        {"uid": e["uid"], "reward": e["reward"], "advantage": e["advantage"], "is_gt": False, "em": 1.0}
        for e in episodes
    ]
    line = json.dumps({"step": 1, "rows": rows, "episodes": episodes}, allow_nan=True)
    (path / "episodes.jsonl").write_text(line + "\n")
    return path


def _run_episode(uid: str, advantage: float, response: str = "<answer> x </answer>") -> dict:
    return {
        "uid": uid,
        "question": f"{uid}?",
        "golden_answers": ["x"],
        "response": response,
        "prediction": "x",
        "reward": 1.0,
        "advantage": advantage,
        "em": 1.0,
        "f1": 1.0,
        "cem": 1.0,
        "format_ok": True,
    }


def _shipped(page: str) -> dict:
    """The data block of a page, as its script parses it."""
    block = re.search(r'<script type="application/json" id="pvpo-data">(.*?)</script>', page, re.S)
    assert block is not None
    return dict(json.loads(block.group(1)))


def test_a_nan_advantage_marks_its_episode_and_the_page_still_renders(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_run_episode("toy/q1", 0.5), _run_episode("toy/q2", float("nan"))])
    page = build_page([run])
    data = _shipped(page)
    good, bad = data["episodes"][0]
    assert "bad" not in good and bad["adv"] is None and bad["bad"] == ["advantage is nan (shown as –)"]
    assert data["warnings"] == ["run.steps.rows is nan (shown as –)"]  # the step's row of it
    assert "NaN" not in page.split('id="pvpo-data">', 1)[1].split("</script>", 1)[0]


def test_a_lone_surrogate_in_one_response_or_a_label_marks_only_that(tmp_path: Path) -> None:
    items = [_item("Fine?", "x", "x", "1"), _item("Odd?", "x", "x", "2", final_response="<answer> \ud800 x </answer>")]
    folder = tmp_path / "e"
    (folder / "toy").mkdir(parents=True)
    (folder / "toy" / "predictions.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    (folder / "toy" / "run.json").write_text(json.dumps({"label": "run \udc80"}))
    out = save_page(build_page([folder]), tmp_path / "page.html")
    data = _shipped(out.read_text(encoding="utf-8"))
    fine, odd = data["episodes"][0]
    assert "bad" not in fine and odd["bad"] == ["response holds a lone surrogate (shown as \ufffd)"]
    assert "\ufffd x" in odd["turns"][0]["x"] and data["sources"][0]["label"] == "run \ufffd"
    assert data["warnings"] == ["sources.label holds a lone surrogate (shown as \ufffd)"]
    assert "<title>pvpo view: evaluation of run \ufffd</title>" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        (
            "predictions",
            '{"id": "1", "question": "Q?", "output": "oops"}\n',
            "predictions.jsonl: line 1: `output` is a JSON str",
        ),
        (
            "predictions",
            '{"id": "1", "question": "Q?"}\n[1, 2]\n',
            "predictions.jsonl: line 2: expected a JSON object, got list",
        ),
        (
            "predictions",
            '\n{"id": "1", "output": {"metric_score": {"em": "yes"}}}\n',
            "line 2: `output.metric_score.em` is 'yes'",
        ),
        ("metrics", "5\n", "metrics.jsonl:1: expected a JSON object, got int"),
        (
            "episodes",
            '{"step": 1, "rows": [], "episodes": []}\n5\n',
            "episodes.jsonl:2: expected a JSON object, got int",
        ),
        ("episodes", '{"step": "two", "rows": []}\n', "episodes.jsonl:1: `step` is 'two'"),
        (
            "episodes",
            '{"step": 1, "episodes": [{"uid": "a", "advantage": "big"}]}\n',
            "the line of step 1: `advantage` is 'big'",
        ),
    ],
)
def test_a_damaged_line_is_one_line_naming_the_file_and_line(
    file: str, text: str, message: str, tmp_path: Path
) -> None:
    if file == "predictions":
        (tmp_path / "e" / "toy").mkdir(parents=True)
        (tmp_path / "e" / "toy" / "predictions.jsonl").write_text(text)
        target = tmp_path / "e"
    else:
        target = _run_dir(tmp_path / "run", [])
        (target / f"{file}.jsonl").write_text(text)
    res = runner.invoke(app, ["view", str(target), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert res.output.startswith("error: ") and message in res.output.splitlines()[0] and "Traceback" not in res.output


def _builds_within(seconds: float, path: Path) -> None:
    """`build_page([path])` in a child process that must finish in `seconds` (a hang in C code,
    such as expanding an alias bomb, cannot be interrupted in-process)."""
    code = "import sys; from pvpo.viewer.page import build_page; build_page([sys.argv[1]])"
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        timeout=seconds,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_yaml_alias_bomb_in_a_runs_config_is_not_expanded(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = "\n".join(levels) + "\nenv:\n  protocol: *a8\n"
    run = _run_dir(tmp_path / "run", [_run_episode("toy/q1", 0.5)], config=bomb)
    _builds_within(30, run)


def test_a_response_of_megabytes_repeating_one_search_renders_in_seconds(tmp_path: Path) -> None:
    looping = "<think> search again </think>\n<search> the same query </search>\n" * 103_000  # 6.6 MB
    looping += "\n\n<information>Doc 1(Title: x) x</information>\n\n<answer> x </answer>"
    _folder(tmp_path / "e", [_item("Q?", "x", "x", "1", final_response=looping)])
    _builds_within(20, tmp_path / "e")


# ---- the page file and the server -------------------------------------------------------------------------
def test_a_label_holding_the_pages_marks_stays_text_in_the_title(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "e", [_item("Q?", "x", "x", "1")])
    (folder / "toy" / "run.json").write_text(json.dumps({"label": "/*PVPO_DATA*/ PVPO_TITLE </title>"}))
    page = build_page([folder])
    assert "<title>pvpo view: evaluation of /*PVPO_DATA*/ PVPO_TITLE &lt;/title&gt;</title>" in page
    assert page.count('id="pvpo-data"') == 1


def test_the_page_is_written_with_the_mode_the_umask_gives(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = save_page("<html></html>", tmp_path / "page.html")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8765", True),
        ("localhost", True),
        ("LOCALHOST:9000", True),
        ("[::1]:80", True),
        ("evil.example", False),
        ("evil.example:8765", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.", False),
    ],
)
def test_serve_answers_only_requests_for_loopback_names(host: str, ok: bool, tmp_path: Path) -> None:
    assert local_host(host) is ok
    server = PageServer("<html>page</html>").start()
    try:
        got = httpx.get(server.url, headers={"Host": host}, timeout=10)
        assert got.status_code == (200 if ok else 403) and (("page" in got.text) is ok)
    finally:
        server.close()


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "e", [_item("Q?", "x", "x", "1")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = runner.invoke(app, ["view", str(folder), "--serve", "--port", str(port)])
    assert res.exit_code == 2 and f"--port {port}: another program listens" in res.output, res.output
    assert res.output.startswith("error: ") and "Traceback" not in res.output


@pytest.mark.parametrize(
    "record",
    [
        "[1, 2]",
        '{"questions": ["a"], "em": {"before": [1.0], "after": []}}',
        '{"questions": ["a"], "em": {"before": ["x"], "after": [1]}}',
    ],
)
def test_a_held_out_record_not_in_its_layout_leaves_the_rest_of_the_run_page(record: str, tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_run_episode("toy/q1", 0.5)])
    (run / "held_out_em.json").write_text(record)
    data = page_data([read_source(run)])
    assert data["run"]["heldout"] == [] and len(data["episodes"][0]) == 1


def _word_tokenizer(path: Path) -> None:
    """A tokenizer.json splitting on whitespace and punctuation (each word a token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True)
    tokenizer.save(str(path / "tokenizer.json"))


def test_a_runs_episodes_carry_their_turns_tokens_by_the_runs_own_tokenizer(tmp_path: Path) -> None:
    response = (
        "<search> capital </search>\n\n<information>Doc 1(Title: Berlin) Berlin.</information>\n\n<answer> x </answer>"
    )
    run = _run_dir(tmp_path / "run", [_run_episode("toy/q1", 0.5, response=response)])
    plain = page_data([read_source(run)])["episodes"][0][0]
    assert all("tn" not in t for t in plain["turns"])  # no initial_policy: no tokens
    _word_tokenizer(run / "initial_policy")
    [e] = page_data([read_source(run)])["episodes"][0]
    model = [t for t in e["turns"] if t["t"] == "m"]
    assert [(t["x"], t["tn"]) for t in model] == [("<search> capital </search>", 7), ("<answer> x </answer>", 7)]
    assert model[0]["tl"] == [1, 6, 1, 8, 3, 6, 1]  # to the ends of "<", "search", ">", "capital", "</", ...
    [obs] = [t for t in e["turns"] if t["t"] == "o"]
    assert obs["tn"] == 14  # the env's block as appended, wrapper tags and blank lines included


def test_a_flashrag_files_bad_item_is_one_line_naming_the_file_and_item(tmp_path: Path) -> None:
    path = tmp_path / "intermediate_data.json"
    path.write_text(json.dumps([{"id": "1", "question": "Q?"}, {"id": "2", "output": {"passages": "none"}}]))
    res = runner.invoke(app, ["view", str(path), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"{path}: item 2: `output.passages` is not a list of lists of passages" in res.output.splitlines()[0]
