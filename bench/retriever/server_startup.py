"""A retriever server's start-up at scale: seconds from spawning `pvpo retriever serve` to its
first /retrieve answer over an index of `--server-lines` passages built by our build code from
synthetic 384-d vectors (the packaged MiniLM's dimension), the wiki-18 recipe (IVF,SQ4 + exact
re-rank of 100 from an fp16 memory-mapped store) or exact Flat (memory-mapped), twice: first (the
corpus offsets built) and again (cached); the CPU seconds the server used by then, its own log of
the index + corpus open, and its RSS.

    .venv/bin/python bench/retriever/server_startup.py [--server-lines 1000000] [--server-index recipe|Flat]

`bench/retriever/index_scale.py` runs this as its server section. Prints the machine, the command and a
markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.retriever.synthetic_index import clustered_vectors, fp16_store_gib, nlist_for, run_alone, write_corpus

REPO = Path(__file__).resolve().parents[2]


def server_startup(index_dir: Path) -> dict[str, Any]:
    """Seconds from spawning `pvpo retriever serve` to its first /retrieve answer, the CPU seconds
    the server had used by then (which a busy machine does not inflate as it does the wall time),
    with the server's own log of the index + corpus open."""
    import httpx

    from bench.retriever.http_load import process_cpu
    from pvpo.retriever.testing import start_server, stop_server

    log_path = index_dir / "serve.log"
    t0 = time.perf_counter()
    proc, (url,) = start_server(index_dir, log_level="info", log=log_path, wait=False, cwd=REPO)
    try:
        first = cpu = None
        while time.perf_counter() - t0 < 600:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
            try:
                r = httpx.post(
                    url + "/retrieve",
                    json={"queries": ["who wrote Hamlet"], "topk": 5},
                    timeout=30,
                )
                if r.status_code == 200 and len(r.json()["result"][0]) == 5:
                    first = time.perf_counter() - t0
                    cpu = process_cpu(proc.pid)
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        rss = next(
            (
                int(line.split()[1]) / 1024
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                if line.startswith("RssAnon:")
            ),
            float("nan"),
        )
    finally:
        stop_server(proc)
    text = log_path.read_text()
    opened = next(
        (
            float(line.split(" opened in ")[1].split("s")[0])
            for line in text.splitlines()
            if "index + corpus opened in" in line
        ),
        float("nan"),
    )
    loaded = next(
        (float(line.rsplit(" in ", 1)[1].rstrip("s")) for line in text.splitlines() if "passages) in " in line),
        float("nan"),
    )
    return {
        "first_answer_s": first,
        "cpu_s": cpu,
        "index_corpus_open_s": opened,
        "load_retriever_s": loaded,
        "rss_anon_mb": rss,
    }


def server_section(args: argparse.Namespace) -> list[str]:
    """The start-up table over `args.server_lines` passages (the corpus file of the corpus section
    reused when it has that many lines)."""
    from pvpo.retriever.build import write_dense_index
    from pvpo.retriever.index import write_meta

    n = args.server_lines
    idx = args.work_dir / "server_idx"
    idx.mkdir(exist_ok=True)
    corpus = args.work_dir / "corpus.jsonl"
    if not corpus.exists() or sum(1 for _ in open(corpus, "rb")) != n:
        write_corpus(corpus, n, args.seed)
    dim = 384  # the packaged all-MiniLM-L6-v2 (no other encoder is on this machine)
    t0 = time.perf_counter()
    data, _ = clustered_vectors(n, dim, 1, args.seed)
    nlist = nlist_for(n)
    recipe = args.server_index == "recipe"
    meta = write_dense_index(
        idx,
        [data[i : i + 262144] for i in range(0, n, 262144)],
        index_type=f"IVF{nlist},SQ4" if recipe else "Flat",
        rerank_depth=100 if recipe else 0,
        search_params={"nprobe": 32},
        max_train=64 * nlist,
        seed=args.seed,
    )
    build_s = time.perf_counter() - t0
    del data
    write_meta(
        idx,
        meta
        | {
            "format": 1,
            "corpus": str(corpus),
            "size": n,
            "model": None,
            "query_prefix": "",
            "passage_prefix": "",
            "max_length": 256,
        },
    )
    (idx / "corpus.offsets.npy").unlink(missing_ok=True)
    cold = server_startup(idx)  # the first start also scans the corpus for its offsets
    warm = server_startup(idx)
    index_mb = (idx / meta["index_file"]).stat().st_size / 2**20
    kind = (
        f"IVF{nlist},SQ4 + rerank 100 ({index_mb:.0f} MB index file, its lists memory-mapped, fp16 store "
        f"{fp16_store_gib(n, dim):.2f} GiB mmap)"
        if recipe
        else f"Flat ({index_mb:.0f} MB index file, memory-mapped)"
    )
    lines = [
        "",
        f"## Server startup to first answer: {n:,} passages, {kind}, packaged MiniLM 384-d on CPU (index built "
        f"by write_dense_index from synthetic vectors in {build_s:.0f} s)",
        "",
        "| start | spawn -> first /retrieve answer (server CPU s) | load_retriever (index + corpus + encoder) | "
        "of which index + corpus | server RssAnon |",
        "|---|---|---|---|---|",
    ]
    for name, s in (("first (offsets built)", cold), ("again (offsets cached)", warm)):
        lines.append(
            f"| {name} | {s['first_answer_s']:.1f} s ({s['cpu_s']:.1f}) | {s['load_retriever_s']:.1f} s | "
            f"{s['index_corpus_open_s']:.1f} s | {s['rss_anon_mb']:.0f} MB |"
        )
    print("\n".join(lines), flush=True)
    for p in idx.iterdir():
        p.unlink()
    idx.rmdir()
    corpus.unlink(missing_ok=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-lines", type=int, default=1_000_000, help="passages of the index served")
    ap.add_argument(
        "--server-index",
        choices=["recipe", "Flat"],
        default="recipe",
        help="the wiki-18 recipe (IVF,SQ4 + rerank 100) or exact Flat (memory-mapped)",
    )
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "pvpo-index-scale")
    ap.add_argument("--seed", type=int, default=0)
    run_alone(server_section, ap.parse_args(), ("faiss-cpu", "numpy", "onnxruntime"))


if __name__ == "__main__":
    main()
