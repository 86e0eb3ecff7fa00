"""Served throughput with 1 vs K replicas (`pvpo retriever serve --replicas K`), through the
package's own AsyncRetrieverClient and its per-request round-robin over the replica URLs.
32 closed-loop single-query clients (asyncio tasks in this process), musique_mini queries, the
two deployments up side by side and measured in interleaved rounds. Each replica gets
`--threads` torch threads (default: cores-1 shared out, so 1 each on 2 cores), the single server
cores-1. On a machine with fewer free cores than replicas the gain is bounded by the cores, and
the generator's own CPU time is taken from the servers: the table gives the load average.

    .venv/bin/python bench/retriever/replicas.py --index DIR [--replicas 2] [--clients 32] [--duration 24]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.http_load import questions_and_queries  # noqa: E402
from bench.retriever.retrieval_quality import DEFAULT_DATA  # noqa: E402
from pvpo.machine import machine_line  # noqa: E402


def serve(index: Path, replicas: int, extra: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """`pvpo retriever serve --replicas K` (K=1: one plain server); returns it once all answer."""
    from pvpo.retriever.testing import start_server

    return start_server(index, replicas=replicas, extra=extra, timeout=300, text=True)


async def client_load(urls: list[str], pool: list[str], clients: int, seconds: float) -> dict[str, float]:
    """`clients` closed loops of one-query searches through one AsyncRetrieverClient (round-robin
    over `urls`) for `seconds` after a 1 s warm-up; q/s and p50 / p99 ms of what completed."""
    from pvpo.retriever.client import AsyncRetrieverClient

    lat: list[float] = []
    t_measure = time.perf_counter() + 1.0
    t_end = t_measure + seconds
    counter = iter(range(10**9))
    async with AsyncRetrieverClient(urls, topk=3, retries=0, max_connections=clients) as client:

        async def one() -> None:
            while (t0 := time.perf_counter()) < t_end:
                await client.search([pool[next(counter) % len(pool)]])
                if t_measure <= (t1 := time.perf_counter()) <= t_end:
                    lat.append(t1 - t0)

        await asyncio.gather(*[one() for _ in range(clients)])
    ms = np.array(lat) * 1000
    return {"qps": len(lat) / seconds, "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=24.0, help="seconds per arm, over all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--encoder-backend", default=None)
    args = ap.parse_args()
    if not (args.data / "musique_mini").exists():
        sys.exit(f"bench/retriever/replicas.py needs musique_mini under {args.data} (or set PVPO_SHARED_DATA)")
    _, pool = questions_and_queries(args.data)
    extra = ["--encoder-backend", args.encoder_backend] if args.encoder_backend else []
    print(f"machine: {machine_line(('torch', 'onnxruntime', 'faiss-cpu'))}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    arms = {k: serve(args.index, k, extra) for k in (1, args.replicas)}
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in arms}
    load = [os.getloadavg()[0]]
    try:
        for _ in range(args.rounds):
            for k, (_, urls) in arms.items():
                runs[k].append(asyncio.run(client_load(urls, pool, args.clients, args.duration / args.rounds)))
        load.append(os.getloadavg()[0])
    finally:
        for proc, _ in arms.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    one = float(np.mean([r["qps"] for r in runs[1]]))
    print(f"\n{os.cpu_count()} cores; 1-min load average before / after: {load[0]:.2f} / {load[-1]:.2f}")
    print(f"| replicas | served q/s, {args.clients} clients (x 1 replica) | p50 ms | p99 ms |\n|---|---|---|---|")
    for k, rs in runs.items():
        qps = float(np.mean([r["qps"] for r in rs]))
        print(
            f"| {k} | {qps:.1f} ({qps / one:.2f}x) | {np.median([r['p50'] for r in rs]):.0f} "
            f"| {np.median([r['p99'] for r in rs]):.0f} |"
        )


if __name__ == "__main__":
    main()
