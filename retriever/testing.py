"""A tiny real corpus (one fact per passage) and its index, built once per directory, for the
tests and demos of any component that needs a retriever on loopback; free ports, and the one way a
test or bench starts `pvpo retriever serve` in a process of its own and waits for its health."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TINY_CORPUS: list[dict[str, str]] = [
    {"title": "Paris", "text": "Paris is the capital and most populous city of France, on the Seine."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany and its largest city."},
    {"title": "Tokyo", "text": "Tokyo is the capital of Japan and the seat of the Japanese government."},
    {
        "title": "Python (programming language)",
        "text": "Python is a programming language created by Guido van Rossum and first released in 1991.",
    },
    {"title": "Cat", "text": "The cat is a small domesticated carnivorous mammal kept as a pet."},
    {"title": "Mount Everest", "text": "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."},
    {
        "title": "Photosynthesis",
        "text": "Photosynthesis is the process by which plants use sunlight, water and carbon dioxide to make sugar.",
    },
    {"title": "Albert Einstein", "text": "Albert Einstein was a physicist who developed the theory of relativity."},
    {"title": "Amazon River", "text": "The Amazon River in South America is the largest river by discharge of water."},
    {"title": "Moon", "text": "The Moon is Earth's only natural satellite; Apollo 11 landed astronauts on it in 1969."},
    {"title": "Violin", "text": "The violin is a wooden string instrument played with a bow."},
    {"title": "Chess", "text": "Chess is a board game for two players with sixteen pieces each on a checkered board."},
    {"title": "Honey bee", "text": "Honey bees are insects that collect nectar and produce honey and beeswax."},
    {
        "title": "Great Wall of China",
        "text": "The Great Wall of China is a series of fortifications built across northern China.",
    },
    {"title": "Penicillin", "text": "Penicillin is an antibiotic discovered by Alexander Fleming in 1928."},
    {"title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System, a gas giant."},
    {"title": "Coffee", "text": "Coffee is a drink brewed from roasted coffee beans, rich in caffeine."},
    {"title": "Leonardo da Vinci", "text": "Leonardo da Vinci was an Italian painter who painted the Mona Lisa."},
    {"title": "Volcano", "text": "A volcano is a rupture in the crust where lava, ash and gases escape."},
    {"title": "Bicycle", "text": "A bicycle is a pedal-driven vehicle with two wheels attached to a frame."},
    {
        "title": "Penguin",
        "text": "Penguins are flightless seabirds that live mostly in the Southern Hemisphere, such as Antarctica.",
    },
    {
        "title": "Olympic Games",
        "text": "The Olympic Games are an international sports competition held every four years.",
    },
    {
        "title": "DNA",
        "text": "DNA is the molecule that carries the genetic instructions of living organisms in a double helix.",
    },
    {
        "title": "Shakespeare",
        "text": "William Shakespeare was an English playwright who wrote Hamlet and Romeo and Juliet.",
    },
]

# (query, title of the passage that answers it)
TINY_QUERIES: list[tuple[str, str]] = [
    ("What is the capital of Germany?", "Berlin"),
    ("Who created the Python programming language?", "Python (programming language)"),
    ("highest mountain on Earth", "Mount Everest"),
    ("Who discovered penicillin?", "Penicillin"),
    ("largest planet in the solar system", "Jupiter"),
    ("who painted the Mona Lisa", "Leonardo da Vinci"),
    ("how do plants make sugar from sunlight", "Photosynthesis"),
    ("who wrote Hamlet", "Shakespeare"),
]


def write_tiny_corpus(path: str | Path) -> Path:
    """Writes TINY_CORPUS as a JSON list of {title, text} (kept as is if already there, so a
    resumed build sees the same source)."""
    path = Path(path)
    text = json.dumps(TINY_CORPUS, ensure_ascii=False)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def build_tiny_index(base_dir: str | Path, *, index_type: str = "Flat") -> Path:
    """The tiny corpus's index under base_dir (encoded once; later calls reuse the embeddings)."""
    from pvpo.retriever.build import build_index

    base = Path(base_dir)
    corpus = write_tiny_corpus(base / "tiny_corpus.json")
    name = "tiny_" + "".join(c if c.isalnum() else "_" for c in index_type)
    out = base / name
    flat = base / "tiny_Flat"
    if index_type != "Flat" and not out.exists() and (flat / "embeddings").exists():
        shutil.copytree(flat, out)  # reuse the encoded chunks: only the index is built
        (out / "meta.json").unlink()
    if not (out / "meta.json").exists():
        build_index(corpus, out, index_type=index_type, show_progress=False, batch_size=64)
    return out


def free_consecutive_ports(n: int, host: str = "127.0.0.1") -> int:
    """A port p with p .. p+n-1 all free on `host` (for `serve --replicas n --port p`)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now."""
    return free_consecutive_ports(1, host)


def serve_command(
    index: str | Path,
    port: int,
    *,
    replicas: int = 1,
    log_level: str = "warning",
    extra: Sequence[str] = (),
) -> list[str]:
    """`pvpo retriever serve` of `index` on loopback `port` (and the next `replicas - 1` ports), on
    CPU, run by this interpreter."""
    cmd = [sys.executable, "-m", "pvpo.cli", "retriever", "serve", "--index", str(index)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", log_level]
    if replicas != 1:
        cmd += ["--replicas", str(replicas)]
    return [*cmd, *extra]


def start_server(
    index: str | Path,
    *,
    port: int | None = None,
    replicas: int = 1,
    log_level: str = "warning",
    extra: Sequence[str] = (),
    log: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    timeout: float = 180,
    **popen: Any,
) -> tuple[subprocess.Popen[Any], list[str]]:
    """`pvpo retriever serve` in a process of its own (offline, `env` added to this environment)
    and its replicas' URLs, once every one answers /health (`wait`). `log`: the server's stdout and
    stderr go to this file (a pipe nobody reads would fill and block the server); otherwise they go
    where `popen` says (default: discarded). When the server exits or `timeout` passes first, it is
    killed and a RuntimeError says why, with the log's tail."""
    from pvpo.retriever.replicas import wait_healthy

    port = free_consecutive_ports(replicas) if port is None else port
    cmd = serve_command(index, port, replicas=replicas, log_level=log_level, extra=extra)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **dict(env or {})}
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    if log is not None:
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=full_env, **{**popen, "stdout": out, "stderr": subprocess.STDOUT})
    else:
        proc = subprocess.Popen(cmd, env=full_env, **popen)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]
    if not wait:
        return proc, urls
    try:
        wait_healthy(urls, [proc] * replicas, timeout=timeout)
    except RuntimeError as e:
        exited = proc.poll() is not None
        proc.kill()
        proc.wait()
        tail = ""
        if exited and log is not None:
            tail = Path(log).read_text(errors="replace")[-2000:]
        elif exited and popen.get("stderr") is subprocess.PIPE and proc.stderr is not None:
            tail = proc.stderr.read()[-2000:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise RuntimeError(f"{e}: {tail}" if tail else str(e)) from None
    return proc, urls


def stop_server(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if the server has not exited after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
