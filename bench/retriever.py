"""Retriever benchmark on the musique_mini corpus (1,890 passages, MiniLM, FAISS Flat).

Measures, in one run on this machine: corpus/index load time, in-process batched throughput,
served throughput and p50/p99 latency with 1/8/32/64 concurrent single-query clients, with and
without cross-request batching (server in its own process, as deployed), and recall@5 of the
supporting paragraphs of the musique_mini questions. Prints one markdown table.

The load comes from wrk (C, one thread, one closed-loop connection per client, a Lua script
cycling through the query bodies) when it is on PATH, else from a Python httpx generator, whose
own CPU time on a 2-core box takes a large share from the server; the table names the generator
and its CPU time per request. The in-process figure uses the batch size the server can form at
that concurrency and the same torch thread count as the server, so the ratios compare like with
like; in-process cost per query at batch 1 vs batch N bounds what batching can gain.

    .venv/bin/python bench/retriever.py [--duration 8] [--work-dir ~/.cache/pvpo/bench-retriever]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("PVPO_SHARED_DATA", REPO.parent / "shared" / "data"))


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()} | {cpu} | {os.cpu_count()} cores visible, torch threads {torch.get_num_threads()} "
        f"| {gpu} | Python {platform.python_version()}, torch {torch.__version__}"
    )


def questions_and_queries(data: Path) -> tuple[list[dict], list[str]]:
    """The questions, and a pool of distinct queries (questions and their sub-questions)."""
    questions = json.loads((data / "musique_mini" / "questions.json").read_text())
    pool = [q["question"] for q in questions]
    for q in questions:
        pool += [d["question"] for d in q.get("question_decomposition", []) if "#" not in d["question"]]
    return questions, list(dict.fromkeys(pool))


def recall_at_k(retriever, questions: list[dict], corpus_rows: dict[tuple[str, str], int], k: int) -> float:
    """Mean over questions of the fraction of supporting paragraphs among the top k."""
    results = retriever.search([q["question"] for q in questions], topk=k)
    recalls = []
    for q, passages in zip(questions, results):
        gold = {corpus_rows[(p["title"], p["paragraph_text"])] for p in q["paragraphs"] if p["is_supporting"]}
        got = {int(p.id) for p in passages}
        recalls.append(len(gold & got) / len(gold))
    return float(np.mean(recalls))


def in_process_throughput(retriever, pool: list[str], batch: int, seconds: float) -> float:
    """Queries/s of retriever.search on batches of `batch` distinct queries."""
    done, i, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        queries = [pool[(i + j) % len(pool)] for j in range(batch)]
        retriever.search(queries, topk=3)
        done += batch
        i += batch
    return done / (time.perf_counter() - t0)


def uvicorn_impl() -> str:
    """Which event loop and HTTP parser uvicorn's "auto" picks here (uvloop/httptools when installed)."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} / {http}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    index_dir: Path,
    *,
    batching: bool,
    max_batch: int,
    max_wait_ms: float,
    max_delay_ms: float,
    threads: int,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, str]:
    from pvpo.retriever.replicas import wait_healthy

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pvpo.cli",
        "retriever",
        "serve",
        "--index",
        str(index_dir),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-batch-size",
        str(max_batch),
        "--max-wait-ms",
        str(max_wait_ms),
        "--max-delay-ms",
        str(max_delay_ms),
        "--threads",
        str(threads),
        "--log-level",
        "warning",
        *extra,
    ] + (["--no-batching"] if not batching else [])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ | {"HF_HUB_OFFLINE": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy([url], [proc], timeout=180)
    except RuntimeError as e:
        exited = proc.poll() is not None
        proc.kill()
        raise RuntimeError(f"{e}: {proc.stderr.read().decode()[-2000:]}" if exited else str(e)) from None
    return proc, url


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
    warm-up run; also the generator's CPU seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        script, bodies = Path(tmp) / "load.lua", Path(tmp) / "bodies.txt"
        script.write_text(WRK_SCRIPT)
        bodies.write_text("".join(json.dumps({"queries": [q], "topk": 3, "return_scores": True}) + "\n" for q in pool))
        env = os.environ | {"WRK_BODIES": str(bodies)}

        def run(secs: float) -> dict[str, float]:
            cmd = [
                "wrk",
                "-t1",
                f"-c{clients}",
                f"-d{max(1, round(secs))}s",
                "--timeout",
                "60s",
                "-s",
                str(script),
                url,
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            return json.loads(out.split("WRKJSON", 1)[1])

        run(warmup)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = run(seconds)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "qps": r["requests"] / (r["duration_us"] / 1e6),
        "p50": r["p50_us"] / 1000,
        "p99": r["p99_us"] / 1000,
        "errors": r["errors"],
        "gen_cpu_ms": 1000 * cpu / max(1, r["requests"]),
    }


def python_load(url: str, pool: list[str], clients: int, seconds: float, warmup: float = 1.0) -> dict[str, float]:
    """The httpx generator in this process, with its own CPU time per request."""
    cpu0 = time.process_time()
    m = asyncio.run(load(url, pool, clients, seconds, warmup))
    m["gen_cpu_ms"] = 1000 * (time.process_time() - cpu0) / max(1, m["qps"] * seconds)
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
                r = await client.post(url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pvpo" / "bench-retriever")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per concurrency level")
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-delay-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level (p50/p99: median of rounds)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads, server and in-process (default: cores-1)")
    ap.add_argument("--generator", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    args = ap.parse_args()

    corpus_file = args.data / "musique_mini" / "corpus.json"
    if not corpus_file.exists():
        sys.exit(
            f"bench/retriever.py needs the musique_mini sample at {corpus_file} (../shared/data beside the "
            "checkout, or set PVPO_SHARED_DATA); it is not on this machine."
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.build import build_index
    from pvpo.retriever.corpus import CorpusStore, iter_corpus
    from pvpo.retriever.index import OFFSETS_FILE, load_retriever, read_meta
    from pvpo.retriever.server import set_torch_threads
    from pvpo.retriever.types import split_contents

    threads = set_torch_threads(args.threads)
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    rows: list[tuple[str, str]] = []
    index_dir = args.work_dir / "musique_mini_Flat"
    t0 = time.perf_counter()
    build_index(corpus_file, index_dir, index_type="Flat", show_progress=True)  # resumes / reuses a cached build
    build_s = time.perf_counter() - t0
    meta = read_meta(index_dir)
    rows.append(("index build (this run; reuses cached embeddings when present)", f"{build_s:.1f} s"))
    (index_dir / OFFSETS_FILE).unlink()
    t0 = time.perf_counter()
    n = len(CorpusStore(index_dir / meta["corpus"], index_dir / OFFSETS_FILE))
    rows.append(
        (f"corpus store open, {n} passages, cold (line spans computed)", f"{(time.perf_counter() - t0) * 1000:.1f} ms")
    )
    t0 = time.perf_counter()
    CorpusStore(index_dir / meta["corpus"], index_dir / OFFSETS_FILE)
    rows.append(("corpus store open, warm (cached spans)", f"{(time.perf_counter() - t0) * 1000:.1f} ms"))
    t0 = time.perf_counter()
    retriever = load_retriever(index_dir, device="cpu")
    rows.append(("load_retriever (index + corpus + MiniLM)", f"{time.perf_counter() - t0:.2f} s"))

    questions, pool = questions_and_queries(args.data)
    corpus_rows = {}
    for row, (_, contents) in enumerate(iter_corpus(corpus_file)):
        title, text = split_contents(contents)
        corpus_rows[(title, text)] = row
    rows.append(
        (
            "recall@5, supporting paragraphs, 100 questions (MiniLM, Flat)",
            f"{recall_at_k(retriever, questions, corpus_rows, 5):.3f}",
        )
    )
    bm25_dir = build_index(corpus_file, args.work_dir / "musique_mini_bm25", index_type="bm25", show_progress=False)
    bm25 = load_retriever(bm25_dir)
    rows.append(("recall@5, same, BM25 (bm25s) for reference", f"{recall_at_k(bm25, questions, corpus_rows, 5):.3f}"))

    # The machine is shared and noisy: each concurrency level measures in-process, batched and
    # unbatched serving back to back, and each ratio uses measurements taken next to each other.
    import httpx

    levels = [int(x) for x in args.levels.split(",")]
    gen = wrk_load if args.generator == "wrk" else python_load
    gen_name = (
        "wrk (C, 1 thread, closed-loop connections)"
        if args.generator == "wrk"
        else "Python httpx asyncio in the bench process"
    )
    rows.append(("load generator", gen_name))
    rows.append(("torch threads (server and in-process); uvicorn loop / http", f"{threads}; {uvicorn_impl()}"))
    servers = {
        b: start_server(
            index_dir,
            batching=b,
            max_batch=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            max_delay_ms=args.max_delay_ms,
            threads=threads,
        )
        for b in (True, False)
    }
    try:
        for _, url in servers.values():
            gen(url, pool, 4, 1.0, warmup=1.0)
        for c in levels:
            batch = min(c, args.max_batch_size)
            # Interleaved rounds, so a neighbour's burst of CPU load hits every figure alike.
            load_avg = os.getloadavg()[0]
            t_one = t_batch = 0.0
            runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for _ in range(args.rounds):
                t_one += 1 / in_process_throughput(retriever, pool, 1, args.duration / (2 * args.rounds))
                t_batch += 1 / in_process_throughput(retriever, pool, batch, args.duration / (2 * args.rounds))
                for b, (_, url) in servers.items():
                    before = httpx.get(url + "/info").json()["batching"]
                    r = gen(url, pool, c, args.duration / args.rounds)
                    after = httpx.get(url + "/info").json()["batching"]
                    r["queries"], r["batches"] = (
                        after["queries"] - before["queries"],
                        after["batches"] - before["batches"],
                    )
                    runs[b].append(r)
            one, in_proc = args.rounds / t_one, args.rounds / t_batch  # mean cost per query, inverted
            m = {
                b: {
                    "qps": float(np.mean([r["qps"] for r in rs])),
                    "p50": float(np.median([r["p50"] for r in rs])),
                    "p99": float(np.median([r["p99"] for r in rs])),
                    "errors": sum(r["errors"] for r in rs),
                    "gen_cpu_ms": float(np.mean([r["gen_cpu_ms"] for r in rs])),
                    "batch": sum(r["queries"] for r in rs) / max(1, sum(r["batches"] for r in rs)),
                }
                for b, rs in runs.items()
            }
            rows.append((f"{c} clients: machine load (1-min average, uptime) before this level", f"{load_avg:.2f}"))
            rows.append(
                (
                    f"{c} clients: in-process, batch 1 | batch {batch} (topk 3)",
                    f"{one:.1f} q/s ({1000 / one:.1f} ms/q) | {in_proc:.1f} q/s ({1000 / in_proc:.1f} ms/q)",
                )
            )
            rows.append(
                (
                    f"{c} clients: bound on batched/unbatched = in-process batch {batch} / batch 1",
                    f"{in_proc / one:.2f}",
                )
            )
            for b, label in ((True, "cross-request batching"), (False, "no batching")):
                rows.append(
                    (
                        f"{c} clients: served, {label}: q/s | p50 | p99 | errors | mean batch | generator CPU/req (p50/p99 median of rounds)",
                        f"{m[b]['qps']:.1f} q/s | {m[b]['p50']:.0f} ms | {m[b]['p99']:.0f} ms | {m[b]['errors']} "
                        f"| {m[b]['batch']:.1f} | {m[b]['gen_cpu_ms']:.2f} ms",
                    )
                )
            off = m[False]["qps"]
            rows.append(
                (
                    f"{c} clients: served batched / in-process batch {batch}" + (" (target >= 0.8)" if c == 32 else ""),
                    f"{m[True]['qps'] / in_proc:.2f}",
                )
            )
            rows.append(
                (
                    f"{c} clients: served batched / served unbatched" + (" (target >= 3)" if c == 32 else ""),
                    f"{m[True]['qps'] / off:.2f}" if off else "inf (none completed without batching)",
                )
            )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    retriever.close()

    width = max(len(r[0]) for r in rows)
    print(f"\n| {'measure'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
