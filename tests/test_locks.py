"""One writer per folder (`pvpo.locks`): a second process is refused naming the holder's PID, a
holder killed with SIGKILL frees the folder at once, and one process may take its own lock again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pvpo.locks import FolderInUse, folder_lock, is_lock_file, lock_path
from tests.conftest import REPO

HOLD = "import sys, time; from pvpo.locks import folder_lock\nwith folder_lock(sys.argv[1], 'pvpo test'):\n    print('held', flush=True)\n    time.sleep(600)\n"


def hold_in_another_process(folder: Path) -> subprocess.Popen:
    """A process holding `folder`'s lock until it is killed (returned once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_holders_pid_until_the_holder_is_killed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = hold_in_another_process(folder)
    try:
        with pytest.raises(FolderInUse, match=rf"in use by another pvpo process \(PID {holder.pid}, pvpo test\)"):
            with folder_lock(folder, "pvpo train"):
                pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    t0 = time.perf_counter()
    with folder_lock(folder, "pvpo train"):  # the kernel dropped the killed holder's lock
        assert lock_path(folder).read_text() == f"PID {os.getpid()}, pvpo train\n"
    assert time.perf_counter() - t0 < 1
    assert lock_path(folder).read_text() == ""  # no stale holder named once it is free


def test_the_lock_sits_beside_the_folder_and_is_re_entrant_in_one_process(tmp_path: Path) -> None:
    folder = tmp_path / "out" / "nq"
    with folder_lock(folder, "pvpo eval"), folder_lock(tmp_path / "out" / ".." / "out" / "nq", "pvpo eval"):
        assert lock_path(folder) == tmp_path / "out" / ".nq.pvpo-lock" and is_lock_file(".nq.pvpo-lock")
        assert not folder.exists()  # nothing is written inside the folder
    with folder_lock(folder, "pvpo eval"):  # released after the outer block
        pass
