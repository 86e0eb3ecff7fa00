"""A user mistake prints its cause and fix in a line or two (the traceback only
under `pvpo --debug`); progress is a bar on a terminal and periodic lines elsewhere."""

from __future__ import annotations

import errno
import io
import os
import socket

from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.progress import Progress


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_prints_the_cause_and_the_fix_not_a_traceback() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    res = CliRunner().invoke(app, ["retriever", "query", "who", "--url", url, "--retries", "0"])
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    assert f"error: retriever unreachable (last tried {url})" in res.output
    assert "pvpo retriever serve --index DIR" in res.output  # the fix


def test_debug_keeps_the_traceback() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    res = CliRunner().invoke(app, ["--debug", "retriever", "query", "who", "--url", url, "--retries", "0"])
    assert res.exit_code == 1
    assert type(res.exception).__name__ == "RetrieverError"


def test_missing_file_names_the_path(tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    res = CliRunner().invoke(app, ["demo", "--config", str(missing), "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "Traceback" not in res.output and str(missing) in res.output


def test_progress_off_a_terminal_writes_lines_not_bar_frames() -> None:
    out = io.StringIO()  # not a TTY
    bar = Progress(range(5), desc="work", unit="step", stream=out, every_s=0)
    for _ in bar:
        bar.set_postfix(loss="0.5")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("work: 0/5 step (0%)")
    assert lines[-1].startswith("work: done 5/5 step (100%)") and lines[-1].endswith("loss=0.5")


def test_progress_lines_are_periodic_and_disabled_progress_is_silent() -> None:
    out = io.StringIO()
    with Progress(total=1000, desc="w", stream=out, every_s=3600) as bar:
        for _ in range(1000):
            bar.update(1)
    assert len(out.getvalue().splitlines()) == 2  # start and end only, within the period
    quiet = io.StringIO()
    with Progress(total=3, desc="w", stream=quiet, every_s=0, enabled=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_a_brief_phase_writes_a_line_only_while_it_outlasts_the_period() -> None:
    short = io.StringIO()
    with Progress(total=10, desc="step 1/4: rollouts", unit="rollout", stream=short, every_s=3600, brief=True) as bar:
        bar.update(10)
    assert short.getvalue() == ""  # shorter than the period: no start line, no end line
    long = io.StringIO()
    with Progress(total=4, desc="step 1/4: update", unit="micro-batch", stream=long, every_s=0, brief=True) as bar:
        bar.update(1)
        bar.update(3)
    lines = long.getvalue().splitlines()
    assert lines[0].startswith("step 1/4: update: 1/4 micro-batch (25%)")
    assert lines[-1].startswith("step 1/4: update: done 4/4 micro-batch (100%)")


def test_progress_on_a_terminal_is_a_tqdm_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with Progress(total=3, desc="w", stream=out) as bar:
        bar.update(3)
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


def test_hugging_face_bars_are_turned_off_only_off_a_terminal(monkeypatch) -> None:
    from pvpo.progress import quiet_library_bars

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    quiet_library_bars(Tty())
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    quiet_library_bars(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's own setting wins
    quiet_library_bars(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_describe_names_the_file_the_cause_and_what_to_do_for_each_fault_of_the_file_system() -> None:
    from pvpo.user_errors import add_note, describe

    for code, cause in [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
    ]:
        err = OSError(code, os.strerror(code), "/runs/x/checkpoints/step_000002")
        add_note(err, "continue it with `pvpo train --run-dir /runs/x --resume`")
        lines = (describe(err) or "").splitlines()
        assert lines[0] == f"error: /runs/x/checkpoints/step_000002: {cause}", lines
        assert len(lines) == 2 and lines[1].startswith("  fix: ") and lines[1].endswith("--resume`"), lines
