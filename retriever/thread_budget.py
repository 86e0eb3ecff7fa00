"""How many CPU threads the searches of the calling thread may compute with: a server's batch
workers each keep to one core, a lone query may use every core. The budget belongs to the thread,
as OpenMP's thread count does: FAISS's OpenMP count is set for that thread too, and the exported
encoder runtimes pick their session by it (torch's count is process-wide, so the torch encoder
does not follow it)."""

from __future__ import annotations

import os
import sys
import threading

_local = threading.local()


def cpu_cores() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_thread_budget(threads: int | None) -> None:
    """Sets the calling thread's budget (None: no budget, the libraries' own defaults). Meant as
    a thread pool's initializer."""
    if threads is not None and threads < 1:
        raise ValueError(f"a thread budget is at least 1, got {threads}")
    _local.threads = threads
    faiss = sys.modules.get("faiss")  # only where FAISS is in use: a BM25 server never imports it
    if faiss is not None and threads is not None:
        faiss.omp_set_num_threads(threads)  # OpenMP's count is per thread: this thread only


def thread_budget() -> int | None:
    """The calling thread's budget, None when it has none."""
    return getattr(_local, "threads", None)
