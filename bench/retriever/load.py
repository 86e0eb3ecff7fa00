"""Load test of the retriever server as deployed (`pvpo retriever serve` in its own process, on
loopback): many small clients alone, then the same small clients while a few clients send large
requests. Prints one markdown table: requests and queries per second, p50 / p99 latency of the
small requests, errors, large requests completed, and the server's RSS before and after.

The load comes from closed-loop asyncio clients in this process, one keep-alive connection each,
speaking HTTP/1.1 directly (no client library in the way); the table gives their CPU time, which
on a 2-core machine is taken from the server. All traffic goes to 127.0.0.1 and stops after
`--seconds` per phase.

    .venv/bin/python bench/retriever/load.py [--clients 256] [--seconds 30] [--index DIR]
        [--large-clients 2] [--large-queries 32] [--large-chars 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


SMALL_QUERIES = [
    "who wrote Hamlet",
    "capital of Japan",
    "largest planet in the solar system",
    "who discovered penicillin",
    "highest mountain on Earth",
    "who painted the Mona Lisa",
    "how do plants make sugar",
    "what is DNA",
    "where do penguins live",
    "when did Apollo 11 land on the Moon",
    "who created Python",
    "what is a volcano",
]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    queries: int = 0
    errors: int = 0


def _request(body: bytes) -> bytes:
    return (
        b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


async def _response(reader: asyncio.StreamReader) -> int:
    """Reads one HTTP/1.1 response; returns its status."""
    status = int((await reader.readuntil(b"\r\n")).split()[1])
    length = 0
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def closed_loop_client(
    port: int, bodies: list[tuple[bytes, int]], stop_at: float, tally: Tally, timeout: float
) -> None:
    """One connection, one request at a time until `stop_at`; counts what completes in time."""
    rng = random.Random(id(tally) ^ port)
    reader = writer = None
    try:
        while time.monotonic() < stop_at:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body, n = bodies[rng.randrange(len(bodies))]
            t0 = time.perf_counter()
            try:
                writer.write(_request(body))
                status = await asyncio.wait_for(_response(reader), min(timeout, max(0.01, stop_at - time.monotonic())))
            except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                if time.monotonic() < stop_at:
                    tally.errors += 1
                writer.close()
                reader = writer = None
                continue
            if status != 200:
                tally.errors += 1
                continue
            tally.latencies.append(time.perf_counter() - t0)
            tally.queries += n
    finally:
        if writer is not None:
            writer.close()  # an unfinished large request: the server drops its remaining work


async def _phase(
    port: int,
    clients: int,
    seconds: float,
    large_clients: int,
    large_body: tuple[bytes, int] | None,
    small: list[tuple[bytes, int]],
) -> tuple[Tally, Tally]:
    stop_at = time.monotonic() + seconds
    small_t, large_t = Tally(), Tally()
    tasks = [closed_loop_client(port, small, stop_at, small_t, 30.0) for _ in range(clients)]
    if large_body is not None:
        tasks += [closed_loop_client(port, [large_body], stop_at, large_t, 600.0) for _ in range(large_clients)]
    await asyncio.gather(*tasks)
    return small_t, large_t


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve_index(index: Path, port: int, log: Path) -> subprocess.Popen:
    """`pvpo retriever serve` on `port`, its output in `log`, once it answers /health."""
    from pvpo.retriever.testing import start_server

    return start_server(index, port=port, log=log, timeout=120)[0]


def _row(name: str, seconds: float, small: Tally, large: Tally, cpu_s: float) -> str:
    lat = np.array(small.latencies) * 1000 if small.latencies else np.array([float("nan")])
    reqs = len(small.latencies) + len(large.latencies)
    return (
        f"| {name} | {reqs / seconds:.0f} | {(small.queries + large.queries) / seconds:.0f} | "
        f"{np.percentile(lat, 50):.0f} | {np.percentile(lat, 99):.0f} | {lat.max():.0f} | "
        f"{small.errors + large.errors} | {len(large.latencies)} | {cpu_s / max(reqs, 1) * 1000:.2f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=256, help="small-request clients (one query per request)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    ap.add_argument("--index", type=Path, help="index directory (default: the tiny test index, built in a temp dir)")
    ap.add_argument("--large-clients", type=int, default=2)
    ap.add_argument("--large-queries", type=int, default=32, help="queries per large request")
    ap.add_argument("--large-chars", type=int, default=2048, help="characters per query of a large request")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.clients + 256)), hard))

    with tempfile.TemporaryDirectory() as tmp:
        from pvpo.retriever.testing import build_tiny_index, free_port

        index = args.index
        if index is None:
            index = build_tiny_index(Path(tmp) / "tiny")
        port = free_port()
        server = serve_index(index, port, Path(tmp) / "server.log")
        try:
            rng = random.Random(0)
            small = [(json.dumps({"queries": [q], "topk": 3}).encode(), 1) for q in SMALL_QUERIES]
            words = " ".join(SMALL_QUERIES).split()
            big = [
                " ".join(rng.choice(words) for _ in range(args.large_chars))[: args.large_chars]
                for _ in range(args.large_queries)
            ]
            large = (json.dumps({"queries": big, "topk": 3}).encode(), args.large_queries)
            asyncio.run(_phase(port, 8, 2.0, 0, None, small))  # warm up the encoder
            rss0 = rss_mb(server.pid)
            rows = []
            for name, n_large in (("small only", 0), (f"small + {args.large_clients} large", args.large_clients)):
                cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
                small_lat, large_lat = asyncio.run(
                    _phase(port, args.clients, args.seconds, n_large, large if n_large else None, small)
                )
                rows.append(
                    _row(
                        name,
                        args.seconds,
                        small_lat,
                        large_lat,
                        sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0,
                    )
                )
                time.sleep(1.0)
            info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=30).json()["batching"]
            rss1 = rss_mb(server.pid)
            errors = [line for line in (Path(tmp) / "server.log").read_text().splitlines() if "Error" in line]
        finally:
            server.terminate()
            server.wait(timeout=30)
    from pvpo.machine import machine_line

    print(f"\nmachine: {machine_line(('onnxruntime', 'faiss-cpu', 'fastapi', 'uvicorn'))}")
    print(
        f"\n{args.clients} small clients (1 query each), {args.seconds:g} s per phase; large requests: "
        f"{args.large_queries} queries x {args.large_chars} chars; server {index} on {os.cpu_count()} cores\n"
    )
    print(
        "| phase | req/s | queries/s | small p50 ms | small p99 ms | small max ms | errors | large done | generator CPU ms/req |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(
        f"\nserver RSS {rss0:.0f} MB before, {rss1:.0f} MB after; batches {info['batches']}, queries searched "
        f"{info['queries']}, dropped (client gone) {info['dropped']}, pending at the end {info['pending']}; "
        f"error lines in the server log: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:5])
    )


if __name__ == "__main__":
    main()
