"""docs/quickstart.md's "Your first search agent" block as a user runs it, measured for its record
(the bars the page's block is held to: 15 minutes and 8 GiB on 2 idle cores): the block between the page's
`first-agent` markers runs with bash in a fresh clone of HEAD (or `--workdir`), on HotpotQA
questions written in FlashRAG's layout and given to `pvpo data get` as `--from`. The clone is the
clean folder a user starts from; `pvpo` is this venv's (an editable install runs this checkout's
code, so the machine line's commit carries `+changes` where it differs from HEAD).

The block runs as written but for two substitutions, each refused in one line where the page's
block no longer holds what it replaces: `--from DIR` added to the `pvpo data get` line, and the port
8000 replaced by a free one; `kill %1; wait` after it stops the server as the page says. `--shorten`
applies tests/test_first_agent.py's cuts (3 questions, 1 held out, 1 SFT step) to check this
script end to end; its figures are no record.

Measured: the wall time of the whole and of each command (a line appending bash's $EPOCHREALTIME
to a file between the block's commands, which are not changed), the peak of the summed resident
sets of bash and all its descendants, the retriever server and the evaluation together, sampled
every `--sample-s` s with psutil (an upper bound: pages two processes share count twice), the
largest single process, the evaluation's metrics.json (EM, F1, cover-EM, format ok, searches per
answer) and the warm start's warm_start.json (SFT steps and seconds). Printed as one table with
the machine (pvpo.machine) and written to `--out` as JSON with the block, the commit and the date.

    python bench/quickstart/first_agent.py                         # the record (~15 min, both cores)
    taskset -c 0 python bench/quickstart/first_agent.py --shorten --out runs/bench-first-agent/short.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import pvpo
from bench.quickstart.tree_memory import GIB, TreeSampler, stop_leftovers
from pvpo.machine import machine_line, machine_record

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
QUESTIONS = REPO.parent / "shared" / "data" / "hotpotqa_mini" / "questions.json"
RUN = "runs/first-agent"  # the block's $A: where this script reads the results from
OUTPUTS = ("runs/data/hotpotqa/train.jsonl", RUN, "runs/first-agent.html")  # what the block writes
BARS = (15.0, 8.0)  # minutes and GiB on 2 idle cores: a laptop's first agent
STOP = "kill %1; wait || true"  # the page's `kill %1 when done`; `wait` reports the server's SIGTERM
# tests/test_first_agent.py's cuts (`shortened`), the same text replaced by the same text
SHORTEN = {
    "--limit 100 --out runs/data": "--limit 3 --out runs/data",
    "'data.source=[runs/data/hotpotqa/train.jsonl]'": "'data.source=[runs/data/hotpotqa/train.jsonl]' "
    "data.held_out_examples=1 data.max_eval_examples=1 data.warm_start_examples=1 "
    "model.warm_start_steps=1 model.warm_start_batch_size=1",
}


class BlockError(ValueError):
    """The page's block, or the questions, are not what this script measures."""


def first_agent_block(page: Path = PAGE) -> str:
    """The fenced bash block between the page's `first-agent` markers, exactly as written."""
    text = page.read_text(encoding="utf-8")
    found = re.search(r"<!-- first-agent[^\n]*\n```bash\n(.*?)```\n<!-- end of first-agent -->", text, re.S)
    if found is None:
        raise BlockError(f"{page} has no first-agent block (<!-- first-agent ... --> ```bash ... ```)")
    return found.group(1)


def flashrag_records(hotpot: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HotpotQA's official records in FlashRAG's layout: {id, question, golden_answers, metadata:
    {context: {title, sentences}, supporting_facts: {title, sent_id}, type}} (as
    tests/test_envs_data_get.py's `flashrag_records` writes the shipped ones)."""
    out = []
    for r in hotpot:
        try:
            context = {"title": [c[0] for c in r["context"]], "sentences": [c[1] for c in r["context"]]}
            facts = {"title": [f[0] for f in r["supporting_facts"]], "sent_id": [f[1] for f in r["supporting_facts"]]}
            meta = {"context": context, "supporting_facts": facts, "type": r["type"]}
            out.append({"id": r["_id"], "question": r["question"], "golden_answers": [r["answer"]], "metadata": meta})
        except (KeyError, IndexError, TypeError) as e:
            raise BlockError(f"question {len(out) + 1} is not HotpotQA's distractor format (missing {e})") from None
    return out


def write_flashrag(questions: Path, root: Path) -> int:
    """`questions` (a HotpotQA JSON list) as `root/hotpotqa/train.jsonl`; the number written."""
    try:
        hotpot = json.loads(questions.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BlockError(f"--questions {questions}: not readable as JSON ({e})") from None
    if not isinstance(hotpot, list) or not hotpot:
        raise BlockError(f"--questions {questions}: give a non-empty JSON list of HotpotQA questions")
    records = flashrag_records(hotpot)
    path = root / "hotpotqa" / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return len(records)


def substituted(block: str, copy: Path, port: int, *, shorten: bool = False) -> str:
    """The block with `--from copy` added to its `pvpo data get` line and the port 8000 replaced
    (and, with `shorten`, the test's cuts); every other line kept. BlockError where the block no
    longer holds a text this replaces or reads."""
    needed = {"A=runs/first-agent": "the run folder this script reads", "8000": "the port it replaces"}
    cuts = SHORTEN if shorten else {}
    for text, why in [*needed.items(), *((c, "a size --shorten cuts") for c in cuts)]:
        if text not in block:
            raise BlockError(f"the first-agent block no longer holds {text!r} ({why}): update {Path(__file__).name}")
    for old, new in cuts.items():
        block = block.replace(old, new)
    gets = list(re.finditer(r"^(pvpo data get [^#\n]*?)(\s*#[^\n]*)?$", block, re.M))
    if len(gets) != 1:
        raise BlockError(f"the first-agent block holds {len(gets)} `pvpo data get` lines, not 1: update this script")
    at = gets[0].end(1)
    block = block[:at] + f" --from {shlex.quote(str(copy))}" + block[at:]
    return block.replace("8000", str(port))


def logical_commands(script: str) -> list[str]:
    """The script's commands, continuation lines joined and comments dropped, one per entry."""
    joined = re.sub(r"\\\n\s*", " ", script)
    lines = [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [" ".join(line.split(" #")[0].split()) for line in lines]


def with_marks(script: str) -> str:
    """`script` with a line after each command (and one before the first) that appends its index
    and bash's $EPOCHREALTIME to $PVPO_BENCH_MARKS; the commands' own lines unchanged."""
    out = ['__mark() { printf "%s %s\\n" "$1" "$EPOCHREALTIME" >>"$PVPO_BENCH_MARKS"; }', "__mark 0"]
    n = 0
    for line in script.splitlines():
        out.append(line)
        if line.strip() and not line.lstrip().startswith("#") and not line.endswith("\\"):
            n += 1
            out.append(f"__mark {n}")
    return "\n".join(out) + "\n"


def read_marks(path: Path) -> list[float]:
    """The times of the marks written so far, by index."""
    try:
        rows = [line.split() for line in path.read_text().splitlines()]
    except OSError:
        return []
    return [float(r[1]) for r in rows if len(r) == 2]


def read_results(workdir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The evaluation's metrics.json and the warm start's figures (steps = losses recorded, SFT
    seconds, trajectories, last loss, the GT report); None for a file missing or damaged."""

    def load(path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    metrics = load(workdir / RUN / "eval" / "held_out" / "metrics.json")
    ws = load(workdir / RUN / "warm_start.json")
    warm = None
    if isinstance(ws, dict):
        losses = ws.get("losses") or []
        warm = {
            "steps": len(losses),
            "sft_seconds": ws.get("sft_seconds"),
            "trajectories": len(ws.get("questions") or []),
            "last_loss": losses[-1] if losses else None,
            "dataset_gt": ws.get("dataset_gt"),
        }
    return (metrics if isinstance(metrics, dict) else None), warm


def per_command(commands: list[str], marks: list[float], samples: list[tuple[float, int]], end: float) -> list[dict]:
    """Each command's wall seconds and the tree's peak while it ran (None for one never started;
    the one that failed runs until `end`)."""
    rows = []
    for i, cmd in enumerate(commands):
        start = marks[i] if i < len(marks) else None
        stop = marks[i + 1] if i + 1 < len(marks) else (end if start is not None else None)
        inside = [s for t, s in samples if start is not None and stop is not None and start <= t <= stop]
        rows.append(
            {
                "command": cmd,
                "wall_s": None if start is None or stop is None else round(stop - start, 2),
                "peak_gib": round(max(inside) / GIB, 3) if inside else None,
                "finished": i + 1 < len(marks),
            }
        )
    return rows


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def verdict(value: float | None, bar: float, shortened: bool) -> str:
    if shortened:
        return "none (--shorten)"
    return "not measured" if value is None else ("met" if value <= bar else f"missed by {value - bar:.2f}")


def render(rec: dict[str, Any]) -> str:
    """The record as text: machine, command, one table."""
    minutes, gib = rec["bars"]
    wall_min = None if rec["wall_s"] is None else rec["wall_s"] / 60
    m, w, short = rec["metrics"] or {}, rec["warm_start"] or {}, rec["shortened"]
    lines = [
        f"machine: {rec['machine_line']}",
        f"load average at start: {' '.join(f'{x:.2f}' for x in rec['load_at_start'])}; date {rec['date']}",
        f"$ {rec['argv']}",
        f"block: {rec['page']} (first-agent), in {rec['where']}; exit status {rec['returncode']}",
        "",
        "| figure | value | bar | verdict |",
        "|---|---|---|---|",
        f"| wall time, whole block | {_f(wall_min, '.2f')} min | <= {minutes:g} min | "
        f"{verdict(wall_min, minutes, short)} |",
        f"| peak RSS, server + eval + all (sum) | {_f(rec['peak_total_gib'], '.2f')} GiB | <= {gib:g} GiB | "
        f"{verdict(rec['peak_total_gib'], gib, short)} |",
        f"| largest single process | {_f(rec['peak_single_gib'], '.2f')} GiB ({rec['peak_single_cmd']}) | | |",
    ]
    for i, c in enumerate(rec["commands"], 1):
        text = c["command"] if len(c["command"]) <= 60 else c["command"][:57] + "..."
        peak = "no sample inside" if c["peak_gib"] is None else f"peak {c['peak_gib']:.2f} GiB"
        lines.append(f"| {i}. `{text}` | {_f(c['wall_s'], '.1f')} s, {peak} | | |")
    lines += [
        f"| EM / F1 / cover-EM ({m.get('n', 'n/a')} held out) | {_f(m.get('em'))} / {_f(m.get('f1'))} / "
        f"{_f(m.get('acc'))} | | |",
        f"| format ok | {_f(m.get('format_ok'))} | | |",
        f"| searches per answer | {_f(m.get('searches'), '.2f')} | | |",
        f"| warm start | {w.get('steps', 'n/a')} SFT steps, {_f(w.get('sft_seconds'), '.0f')} s, "
        f"{w.get('trajectories', 'n/a')} trajectories | | |",
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_block(script: str, workdir: Path, log: Path, marks: Path, every: float, timeout_s: float) -> dict[str, Any]:
    """`bash -e -c script` in `workdir` (the venv's bin first on PATH, Hugging Face offline) in a
    session of its own, sampled and timed, progress printed; its leftovers stopped by PID."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PVPO_BENCH_MARKS": str(marks),
    }
    commands = logical_commands(script)
    t0 = time.time()
    with log.open("w") as sink:  # a file, not a pipe: a server left running must not hold it open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", with_marks(script)],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid, every)
        shown, last_line = 0, t0
        try:
            while proc.poll() is None and time.time() - t0 < timeout_s:
                done = len(read_marks(marks))
                for i in range(shown, min(done, len(commands))):
                    print(f"[{time.time() - t0:6.0f} s] {i + 1}/{len(commands)} {commands[i][:90]}", flush=True)
                shown = max(shown, done)
                if time.time() - last_line >= 60:
                    now = sampler.samples[-1][1] if sampler.samples else 0
                    print(
                        f"[{time.time() - t0:6.0f} s] tree RSS {now / GIB:.2f} GiB, peak {sampler.peak_total / GIB:.2f}"
                    )
                    last_line = time.time()
                time.sleep(1.0)
            timed_out = proc.poll() is None
        finally:
            sampler.stop()
            left = stop_leftovers(sampler)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the session's group, where a process escaped the sampling
            except ProcessLookupError:
                pass
            proc.wait()
    end = time.time()
    return {
        "returncode": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(end - t0, 2),
        "commands": per_command(commands, read_marks(marks), sampler.samples, end),
        "peak_total_gib": round(sampler.peak_total / GIB, 3),
        "peak_single_gib": round(sampler.peak_single / GIB, 3),
        "peak_single_cmd": sampler.peak_single_cmd,
        "samples": len(sampler.samples),
        "leftovers_stopped": left,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, default=QUESTIONS, help=f"HotpotQA JSON list (default {QUESTIONS})")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("runs/bench-first-agent/record.json"),
        help="the record (JSON); the block's output beside it (.log)",
    )
    ap.add_argument("--workdir", type=Path, help="run in this folder (a checkout) instead of a fresh clone of HEAD")
    ap.add_argument("--shorten", action="store_true", help="tests/test_first_agent.py's cuts: a check, no record")
    ap.add_argument("--keep", action="store_true", help="keep the fresh clone (its runs/) and the FlashRAG copy")
    ap.add_argument("--sample-s", type=float, default=0.5, help="seconds between memory samples")
    ap.add_argument("--timeout-min", type=float, default=60.0, help="stop the block after this many minutes")
    ap.add_argument("--debug", action="store_true", help="tracebacks on errors")
    a = ap.parse_args(argv)
    try:
        return record(a)
    except (BlockError, subprocess.CalledProcessError) as e:
        if a.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


def record(a: argparse.Namespace) -> int:
    """Check the inputs, run the block, write and print the record; 0 when the block succeeded."""
    if not a.questions.is_file():
        raise BlockError(f"--questions {a.questions}: no such file; pass HotpotQA's JSON (e.g. hotpot_train_v1.1.json)")
    if a.out.exists():
        raise BlockError(f"--out {a.out} exists: a record is one run, pass another --out")
    if a.sample_s <= 0 or a.timeout_min <= 0:
        raise BlockError("--sample-s and --timeout-min must be positive")
    if a.workdir is not None:
        if not a.workdir.is_dir():
            raise BlockError(f"--workdir {a.workdir}: no such folder")
        taken = [p for p in OUTPUTS if (a.workdir / p).exists()]
        if taken:
            raise BlockError(f"--workdir {a.workdir}: holds {', '.join(taken)} (the block writes them): give another")
    block = first_agent_block()
    tmp = Path(tempfile.mkdtemp(prefix="bench-first-agent-"))
    try:
        return measure(a, block, tmp)
    finally:
        if a.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)  # this script's own temp folder (the clone, the copy)


def measure(a: argparse.Namespace, block: str, tmp: Path) -> int:
    """Write the questions under `tmp`, run the substituted block, write and print the record."""
    asked = write_flashrag(a.questions, tmp / "copy")
    script = substituted(block, tmp / "copy", free_port(), shorten=a.shorten) + STOP + "\n"
    machine = machine_record(("torch", "transformers", "faiss-cpu", "psutil"))  # before: the start's load
    load0, date = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    workdir = a.workdir
    if workdir is None:
        workdir = tmp / "clone"
        subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(workdir)], check=True)
    argv = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"machine: {machine_line(('torch', 'transformers'), machine)}\n$ {argv}", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    log = a.out.with_suffix(".log")
    print(f"the block runs in {workdir}; its output goes to {log}", flush=True)
    ran = run_block(script, workdir, log, tmp / "marks", a.sample_s, a.timeout_min * 60)
    metrics, warm = read_results(workdir)
    rec = {
        "page": str(PAGE.relative_to(REPO)),
        "block": block,
        "script": script,
        "shortened": a.shorten,
        "questions": str(a.questions),
        "questions_given": asked,
        "where": str(a.workdir) if a.workdir else f"a fresh clone of {head.strip()[:12]}",
        "commit": head.strip(),
        "pvpo_from": str(Path(pvpo.__file__).parent),  # the code `pvpo` runs (an editable install: this checkout)
        "argv": argv,
        "date": date,
        "load_at_start": [round(x, 2) for x in load0],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "bars": BARS,
        **ran,
        "metrics": metrics,
        "warm_start": warm,
        "machine": machine,
        "machine_line": machine_line(("torch", "transformers"), machine),
    }
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(render(rec), end="")
    print(f"record: {a.out}; log: {log}")
    return 0 if ran["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
