"""Retriever benchmark on the musique_mini corpus (1,890 passages, MiniLM, FAISS Flat).

Measures, in one run on this machine: corpus/index load time, recall@5 of the supporting
paragraphs of the musique_mini questions, and at 1/8/32/64 concurrent single-query clients the
in-process batched ceiling next to served throughput and p50/p99 latency with and without
cross-request batching (servers in their own processes, as deployed) and, given a local copy of
it, Search-R1's own retrieval_server.py over the same index file, corpus and model. Targets:
served >= 0.9x the in-process ceiling at 8-64 clients, batched >= 2.5x unbatched at 32, ours >=
3x Search-R1 at 32 and 64. Prints the measures, then the table of docs/benchmarks/retriever.md.

The load comes from wrk (C, one thread, one closed-loop connection per client, a Lua script
cycling through the query bodies) when it is on PATH, else from a Python httpx generator, whose
own CPU time on a 2-core box takes a large share from the server. The in-process ceiling uses
the batch a server can form at that concurrency (min(clients, max batch)) and the server's torch
thread count. Every level runs its arms in interleaved rounds, and each row prints the 1-minute
load average and the CPU the server, the generator and the whole machine used (in cores), since
the 2 cores are shared with other jobs: a ratio is only read within one run.

    .venv/bin/python bench/retriever.py [--duration 8] [--work-dir ~/.cache/pvpo/bench-retriever]
        [--search-r1 PATH/retrieval_server.py --search-r1-pythonpath DIR_WITH_datasets]
        [--reference OTHER_CHECKOUT]   # e.g. `git archive BASE | tar -x -C DIR`: before / after in one run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def start_server(
    index_dir: Path,
    *,
    batching: bool,
    max_batch: int,
    max_wait_ms: float,
    max_delay_ms: float,
    threads: int,
    extra: tuple[str, ...] = (),
    checkout: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """`pvpo retriever serve` in its own process; `checkout`: serve that checkout's code instead
    (run from it: `python -m` puts the working directory first on sys.path)."""
    from pvpo.retriever.testing import start_server as serve

    flags = ["--max-batch-size", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
    flags += ["--max-delay-ms", str(max_delay_ms), "--threads", str(threads), *extra]
    flags += [] if batching else ["--no-batching"]
    env = {"PYTHONPATH": str(checkout)} if checkout else None
    proc, (url,) = serve(index_dir, extra=flags, env=env, cwd=checkout, stderr=subprocess.PIPE)
    return proc, url


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, elapsed) CPU seconds of the whole machine, all cores, from /proc/stat: their ratio
    over an interval is how many cores were busy, ours and every other job's."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(v[:8]) / os.sysconf("SC_CLK_TCK")
    return total - (v[3] + v[4]) / os.sysconf("SC_CLK_TCK"), total / (os.cpu_count() or 1)


# Search-R1's search_r1/search/retrieval_server.py is a script for one GPU: its __main__ moves the
# model with .cuda() and .half() and serves on 0.0.0.0:8000. On this CPU-only machine the bench
# runs the unmodified file with those calls made no-ops (float32 on CPU, as ours) and uvicorn bound
# to loopback on a free port; its retriever name "minilm" adds no query prefix (as ours for
# MiniLM), mean pooling and 256 tokens as ours. Its corpus is loaded with `datasets`, which the
# project does not depend on: --search-r1-pythonpath names where it is installed.
SEARCH_R1_SHIM = r"""
import runpy, sys, torch, uvicorn
path, index, corpus, model, port = sys.argv[1:6]
torch.nn.Module.cuda = lambda self, *a, **k: self
torch.nn.Module.half = lambda self, *a, **k: self
torch.Tensor.cuda = lambda self, *a, **k: self
serve = uvicorn.run
uvicorn.run = lambda app, **kw: serve(app, host="127.0.0.1", port=int(port), log_level="warning")
sys.argv = [path, "--index_path", index, "--corpus_path", corpus, "--topk", "3",
            "--retriever_name", "minilm", "--retriever_model", model]
runpy.run_path(path, run_name="__main__")
"""


def start_search_r1(
    server_file: Path, index_dir: Path, meta: dict[str, Any], pythonpath: str | None
) -> tuple[subprocess.Popen, str]:
    """Search-R1's own retrieval server over our index file and corpus, same model."""
    import httpx

    from pvpo.retriever.build import INDEX_FILE
    from pvpo.retriever.encoder import resolve_model_path
    from pvpo.retriever.testing import free_port

    port = free_port()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-c",
        SEARCH_R1_SHIM,
        str(server_file),
        str(index_dir / INDEX_FILE),
        str(index_dir / meta["corpus"]),
        resolve_model_path(meta["model"]),
        str(port),
    ]
    # its stderr to a file: it draws a tqdm bar per request, which would fill a pipe and block it.
    # (return_scores true below: without it its endpoint fails unpacking (results, scores))
    log = index_dir.parent / "search-r1.log"  # beside the index, replaced by each run
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Search-R1's server exited: {log.read_text()[-2000:]}")
        try:
            if (
                httpx.post(
                    url + "/retrieve", json={"queries": ["warm"], "topk": 3, "return_scores": True}, timeout=30
                ).status_code
                == 200
            ):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("Search-R1's server did not answer within 300 s")


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
    """The httpx generator in this process, with its own CPU time per request."""
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
    ap.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="another checkout of this project (e.g. the code before a change): also serve its code",
    )
    ap.add_argument(
        "--search-r1",
        type=Path,
        default=None,
        help="a local copy of Search-R1's search_r1/search/retrieval_server.py: also measure it",
    )
    ap.add_argument(
        "--search-r1-pythonpath",
        default=None,
        help="where the packages Search-R1's server needs and we do not (datasets) are installed",
    )
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

    # The machine is shared and noisy: each concurrency level measures in-process and every
    # server back to back in interleaved rounds, and each ratio uses figures taken side by side.

    levels = [int(x) for x in args.levels.split(",")]
    gen = wrk_load if args.generator == "wrk" else python_load
    gen_name = (
        "wrk (C, 1 thread, closed-loop connections)"
        if args.generator == "wrk"
        else "Python httpx asyncio in the bench process"
    )
    rows.append(("load generator", gen_name))
    rows.append(("torch threads (server and in-process); uvicorn loop / http", f"{threads}; {uvicorn_impl()}"))
    arms: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, batching in (("ours", True), ("unbatched", False)):
            arms[name] = start_server(
                index_dir,
                batching=batching,
                max_batch=args.max_batch_size,
                max_wait_ms=args.max_wait_ms,
                max_delay_ms=args.max_delay_ms,
                threads=threads,
            )
        if args.reference is not None:
            arms["reference"] = start_server(
                index_dir,
                batching=True,
                max_batch=args.max_batch_size,
                max_wait_ms=args.max_wait_ms,
                max_delay_ms=args.max_delay_ms,
                threads=threads,
                checkout=args.reference,
            )
        if args.search_r1 is not None:
            arms["search_r1"] = start_search_r1(args.search_r1, index_dir, meta, args.search_r1_pythonpath)
        for _, url in arms.values():
            gen(url, pool, 4, 1.0, warmup=1.0)
        table: list[dict[str, Any]] = []
        for c in levels:
            batch = min(c, args.max_batch_size)
            load_avg = os.getloadavg()[0]
            t_one = t_batch = 0.0
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
            for _ in range(args.rounds):
                t_one += 1 / in_process_throughput(retriever, pool, 1, args.duration / (2 * args.rounds))
                t_batch += 1 / in_process_throughput(retriever, pool, batch, args.duration / (2 * args.rounds))
                for name, (proc, url) in arms.items():
                    before = _batching_info(url, name)
                    cpu0, busy0, t0 = process_cpu(proc.pid), machine_busy(), time.perf_counter()
                    r = gen(url, pool, c, args.duration / args.rounds)  # its warm-up second included
                    cpu1, busy1, wall = process_cpu(proc.pid), machine_busy(), time.perf_counter() - t0
                    after = _batching_info(url, name)
                    r["queries"], r["batches"] = after[0] - before[0], after[1] - before[1]
                    r["server_cores"] = (cpu1 - cpu0) / wall
                    r["machine_cores"] = (busy1[0] - busy0[0]) / max(1e-9, busy1[1] - busy0[1])
                    runs[name].append(r)
            one, in_proc = args.rounds / t_one, args.rounds / t_batch  # mean cost per query, inverted
            m = {name: summarise(rs) for name, rs in runs.items()}
            table.append({"clients": c, "batch": batch, "load": load_avg, "one": one, "in_proc": in_proc, **m})
            rows.append((f"{c} clients: machine load (1-min average) before this level", f"{load_avg:.2f}"))
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
            for name, label in (
                ("ours", "cross-request batching"),
                ("unbatched", "no batching"),
                ("search_r1", "Search-R1 retrieval_server.py"),
            ):
                if name in m:
                    x = m[name]
                    rows.append(
                        (
                            f"{c} clients: served, {label}: q/s | p50 | p99 | errors | mean batch | server CPU | generator CPU | machine busy (cores)",
                            f"{x['qps']:.1f} q/s | {x['p50']:.0f} ms | {x['p99']:.0f} ms | {x['errors']} | {x['batch'] or '-':.3} "
                            f"| {x['server_cores']:.2f} | {x['gen_cores']:.3f} | {x['machine_cores']:.2f}",
                        )
                    )
            rows.append(
                (
                    f"{c} clients: served batched / in-process batch {batch}" + (" (target >= 0.9)" if c >= 8 else ""),
                    f"{m['ours']['qps'] / in_proc:.2f}",
                )
            )
            rows.append(
                (
                    f"{c} clients: served batched / served unbatched" + (" (target >= 2.5)" if c == 32 else ""),
                    f"{m['ours']['qps'] / m['unbatched']['qps']:.2f}" if m["unbatched"]["qps"] else "inf",
                )
            )
            if "reference" in m:
                rows.append(
                    (
                        f"{c} clients: ours / reference checkout",
                        f"{m['ours']['qps'] / max(1e-9, m['reference']['qps']):.2f}",
                    )
                )
            if "search_r1" in m:
                rows.append(
                    (
                        f"{c} clients: ours / Search-R1" + (" (target >= 3)" if c in (32, 64) else ""),
                        f"{m['ours']['qps'] / m['search_r1']['qps']:.2f}" if m["search_r1"]["qps"] else "inf",
                    )
                )
    finally:
        for proc, _ in arms.values():
            proc.terminate()
            proc.wait(timeout=30)
    retriever.close()

    width = max(len(r[0]) for r in rows)
    print(f"\n| {'measure'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    print_summary(table, args.search_r1 is not None)
    if args.reference is not None:
        print(
            f"\n| clients | reference {args.reference} q/s (p50 / p99 ms) | mean batch | ours q/s (p50 / p99 ms) | mean batch | ours / reference | in-process q/s |"
        )
        print("|---|---|---|---|---|---|---|")
        for t in table:
            r, o = t["reference"], t["ours"]
            print(
                f"| {t['clients']} | {r['qps']:.0f} ({r['p50']:.0f} / {r['p99']:.0f}) | {r['batch']:.1f} | {o['qps']:.0f} "
                f"({o['p50']:.0f} / {o['p99']:.0f}) | {o['batch']:.1f} | {o['qps'] / max(1e-9, r['qps']):.2f} | {t['in_proc']:.0f} |"
            )


def _batching_info(url: str, arm: str) -> tuple[int, int]:
    """(queries, batches) the server has searched; Search-R1's server has no /info: (0, 0)."""
    import httpx

    if arm == "search_r1":
        return 0, 0
    b = httpx.get(url + "/info").json()["batching"]
    return b["queries"], b["batches"]


def summarise(rs: list[dict[str, float]]) -> dict[str, float]:
    """Mean q/s and CPU shares over rounds, median p50 / p99, summed errors, mean batch."""
    return {
        "qps": float(np.mean([r["qps"] for r in rs])),
        "p50": float(np.median([r["p50"] for r in rs])),
        "p99": float(np.median([r["p99"] for r in rs])),
        "errors": int(sum(r["errors"] for r in rs)),
        "batch": sum(r["queries"] for r in rs) / max(1, sum(r["batches"] for r in rs)),
        "server_cores": float(np.mean([r["server_cores"] for r in rs])),
        "gen_cores": float(np.mean([r["gen_cores"] for r in rs])),
        "machine_cores": float(np.mean([r["machine_cores"] for r in rs])),
    }


def print_summary(table: list[dict[str, Any]], with_search_r1: bool) -> None:
    """The retriever throughput table of docs/benchmarks/retriever.md: one row per concurrency level."""
    head = (
        "| clients | in-process q/s (batch) | ours q/s (p50 / p99 ms) | ours / in-process | unbatched q/s "
        "| batched / unbatched (bound: in-process batch / batch 1) |"
    )
    sep = "|---|---|---|---|---|---|"
    if with_search_r1:
        head += " Search-R1 q/s (p50 / p99 ms) | ours / Search-R1 |"
        sep += "---|---|"
    head += " load avg | server / wrk / machine CPU (cores) |"
    sep += "---|---|"
    print(f"\n{head}\n{sep}")
    for t in table:
        o, u = t["ours"], t["unbatched"]
        line = (
            f"| {t['clients']} | {t['in_proc']:.0f} ({t['batch']}) | {o['qps']:.0f} ({o['p50']:.0f} / {o['p99']:.0f}) "
            f"| {o['qps'] / t['in_proc']:.2f} | {u['qps']:.0f} | {o['qps'] / max(1e-9, u['qps']):.2f} ({t['in_proc'] / t['one']:.2f}) |"
        )
        if with_search_r1:
            r = t["search_r1"]
            line += f" {r['qps']:.1f} ({r['p50']:.0f} / {r['p99']:.0f}) | {o['qps'] / max(1e-9, r['qps']):.2f} |"
        line += f" {t['load']:.2f} | {o['server_cores']:.2f} / {o['gen_cores']:.3f} / {o['machine_cores']:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
