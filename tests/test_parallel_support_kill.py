"""The torchrun tests' kill reaches every rank: torchrun starts each worker in a session of its own,
which a kill of the launcher's process group misses (the ranks then ran on, writing checkpoints
into the run a test was about to resume)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from parallel_support import descendants, kill_tree

# a launcher that starts a "rank" in a new session, as torchrun does, and waits
LAUNCHER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "time.sleep(600)\n"
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be read


def test_kill_tree_ends_a_worker_started_in_a_session_of_its_own() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], start_new_session=True)
    deadline = time.monotonic() + 60
    while not (below := descendants(proc.pid)):
        assert time.monotonic() < deadline, "the launcher never started its worker"
        time.sleep(0.05)
    kill_tree(proc)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in below):
        assert time.monotonic() < deadline, f"still running after kill_tree: {below}"
        time.sleep(0.05)
    assert proc.returncode is not None
