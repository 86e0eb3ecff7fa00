"""Closed-loop load on a `/retrieve` server, shared by the retriever benches: the musique_mini
query pool, `clients` connections each sending one single-query request at a time (wrk, C, one
thread and a Lua script cycling through the bodies, when it is on PATH; else an httpx generator in
the bench's own process, whose CPU time on a 2-core box takes a large share from the server), the
CPU a process and the whole machine used, and `pvpo retriever serve` in a process of its own."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = Path(os.environ.get("PVPO_SHARED_DATA", REPO.parent / "shared" / "data"))
Generator = Callable[..., dict[str, float]]


def questions_and_queries(data: Path) -> tuple[list[dict], list[str]]:
    """musique_mini's questions, and a pool of distinct queries (the questions and their
    sub-questions that name no earlier answer)."""
    questions = json.loads((data / "musique_mini" / "questions.json").read_text())
    pool = [q["question"] for q in questions]
    for q in questions:
        pool += [d["question"] for d in q.get("question_decomposition", []) if "#" not in d["question"]]
    return questions, list(dict.fromkeys(pool))


def musique_corpus(data: Path, bench: str) -> Path:
    """The musique_mini corpus file the retriever benches serve; exits with one line naming where
    it was looked for when the sample is not on this machine."""
    corpus_file = data / "musique_mini" / "corpus.json"
    if not corpus_file.exists():
        raise SystemExit(
            f"{bench} needs the musique_mini sample at {corpus_file} (../shared/data beside the checkout, "
            "or set PVPO_SHARED_DATA); it is not on this machine."
        )
    return corpus_file


def uvicorn_impl() -> str:
    """Which event loop and HTTP parser uvicorn's "auto" picks here (uvloop/httptools when installed)."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} / {http}"


def start_server(
    index_dir: Path, *, extra: tuple[str, ...] = (), checkout: Path | None = None, log: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """`pvpo retriever serve` of `index_dir` in its own process, once healthy; `extra`: more serve
    flags; `checkout`: serve that checkout's code instead (run from it: `python -m` puts the
    working directory first on sys.path); `log`: the server's output goes to this file."""
    from pvpo.retriever.testing import start_server as serve

    env = {"PYTHONPATH": str(checkout)} if checkout else None
    proc, (url,) = serve(index_dir, extra=list(extra), env=env, cwd=checkout, log=log)
    return proc, url


def process_cpu(pid: int, *, children: bool = False) -> float:
    """CPU seconds a process has used, all its threads (Linux /proc); `children`: with those of
    its child processes that have ended (a loader's worker processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11 : 15 if children else 13])
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy(stat: Path = Path("/proc/stat")) -> tuple[float, float, float]:
    """(busy, elapsed, stolen) CPU seconds of the whole machine, all cores, from /proc/stat: busy
    over elapsed across an interval is how many cores were busy, ours and every other job's;
    stolen is the time the hypervisor gave our virtual cores to other guests (counted in busy),
    over elapsed x cores the share of the machine a run did not get."""
    v = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    total = sum(v[:8]) / tick
    steal = v[7] / tick if len(v) > 7 else 0.0
    return total - (v[3] + v[4]) / tick, total / (os.cpu_count() or 1), steal


def body(query: str, topk: int = 3) -> dict[str, Any]:
    """One /retrieve request for one query (`return_scores` true: Search-R1's endpoint fails
    unpacking (results, scores) without it)."""
    return {"queries": [query], "topk": topk, "return_scores": True}


WRK_SCRIPT = r"""
local bodies = {}
for line in io.lines(os.getenv("WRK_BODIES")) do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  return wrk.format(nil, "/retrieve", nil, bodies[(i % #bodies) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status + e.connect + e.read + e.write + e.timeout))
end
"""


def wrk_load(url: str, pool: list[str], clients: int, seconds: float, warmup: float = 1.0) -> dict[str, float]:
    """wrk: `clients` connections, each one single-query request at a time, for `seconds` after a
    warm-up run; q/s, p50 / p99 ms, errors, and the generator's CPU in cores."""
    with tempfile.TemporaryDirectory() as tmp:
        script, bodies = Path(tmp) / "load.lua", Path(tmp) / "bodies.txt"
        script.write_text(WRK_SCRIPT)
        bodies.write_text("".join(json.dumps(body(q)) + "\n" for q in pool))
        env = os.environ | {"WRK_BODIES": str(bodies)}

        def run(secs: float) -> dict[str, float]:
            cmd = ["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(secs))}s", "--timeout", "60s", "-s", str(script)]
            out = subprocess.run([*cmd, url], env=env, capture_output=True, text=True, check=True).stdout
            return json.loads(out.split("WRKJSON", 1)[1])

        run(warmup)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = run(seconds)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    wall = r["duration_us"] / 1e6
    return {
        "qps": r["requests"] / wall,
        "p50": r["p50_us"] / 1000,
        "p99": r["p99_us"] / 1000,
        "errors": r["errors"],
        "wall_s": wall,
        "gen_cores": cpu / wall,
    }


def python_load(url: str, pool: list[str], clients: int, seconds: float, warmup: float = 1.0) -> dict[str, float]:
    """The httpx generator in this process, with its own CPU in cores."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    m = asyncio.run(load(url, pool, clients, seconds, warmup))
    m["wall_s"] = seconds
    m["gen_cores"] = (time.process_time() - cpu0) / (time.perf_counter() - t0)
    return m


async def load(url: str, pool: list[str], clients: int, seconds: float, warmup: float = 1.0) -> dict[str, float]:
    """`clients` concurrent loops of single-query requests for `seconds` (after a warm-up)."""
    import httpx

    counter = iter(range(10**9))
    latencies: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + seconds

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while (now := time.perf_counter()) < t_end:
            q = pool[next(counter) % len(pool)]
            try:
                r = await client.post(url + "/retrieve", json=body(q))
                ok = r.status_code == 200 and len(r.json()["result"]) == 1
            except httpx.HTTPError:
                ok = False
            done = time.perf_counter()
            # Count what completes inside the window, whenever it was sent (slow servers queue).
            if t_measure <= done <= t_end:
                if ok:
                    latencies.append(done - now)
                else:
                    errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*[one(client) for _ in range(clients)])
    lat = np.array(latencies) * 1000
    return {
        "qps": len(latencies) / seconds,
        "p50": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "errors": errors,
    }


# Cores that other processes may keep busy during a measured run before it is called not quiet. Over
# four runs of bench/retriever/retriever.py on a 2-core Xeon (2026-12-03) the quiet rounds read -0.45 to +0.20
# (/proc/stat's steal and the per-process CPU clocks do not add up exactly under heavy steal), and
# the rounds with a 24-s unit-test run beside them +0.37 to +0.99.
BESIDE_LIMIT = 0.3


def cores_beside(run: dict[str, float], cores: int) -> float:
    """Cores that processes other than the server and the load generator kept busy during a `run`
    of `measured`: the machine's busy cores less the stolen ones, the server's and the generator's."""
    return run["machine_cores"] - run.get("stolen", 0.0) * cores - run["server_cores"] - run["gen_cores"]


def measured(gen: Generator, pid: int, url: str, pool: list[str], clients: int, seconds: float) -> dict[str, float]:
    """One load run (`gen`) with the server's CPU (process `pid`), the whole machine's busy cores
    and the share of its CPU time stolen by the hypervisor over it."""
    cpu0, busy0, t0 = process_cpu(pid), machine_busy(), time.perf_counter()
    r = gen(url, pool, clients, seconds)  # its warm-up second included in the CPU shares
    cpu1, busy1, wall = process_cpu(pid), machine_busy(), time.perf_counter() - t0
    r["server_cores"] = (cpu1 - cpu0) / wall
    r["machine_cores"] = (busy1[0] - busy0[0]) / max(1e-9, busy1[1] - busy0[1])
    # recorded because our lone query uses both cores and Search-R1's server one: whether a stolen core
    # costs ours more is what this column lets a record check (not measured yet)
    r["stolen"] = (busy1[2] - busy0[2]) / max(1e-9, (busy1[1] - busy0[1]) * (os.cpu_count() or 1))
    r["beside_cores"] = cores_beside(r, os.cpu_count() or 1)
    return r
