"""bench/quickstart/first_agent.py, without a model: HotpotQA questions written in FlashRAG's layout
for `pvpo data get --from`, the page's block substituted (only the `--from` and the port; refused in
one line where the block lost a text it replaces; `--shorten` = tests/test_first_agent.py's cuts),
each command timed between marks, the process tree's memory summed over its processes and its
leftovers stopped by PID, the results read back from the run's files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_envs_data_get import FIXTURE, flashrag_records
from test_first_agent import shortened

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.quickstart import first_agent as fa  # noqa: E402
from bench.quickstart.tree_memory import TreeSampler, stop_leftovers  # noqa: E402
from pvpo.envs.loaders import load_dataset  # noqa: E402

COPY = Path("/tmp/the-copy")


def test_questions_are_written_in_flashrags_layout_one_line_each_with_their_paragraphs(tmp_path: Path) -> None:
    assert fa.write_flashrag(FIXTURE, tmp_path) == 3
    path = tmp_path / "hotpotqa" / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == flashrag_records()  # as the `pvpo data get` tests write them
    assert set(rows[0]) == {"id", "question", "golden_answers", "metadata"}
    assert set(rows[0]["metadata"]) == {"context", "supporting_facts", "type"}
    assert [len(e.paragraphs) for e in load_dataset(path)] == [3, 3, 3]


def test_a_question_not_in_hotpotqas_format_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "q.json"
    bad.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    with pytest.raises(fa.BlockError, match="question 1 is not HotpotQA's distractor format"):
        fa.write_flashrag(bad, tmp_path / "out")


def test_the_block_gets_only_from_and_the_port_every_other_line_identical() -> None:
    block = fa.first_agent_block()
    out = fa.substituted(block, COPY, 12345)
    assert "8000" not in out and out.count("12345") == block.count("8000") >= 3
    old_lines, new_lines = block.splitlines(), out.splitlines()
    assert len(old_lines) == len(new_lines)
    for old, new in zip(old_lines, new_lines, strict=True):
        if old.startswith("pvpo data get"):
            command, _, comment = old.partition("   #")
            assert new == f"{command} --from {COPY}   #{comment}"
        elif "8000" in old:
            assert new == old.replace("8000", "12345")
        else:
            assert new == old


def test_shorten_applies_the_first_agent_tests_cuts() -> None:
    block = fa.first_agent_block()
    assert fa.substituted(block, COPY, 12345, shorten=True) == shortened(block, COPY, 12345)


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        ("8000", "no longer holds '8000'"),
        ("A=runs/first-agent", "no longer holds 'A=runs/first-agent'"),
        ("pvpo data get", "holds 0 `pvpo data get` lines"),
    ],
)
def test_a_block_that_lost_a_substituted_text_is_refused_in_one_line(cut: str, says: str) -> None:
    block = fa.first_agent_block().replace(cut, "changed")
    with pytest.raises(fa.BlockError, match=says):
        fa.substituted(block, COPY, 12345)


def test_shorten_refuses_a_block_whose_sizes_changed() -> None:
    block = fa.first_agent_block().replace("--limit 100", "--limit 200")
    fa.substituted(block, COPY, 12345)  # the record itself does not cut it
    with pytest.raises(fa.BlockError, match="no longer holds '--limit 100 --out runs/data'"):
        fa.substituted(block, COPY, 12345, shorten=True)


def test_each_command_is_timed_between_marks_its_lines_unchanged(tmp_path: Path) -> None:
    script = "X=1\nsleep 0.3 \\\n    && echo two   # a comment\necho three\n"
    marked = fa.with_marks(script)
    assert script.splitlines() == [line for line in marked.splitlines() if not line.startswith("__mark")]
    marks = tmp_path / "marks"
    env = {"PVPO_BENCH_MARKS": str(marks), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-e", "-c", marked], env=env, check=True, capture_output=True)
    times = fa.read_marks(marks)
    commands = fa.logical_commands(script)
    assert commands == ["X=1", "sleep 0.3 && echo two", "echo three"] and len(times) == 4
    rows = fa.per_command(commands, times, [(times[1] + 0.1, 5 * 2**30)], end=times[-1])
    assert [r["finished"] for r in rows] == [True, True, True]
    assert rows[1]["wall_s"] >= 0.3 > rows[0]["wall_s"] and rows[1]["peak_gib"] == 5.0
    failed = fa.per_command(commands, times[:2], [], end=times[1] + 2.0)  # stopped in the second
    assert failed[1]["wall_s"] == 2.0 and not failed[1]["finished"] and failed[2]["wall_s"] is None


CHILD = (  # the larger one ignores SIGTERM, as a stuck server might
    "import signal, sys, time; b = bytearray(b'\\x01') * (int(sys.argv[1]) << 20); "
    "sys.argv[1] == '160' and signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[2], 'w'); time.sleep(60)"
)
PARENT = """import subprocess, sys, time, os
kids = [subprocess.Popen([sys.executable, '-c', sys.argv[1], m, sys.argv[2] + m]) for m in ('120', '160')]
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
"""


def test_the_tree_peak_sums_every_process_and_orphans_are_stopped_by_pid(tmp_path: Path) -> None:
    go = tmp_path / "go"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(tmp_path / "ready"), str(go)])
    sampler = TreeSampler(parent.pid, 0.05)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{m}").exists() for m in ("120", "160")):
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        kids = psutil.Process(parent.pid).children()
        alone = [k.memory_info().rss for k in kids]
        total = sampler.sample()
        assert total > max(alone) and total >= sum(alone) and sampler.peak_total >= 280 * 2**20
        assert sampler.peak_single >= 160 * 2**20 and "python" in sampler.peak_single_cmd
        go.touch()  # the parent exits, its children live on, reparented
        parent.wait(timeout=30)
        assert {p.pid for p in sampler.alive()} == {k.pid for k in kids}
    finally:
        sampler.stop()
        stopped = stop_leftovers(sampler, grace_s=1.0)
    assert len(stopped) == 2 and not any(k.is_running() and k.status() != "zombie" for k in kids)


def _results(tmp_path: Path) -> Path:
    run = tmp_path / fa.RUN
    (run / "eval" / "held_out").mkdir(parents=True)
    metrics = {"n": 20, "em": 0.05, "f1": 0.1, "acc": 0.15, "em_se": 0.05, "format_ok": 0.9, "searches": 1.4}
    (run / "eval" / "held_out" / "metrics.json").write_text(json.dumps(metrics))
    ws = {"losses": [2.0, 1.5, 1.2], "questions": ["a", "b"], "sft_seconds": 300.5, "dataset_gt": {"written": 2}}
    (run / "warm_start.json").write_text(json.dumps(ws))
    return tmp_path


def test_the_evaluations_metrics_and_the_warm_starts_steps_are_read_and_shown(tmp_path: Path) -> None:
    metrics, warm = fa.read_results(_results(tmp_path))
    assert metrics is not None and metrics["em"] == 0.05 and metrics["searches"] == 1.4
    assert warm == {"steps": 3, "sft_seconds": 300.5, "trajectories": 2, "last_loss": 1.2, "dataset_gt": {"written": 2}}
    rec = {"bars": fa.BARS, "wall_s": 16 * 60, "metrics": metrics, "warm_start": warm, "shortened": False}
    rec |= {"machine_line": "cpu", "load_at_start": [0.1, 0.2, 0.3], "date": "d", "argv": "python x", "page": "p"}
    rec |= {"where": "w", "returncode": 0, "peak_total_gib": 3.5, "peak_single_gib": 2.0, "peak_single_cmd": "python"}
    rec |= {"commands": [{"command": "A=runs/first-agent", "wall_s": 0.0, "peak_gib": 0.01}]}
    text = fa.render(rec)
    assert "| wall time, whole block | 16.00 min | <= 15 min | missed by 1.00 |" in text
    assert "| peak RSS, server + eval + all (sum) | 3.50 GiB | <= 8 GiB | met |" in text
    assert "| EM / F1 / cover-EM (20 held out) | 0.050 / 0.100 / 0.150 | | |" in text
    assert "| searches per answer | 1.40 | | |" in text and "3 SFT steps, 300 s, 2 trajectories" in text


def test_missing_results_read_as_none(tmp_path: Path) -> None:
    (tmp_path / fa.RUN).mkdir(parents=True)
    (tmp_path / fa.RUN / "warm_start.json").write_text("{cut")
    assert fa.read_results(tmp_path) == (None, None)


def test_missing_questions_or_a_taken_out_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert fa.main(["--questions", str(tmp_path / "none.json"), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--questions" in err and "no such file" in err
    (tmp_path / "r.json").write_text("{}")
    assert fa.main(["--questions", str(FIXTURE), "--out", str(tmp_path / "r.json")]) == 2
    assert "exists: a record is one run" in capsys.readouterr().err
