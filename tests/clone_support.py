"""A documented shell block run as written in a fresh clone of the checkout: the clone, the
block's run in a process group of its own (its background server stopped with it), and what the
block left outside `runs/`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_clone(dest: Path) -> Path:
    """A `git clone --shared` of the checkout's committed tree at `dest`."""
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(dest)], check=True)
    return dest


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(pgid: int) -> None:
    """SIGTERM to every process of a group, SIGKILL to what is left of it 15 s later."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def run_block(
    body: str, clone: Path, log: Path, *, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """`bash -e -c body` in `clone` with the venv's `pvpo` on PATH and offline Hugging Face, in a
    process group stopped afterwards; its exit status and output (kept in `log`)."""
    full_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    with log.open("w") as sink:  # a file, not a pipe: a server left running must not hold the output open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", body],
            cwd=clone,
            env=full_env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            stop_group(proc.pid)  # the background server, where the block stopped before its kill
    return proc.returncode, log.read_text()


def outside_runs(clone: Path) -> list[str]:
    """`git status` lines of the clone (ignored and untracked files included) outside `runs/`."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [line for line in status if not line[3:].startswith("runs/")]
