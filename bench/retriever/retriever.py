"""Served retrieval against Search-R1's own server, both in one run and nothing else measured:
`pvpo retriever serve` and Search-R1's search_r1/search/retrieval_server.py (a local copy, never
part of this repository) over the same FAISS Flat file, corpus and MiniLM (musique_mini, 1,890
passages), topk 3, single-query requests.

In order:

1. startup: each server spawned alone, twice (caches as found, then warm), seconds from the
   spawn to its first /retrieve answer, and the CPU seconds the server (with its ended child
   processes) had used by then, which a busy machine does not inflate as it does the wall time;
   ours finds its query encoder's export in the cache (the index build makes it);
2. agreement: every query of the pool (musique_mini's questions and the sub-questions that name
   no earlier answer), one request each, to both servers: top-k ids the same and in the same order;
3. throughput: q/s and p50 / p99 at 1, 8, 32 and 64 closed-loop clients (wrk when on PATH, see
   http_load.py), the two servers alternating in `--rounds` rounds per level (each round starts
   with the other one), each server's CPU and the machine's busy cores beside, since a ratio is
   only read within one run on a machine with other jobs, and the share of the machine's CPU time
   the hypervisor stole during each server's runs (ours runs a lone query on both cores); a level
   during a round of which other processes kept more than `http_load.BESIDE_LIMIT` cores busy (the
   machine's busy cores less the stolen ones, the server's and the load generator's) is named NOT
   QUIET under the table.

Then the table of docs/benchmarks/retriever.md: ours / Search-R1 at each level against the
targets (>= 3x at 1 client, >= 5x at 32 and 64), and ours at 32 clients against 8 in each round
(never below).

Search-R1's server is a script for one GPU: its __main__ moves the model with .cuda() and .half()
and serves on 0.0.0.0:8000. Here it runs unmodified with those calls made no-ops (float32 on CPU,
as ours; its torch keeps its own default threads) and uvicorn bound to loopback on a free port; its
retriever name "minilm" adds no query prefix (as ours for MiniLM), mean pooling and 256 tokens as
ours. Its file, at the commit the docs name: `git -C Search-R1 show
a14dc3a:search_r1/search/retrieval_server.py > retrieval_server.py`. It loads its corpus with
`datasets`; --search-r1-pythonpath names where that is installed if not in this interpreter.

    .venv/bin/python bench/retriever/retriever.py --search-r1 retrieval_server.py [--rounds 2] [--duration 8]
        [--levels 1,8,32,64] [--json results.json] [--serve-flag=--solo-threads=1 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.http_load import (  # noqa: E402
    BESIDE_LIMIT,
    DEFAULT_DATA,
    body,
    measured,
    musique_corpus,
    process_cpu,
    python_load,
    questions_and_queries,
    uvicorn_impl,
    wrk_load,
)
from pvpo.machine import machine_line, machine_record  # noqa: E402

PACKAGES = ("onnxruntime", "faiss-cpu", "torch", "transformers", "datasets", "fastapi", "uvicorn")
TARGETS = {1: 3.0, 32: 5.0, 64: 5.0}  # ours / Search-R1 at these client counts

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


def spawn_ours(index_dir: Path, log: Path, flags: list[str]) -> tuple[subprocess.Popen, str]:
    """`pvpo retriever serve` with its defaults and `flags`, not waited for."""
    from pvpo.retriever.testing import start_server

    proc, (url,) = start_server(index_dir, log=log, wait=False, extra=flags)
    return proc, url


def spawn_search_r1(
    server_file: Path, index_dir: Path, meta: dict[str, Any], pythonpath: str | None, log: Path
) -> tuple[subprocess.Popen, str]:
    """Search-R1's own retrieval server over our index file and corpus, same model, not waited for."""
    from pvpo.retriever.build import INDEX_FILE
    from pvpo.retriever.encoder import resolve_model_path
    from pvpo.retriever.testing import free_port

    port = free_port()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    model = resolve_model_path(meta["model"])
    args = [str(server_file), str(index_dir / INDEX_FILE), str(index_dir / meta["corpus"]), model, str(port)]
    # its stderr to a file: it draws a tqdm bar per request, which would fill a pipe and block it
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SEARCH_R1_SHIM, *args], stdout=subprocess.DEVNULL, stderr=err, env=env
        )
    return proc, f"http://127.0.0.1:{port}"


def first_answer(proc: subprocess.Popen, url: str, log: Path, t0: float, timeout: float = 600) -> tuple[float, float]:
    """(seconds from `t0`, the spawn, to the server's first 200 on /retrieve; CPU seconds the
    server had used by then)."""
    import httpx

    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.post(url + "/retrieve", json=body("who wrote Hamlet"), timeout=60).status_code == 200:
                return time.perf_counter() - t0, process_cpu(proc.pid, children=True)
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"{url}: no answer within {timeout:.0f} s")


def started(spawn: Any, log: Path, times: int) -> tuple[subprocess.Popen, str, list[tuple[float, float]]]:
    """Spawns a server `times` times in a row, each timed to its first answer (wall and CPU
    seconds); the last one is kept running."""
    took: list[tuple[float, float]] = []
    for i in range(times):
        t0 = time.perf_counter()
        proc, url = spawn(log)
        took.append(first_answer(proc, url, log, t0))
        if i < times - 1:
            stop(proc)
    return proc, url, took


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def top_ids(url: str, pool: list[str]) -> list[list[str]]:
    """Each query's top-3 document ids, one request a query."""
    import httpx

    with httpx.Client(timeout=60) as client:
        out = []
        for q in pool:
            r = client.post(url + "/retrieve", json=body(q))
            r.raise_for_status()
            out.append([str(item["document"]["id"]) for item in r.json()["result"][0]])
    return out


def batch_counters(url: str) -> tuple[int, int] | None:
    """(batches, queries) our server has searched so far, from `/info`; None for a server without
    them (Search-R1's)."""
    import httpx

    try:
        batching = httpx.get(url + "/info", timeout=30).json()["batching"]
        return int(batching["batches"]), int(batching["queries"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def mean_batch(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Queries a batch between two `batch_counters` readings; None where either is missing."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def summarise(rs: list[dict[str, float]]) -> dict[str, float]:
    """Mean q/s and CPU shares over rounds, median p50 / p99, summed errors."""
    return {
        "qps": float(np.mean([r["qps"] for r in rs])),
        "p50": float(np.median([r["p50"] for r in rs])),
        "p99": float(np.median([r["p99"] for r in rs])),
        "errors": int(sum(r["errors"] for r in rs)),
        "server_cores": float(np.mean([r["server_cores"] for r in rs])),
        "gen_cores": float(np.mean([r["gen_cores"] for r in rs])),
        "machine_cores": float(np.mean([r["machine_cores"] for r in rs])),
        "stolen": float(np.mean([r.get("stolen", float("nan")) for r in rs])),
        "beside_cores": float(max((r.get("beside_cores", float("nan")) for r in rs), default=float("nan"))),
    }


def not_quiet(levels: list[dict[str, Any]]) -> list[str]:
    """The levels and servers with a round during which other processes kept more than
    `BESIDE_LIMIT` cores busy (`http_load.cores_beside`), e.g. "1 client, Search-R1 (0.94 cores)":
    their q/s, and the ratio of that level, are not a quiet measurement."""
    out = []
    for lv in levels:
        for key, name in (("ours", "ours"), ("search_r1", "Search-R1")):
            beside = max((r.get("beside_cores", float("nan")) for r in lv["rounds"][key]), default=float("nan"))
            if beside > BESIDE_LIMIT:
                out.append(f"{lv['clients']} client{'s' if lv['clients'] != 1 else ''}, {name} ({beside:.2f} cores)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--search-r1", type=Path, required=True, help="a local copy of Search-R1's retrieval_server.py")
    ap.add_argument("--search-r1-pythonpath", default=None, help="where `datasets` is installed, if not here")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pvpo" / "bench-retriever")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per level and server, all rounds")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--startups", type=int, default=2, help="starts of each server timed (the last one serves)")
    ap.add_argument("--generator", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        help="a flag for our server beyond its defaults, e.g. --serve-flag=--solo-threads=1 (repeatable)",
    )
    args = ap.parse_args()
    corpus_file = musique_corpus(args.data, "bench/retriever/retriever.py")
    if not args.search_r1.is_file():
        sys.exit(f"--search-r1 {args.search_r1}: no such file (see this script's docstring for how to get it)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pvpo.retriever.build import build_index
    from pvpo.retriever.index import read_meta

    record = machine_record(PACKAGES)
    print(f"machine: {machine_line(PACKAGES, record)}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    index_dir = build_index(corpus_file, args.work_dir / "musique_mini_Flat", index_type="Flat", show_progress=False)
    meta = read_meta(index_dir)
    _, pool = questions_and_queries(args.data)
    gen = wrk_load if args.generator == "wrk" else python_load
    logs = {"ours": args.work_dir / "ours.log", "search_r1": args.work_dir / "search-r1.log"}
    spawn = {
        "ours": lambda log: spawn_ours(index_dir, log, args.serve_flag),
        "search_r1": lambda log: spawn_search_r1(args.search_r1, index_dir, meta, args.search_r1_pythonpath, log),
    }
    arms: dict[str, tuple[subprocess.Popen, str]] = {}
    out: dict[str, Any] = {"machine": record, "command": sys.argv, "startup_s": {}, "levels": []}
    try:
        for name in ("ours", "search_r1"):
            load = os.getloadavg()[0]
            proc, url, took = started(spawn[name], logs[name], args.startups)
            arms[name] = (proc, url)
            out["startup_s"][name] = {"starts": took, "load_before": load}
            shown = ", ".join(f"{wall:.2f} s ({cpu:.2f} CPU s)" for wall, cpu in took)
            print(f"startup {name}: {shown} (load {load:.2f})", flush=True)
        ids = {name: top_ids(url, pool) for name, (_, url) in arms.items()}
        same = sum(a == b for a, b in zip(ids["ours"], ids["search_r1"]))
        same_set = sum(set(a) == set(b) for a, b in zip(ids["ours"], ids["search_r1"]))
        differ = [(q, a, b) for q, a, b in zip(pool, ids["ours"], ids["search_r1"]) if a != b]
        out["agreement"] = {"queries": len(pool), "same_order": same, "same_set": same_set, "differ": differ[:10]}
        print(f"top-3 ids: {same}/{len(pool)} the same in order, {same_set}/{len(pool)} as sets", flush=True)
        for q, a, b in differ[:3]:
            print(f"  differs: {q!r}: ours {a}, Search-R1 {b}")
        for _, url in arms.values():  # both warm before the first level
            gen(url, pool, 4, 1.0)
        order = ["ours", "search_r1"]
        for clients in (int(x) for x in args.levels.split(",")):
            load = os.getloadavg()[0]
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else order[::-1]:
                    proc, url = arms[name]
                    before = batch_counters(url) if name == "ours" else None
                    run = measured(gen, proc.pid, url, pool, clients, args.duration / args.rounds)
                    run["mean_batch"] = mean_batch(before, batch_counters(url) if before else None)
                    runs[name].append(run)
            level = {"clients": clients, "load_before": load, "rounds": runs} | {
                name: summarise(rs) for name, rs in runs.items()
            }
            out["levels"].append(level)
            o, s = level["ours"], level["search_r1"]
            print(
                f"{clients} clients (load {load:.2f}): ours {o['qps']:.1f} q/s ({o['p50']:.0f} / {o['p99']:.0f} ms, "
                f"{o['errors']} errors, {o['server_cores']:.2f} cores), Search-R1 {s['qps']:.1f} q/s "
                f"({s['p50']:.0f} / {s['p99']:.0f} ms, {s['errors']} errors, {s['server_cores']:.2f} cores): "
                f"{o['qps'] / max(1e-9, s['qps']):.2f}x",
                flush=True,
            )
    finally:
        for proc, _ in arms.values():
            stop(proc)
    print_tables(out, args.generator)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


def print_tables(out: dict[str, Any], generator: str) -> None:
    """The throughput table, the 8 -> 32 rule, startup and agreement, as docs/benchmarks/retriever.md has them."""
    print(
        f"\nload generator: {generator}; uvicorn loop / http: {uvicorn_impl()}\n"
        "\n| clients | ours q/s (p50 / p99 ms) | Search-R1 q/s (p50 / p99 ms) | ours / Search-R1 | target | "
        "load avg | ours / Search-R1 / machine cores | CPU stolen, ours / Search-R1 runs |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for lv in out["levels"]:
        o, s, c = lv["ours"], lv["search_r1"], lv["clients"]
        ratio = o["qps"] / max(1e-9, s["qps"])
        target = f">= {TARGETS[c]:g}x: {'met' if ratio >= TARGETS[c] else 'missed'}" if c in TARGETS else "-"
        print(
            f"| {c} | {o['qps']:.0f} ({o['p50']:.0f} / {o['p99']:.0f}) | {s['qps']:.1f} ({s['p50']:.0f} / "
            f"{s['p99']:.0f}) | {ratio:.2f} | {target} | {lv['load_before']:.2f} | {o['server_cores']:.2f} / "
            f"{s['server_cores']:.2f} / {(o['machine_cores'] + s['machine_cores']) / 2:.2f} | "
            f"{o.get('stolen', float('nan')):.1%} / {s.get('stolen', float('nan')):.1%} |"
        )
    noisy = not_quiet(out["levels"])
    if noisy:
        print(
            f"\nNOT QUIET: other processes kept more than {BESIDE_LIMIT} cores busy in a round of: "
            + "; ".join(noisy)
            + ": those levels' figures are not a measurement"
        )
    elif any("beside_cores" in r for lv in out["levels"] for rs in lv["rounds"].values() for r in rs):
        print(
            f"\nquiet: in no round did other processes keep more than {BESIDE_LIMIT} cores busy "
            "(the machine's busy cores less the stolen ones, the server's and wrk's)"
        )
    by = {lv["clients"]: lv for lv in out["levels"]}
    if 8 in by and 32 in by:
        rounds = list(zip(by[8]["rounds"]["ours"], by[32]["rounds"]["ours"]))
        held = all(b["qps"] >= a["qps"] for a, b in rounds)

        def batch(r: dict[str, Any]) -> str:
            return f" (batch {r['mean_batch']:.1f})" if r.get("mean_batch") else ""

        print(
            "\nours, q/s at 8 -> 32 clients by round (mean queries a batch, warm-up included): "
            + ", ".join(f"{a['qps']:.0f}{batch(a)} -> {b['qps']:.0f}{batch(b)}" for a, b in rounds)
            + f" ({'never below' if held else 'BELOW in a round'})"
        )
    st = out["startup_s"]

    def starts(name: str) -> str:
        return ", ".join(f"{wall:.2f} s ({cpu:.2f} CPU s)" for wall, cpu in st[name]["starts"])

    print(
        "\nstartup to the first answer (each start: caches as found, then warm; the server's CPU seconds): "
        f"ours {starts('ours')}; Search-R1 {starts('search_r1')}"
    )
    a = out["agreement"]
    print(
        f"top-3 ids, one request a query: {a['same_order']}/{a['queries']} the same in order, {a['same_set']} as sets"
    )


if __name__ == "__main__":
    main()
