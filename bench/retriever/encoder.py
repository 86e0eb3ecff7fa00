"""Encoder backends on CPU: torch vs ONNX Runtime (fp32, int8) vs OpenVINO, for the packaged
all-MiniLM-L6-v2, measured in one run with the arms interleaved (the machine is shared):

- passages/s encoding the musique_mini + hotpotqa_mini corpora (2,884 passages, batch 32), i.e.
  index build speed; recall@5 of the supporting passages with each backend's own vectors
  (FAISS Flat), which is what decides whether a backend may replace torch;
- in-process queries/s at batch 32 (what the server coalesces at 32 clients);
- in-process CPU milliseconds a query on one thread at batch 1 (a lone query) and batch 32:
  process CPU time, not wall time, so the figure holds on a machine shared with other jobs;
- served queries/s and p50 / p99 at 32 concurrent single-query clients (`pvpo retriever serve
  --encoder-backend X` in its own process, Python httpx load generator in this process).

Prints one markdown table; the issue's bar for a new default: recall@5 within 0.005 of torch
and served q/s at 32 clients >= 1.5x torch's.

    .venv/bin/python bench/retriever/encoder.py [--backends torch,onnx,onnx-int8,openvino] [--duration 24]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.http_load import python_load, questions_and_queries, start_server  # noqa: E402
from bench.retriever.retrieval_quality import DATASETS, DEFAULT_DATA, gold_sets  # noqa: E402
from pvpo.machine import machine_line  # noqa: E402


def recall_with(
    encoder, passages: list[str], ids: list[str], questions: list[str], gold: list[set[str]], k: int
) -> tuple[float, float]:
    """(recall@k, passages/s) of an encoder: encodes the passages, searches a Flat index."""
    import faiss

    t0 = time.perf_counter()
    vectors = encoder.encode_passages(passages, batch_size=32)
    rate = len(passages) / (time.perf_counter() - t0)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    _, rows = index.search(encoder.encode_queries(questions), k)
    got = [{ids[r] for r in row} for row in rows]
    return float(np.mean([len(g & r) / len(g) for g, r in zip(gold, got)])), rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pvpo" / "bench-encoder")
    ap.add_argument("--backends", default="torch,onnx,onnx-int8,openvino")
    ap.add_argument("--duration", type=float, default=24.0, help="served seconds per backend, over all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch / runtime threads (default: cores-1)")
    ap.add_argument("--skip-served", action="store_true")
    ap.add_argument("--index", type=Path, default=None, help="index dir to serve (default: build musique_mini Flat)")
    args = ap.parse_args()
    if not (args.data / DATASETS[0]).exists():
        sys.exit(
            f"bench/retriever/encoder.py needs the samples under {args.data} (../shared/data beside the checkout, or "
            "set PVPO_SHARED_DATA); they are not on this machine."
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PVPO_CACHE_DIR", str(args.work_dir / "cache"))
    from pvpo.retriever.build import build_index
    from pvpo.retriever.corpus import iter_corpus
    from pvpo.retriever.encoder import Encoder
    from pvpo.retriever.server import set_torch_threads
    from pvpo.retriever.thread_budget import set_thread_budget

    threads = set_torch_threads(args.threads)
    set_thread_budget(threads)  # the runtimes compute with torch's count here
    backends = args.backends.split(",")
    print(f"machine: {machine_line(('torch', 'sentence-transformers', 'onnxruntime', 'openvino'))}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)
    samples = {}
    for name in DATASETS:
        corpus, questions, gold = gold_sets(args.data, name)
        ids, passages = zip(*iter_corpus(corpus))
        samples[name] = (list(passages), list(ids), questions, gold)
    _, pool = questions_and_queries(args.data)

    res: dict[str, dict[str, float]] = {b: {} for b in backends}
    encoders = {}
    for b in backends:
        t0 = time.perf_counter()
        encoders[b] = Encoder(device="cpu", backend=b)
        res[b]["load_s"] = time.perf_counter() - t0  # includes the one-time export when not cached
    load_avg = [os.getloadavg()[0]]
    # Quality and build speed, arms interleaved per sample.
    for name, (passages, ids, questions, gold) in samples.items():
        for b in backends:
            r, rate = recall_with(encoders[b], passages, ids, questions, gold, 5)
            res[b][f"recall_{name}"] = r
            print(f"{name} {b}: recall@5 {r:.3f}, {rate:.1f} passages/s", flush=True)
            res[b].setdefault("psg_s", []).append(rate)  # type: ignore[union-attr]
    # In-process query encoding at the server's batch at this concurrency.
    for _ in range(args.rounds):
        for b in backends:
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < 2.0:
                encoders[b].encode_queries([pool[(n + j) % len(pool)] for j in range(args.clients)])
                n += args.clients
            res[b].setdefault("inproc", []).append(n / (time.perf_counter() - t0))  # type: ignore[union-attr]
    # CPU a query on one thread: batch 1 (a lone query) and the server's batch at this concurrency.
    set_torch_threads(1)
    set_thread_budget(1)
    for _ in range(args.rounds):
        for b in backends:
            for batch in (1, args.clients):
                c0, n = time.process_time(), 0
                while n < 4 * args.clients:
                    encoders[b].encode_queries([pool[(n + j) % len(pool)] for j in range(batch)])
                    n += batch
                res[b].setdefault(f"cpu_ms_b{batch}", []).append((time.process_time() - c0) / n * 1000)  # type: ignore[union-attr]
    set_torch_threads(threads)
    set_thread_budget(threads)
    del encoders
    load_avg.append(os.getloadavg()[0])

    if not args.skip_served:
        index_dir = args.index or build_index(
            args.data / "musique_mini" / "corpus.json", args.work_dir / "musique_mini_Flat", show_progress=False
        )
        more = ("--threads", str(args.threads)) if args.threads else ()
        servers = {b: start_server(index_dir, extra=("--encoder-backend", b, *more)) for b in backends}
        try:
            for _, url in servers.values():
                python_load(url, pool, 4, 1.0, warmup=1.0)
            for _ in range(args.rounds):
                for b, (_, url) in servers.items():
                    m = python_load(url, pool, args.clients, args.duration / args.rounds)
                    for key in ("qps", "p50", "p99", "errors"):
                        res[b].setdefault(key, []).append(m[key])  # type: ignore[union-attr]
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
        load_avg.append(os.getloadavg()[0])

    base = res[backends[0]]
    print(
        f"\nthreads {threads}; 1-min load average at start / after encoding / after serving: "
        + " / ".join(f"{x:.2f}" for x in load_avg)
    )
    head = [
        "backend",
        "load s (export if uncached)",
        "passages/s (x first)",
        *[f"recall@5 {d}" for d in DATASETS],
        f"in-process q/s batch {args.clients} (x first)",
        "CPU ms a query, 1 thread, batch 1",
        f"CPU ms a query, 1 thread, batch {args.clients}",
    ]
    if not args.skip_served:
        head += [f"served q/s {args.clients} clients (x first)", "p50 ms", "p99 ms", "errors"]
    print("| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|")
    for b in backends:
        r = res[b]
        psg, inproc = float(np.mean(r["psg_s"])), float(np.mean(r["inproc"]))
        cells = [
            b,
            f"{r['load_s']:.1f}",
            f"{psg:.0f} ({psg / np.mean(base['psg_s']):.2f}x)",
            *[f"{r[f'recall_{d}']:.3f}" for d in DATASETS],
            f"{inproc:.0f} ({inproc / np.mean(base['inproc']):.2f}x)",
            f"{np.median(r['cpu_ms_b1']):.2f}",
            f"{np.median(r[f'cpu_ms_b{args.clients}']):.2f}",
        ]
        if not args.skip_served:
            qps = float(np.mean(r["qps"]))
            cells += [
                f"{qps:.0f} ({qps / np.mean(base['qps']):.2f}x)",
                f"{np.median(r['p50']):.0f}",
                f"{np.median(r['p99']):.0f}",
                f"{int(sum(r['errors']))}",
            ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
