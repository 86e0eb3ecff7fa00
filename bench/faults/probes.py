"""What every group of probes of the fault table shares (`bench/faults/run.py` runs them): the `pvpo` CLI run as
a user runs it, the table's row (a probe that could not run is "not run", never a pass), the
checks of a refusal (exit status, a message of one to three lines, no traceback), and `Probes`,
the scratch folder with the smoke run's checkpoints, policy and index and the loopback retriever
that serves that index, which each round's probes use."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
SMOKE = str(REPO / "configs" / "smoke.yaml")


@dataclass
class Outcome:
    rc: int
    out: str
    seconds: float


@dataclass
class Row:
    """One row of the table: the fault, what happened, and whether that is what is due (None: the
    probe could not run here, which counts neither as a pass nor as a failure)."""

    fault: str
    result: str
    ok: bool | None

    @property
    def verdict(self) -> str:
        return "not run" if self.ok is None else "yes" if self.ok else "**NO**"


def not_run(fault: str, why: str) -> Row:
    """The row of a probe that could not run here, saying why."""
    return Row(fault, f"not run: {why}", None)


def pvpo(*args: str, timeout: float = 600, env: dict[str, str] | None = None, cwd: Path = REPO) -> Outcome:
    """`python -m pvpo.cli ARGS` (from the repo root by default): its exit status and stderr+stdout."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pvpo.cli", *args],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Outcome(proc.returncode, proc.stderr + proc.stdout, time.perf_counter() - t0)


def interruptible() -> None:
    """In a child: SIGINT as a terminal's Ctrl-C delivers it, even when this bench runs as a
    background job (whose children start with SIGINT ignored, which pvpo respects)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`pvpo ARGS` in the background, stdout and stderr captured together."""
    cmd = [sys.executable, "-m", "pvpo.cli", *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )


def python(code: str, *, timeout: float = 300) -> Outcome:
    """`python -c CODE` with the bench's environment: its exit status and stderr+stdout."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    return Outcome(proc.returncode, proc.stderr + proc.stdout, time.perf_counter() - t0)


def jsonl(rows: list[dict]) -> bytes:
    """`rows` as a JSON-lines file's bytes."""
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def first_error(out: str) -> str:
    """The `error: ...` line of a refused command (with the next line when it ends in a colon),
    click's `Invalid value` line for a bad option, else the output's first line."""
    lines = [ln.strip(" │╭╰─") for ln in out.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("error:"):
            return (ln + (" " + lines[i + 1] if ln.endswith(":") and i + 1 < len(lines) else ""))[:160]
    return next((ln for ln in lines if "Invalid value" in ln), lines[0] if lines else "")[:160]


def error_block(out: str) -> list[str]:
    """The lines a refused command ends with, from its `error:` line on."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), len(lines))
    return lines[start:]


def one_line(out: str, rc: int, expect: str, *, status: int = 2) -> bool:
    """rc `status`, an error of at most 3 lines (error, fix, the --debug hint) holding `expect`, no traceback."""
    block = error_block(out)
    return rc == status and 1 <= len(block) <= 3 and expect in " ".join(block) and "Traceback" not in out


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(*procs: subprocess.Popen) -> None:
    """SIGKILL each process that still runs, by its PID, and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, timeout: float = 300, poll: float = 0.05) -> bool:
    """Poll `cond()` while `proc` runs; whether it came true before `proc` ended."""
    t0 = time.perf_counter()
    while proc.poll() is None and time.perf_counter() - t0 < timeout:
        if cond():
            return True
        time.sleep(poll)
    return False


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def steps(run: Path) -> list[int]:
    """The steps `run`'s metrics.jsonl logged, in order."""
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path | None]:
    """A tmpfs mounted at `path` with `options` (e.g. `size=4m`, `ro,size=64k`); None where it cannot
    be mounted (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    ok = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]).returncode == 0
    )
    try:
        yield path if ok else None
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(path)], check=True)


class Probes:
    """The shared scratch folder of the rounds: `work`, the smoke run in `work/smoke` (`base`) and
    the loopback retriever's `url`; each round subclasses it with its probes."""

    def __init__(self, work: Path, url: str = "") -> None:
        self.work = work
        self.base = work / "smoke"
        self.url = url

    def copy_run(self, name: str) -> Path:
        """A copy of the smoke run with a user's notes.txt in it."""
        run = self.work / name
        shutil.copytree(self.base, run)
        (run / "notes.txt").write_text("a user's notes\n")
        return run

    def dataset(self, name: str, data: bytes) -> Path:
        """`data` written as `work/data/<name>`."""
        path = self.work / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def questions(self, name: str, n: int) -> Path:
        """A dataset of `n` FlashRAG questions."""
        rows = [{"id": str(i), "question": f"who is entity {i}?", "golden_answers": ["x"]} for i in range(n)]
        return self.dataset(name, jsonl(rows))

    def eval_args(self, data: Path, out: str, *, model: Path | None = None) -> list[str]:
        """`pvpo eval` of `data` with the smoke run's policy (short answers) into `work/<out>`."""
        policy = model or self.base / "checkpoints" / "step_000002" / "policy"
        return [
            "eval",
            "--model",
            str(policy),
            "--dataset",
            str(data),
            "--retriever-url",
            self.url,
            "--out",
            str(self.work / out),
            "--max-new-tokens",
            "16",
            "--max-response-tokens",
            "160",
            "--max-turns",
            "2",
            "--quiet",
        ]


def run_probes(probes: list[Callable[[], Row]]) -> list[Row]:
    """Each probe's row, in order; a probe whose injection itself broke is a failing row saying so."""
    rows = []
    for probe in probes:
        try:
            rows.append(probe())
        except Exception as e:  # noqa: BLE001 - a broken row is reported as one, the table still prints
            name = getattr(probe, "__name__", "probe")
            rows.append(Row(name, f"the fault injection itself failed: {e!r}"[:200], False))
    return rows


def serve_index(index: Path, port: int) -> subprocess.Popen:
    """`pvpo retriever serve` over `index` on `port`, once /health answers (its output discarded: a
    pipe nobody reads would stall a long-lived server)."""
    import httpx

    server = subprocess.Popen(
        [sys.executable, "-m", "pvpo.cli", "retriever", "serve", "--index", str(index), "--port", str(port)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return server


def cell(text: str) -> str:
    """`text` as a table cell: brackets outside code spans escaped, so a quoted reply such as
    `result[0][0]` is not read as a markdown reference link (mkdocs --strict refuses the page)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[i] = parts[i].replace("[", "\\[").replace("]", "\\]")
    return "`".join(parts)


def table(title: str, rows: list[Row], work: Path) -> str:
    """One round's markdown table (the scratch folder shown as $W)."""
    out = [f"{title}\n", "| fault | result | ok |", "|---|---|---|"]
    for r in rows:
        result = cell(r.result.replace(str(work), "$W").replace("|", "/").replace("\n", " "))
        out.append(f"| {r.fault} | {result} | {r.verdict} |")
    return "\n".join(out) + "\n"


def total(rows: list[Row]) -> str:
    """`N/M as due` over the probes that ran, and how many did not run."""
    ran = [r for r in rows if r.ok is not None]
    skipped = len(rows) - len(ran)
    return f"{sum(bool(r.ok) for r in ran)}/{len(ran)} as due" + (f", {skipped} not run" if skipped else "")


def print_alone(rows: list[Row], work: Path) -> NoReturn:
    """A probe module run by itself: its rows as the runner's table, then exit 1 if one fails."""
    print(table("", rows, work).lstrip("\n"))
    sys.exit(0 if all(r.ok is not False for r in rows) else 1)
