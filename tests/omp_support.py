"""OpenMP's own thread count for the calling thread (`omp_get_max_threads` of the OpenMP runtime
torch loaded): what vLLM's CPU kernels read, unlike `torch.get_num_threads`, which first sets a
new thread to torch's count and so cannot show that the thread started elsewhere."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pytest


def omp_max_threads_reader() -> Callable[[], int]:
    """A function returning the calling thread's OpenMP thread count; skips where none is loaded."""
    import torch  # noqa: F401 (loads its OpenMP runtime)

    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line})
    except OSError:
        pytest.skip("no /proc/self/maps here: cannot find torch's OpenMP runtime")
    if not libs:
        pytest.skip("torch runs without OpenMP here")
    # torch's own runtime: other wheels (faiss) load their own copy, whose counts torch never sets
    ours = [lib for lib in libs if "/torch/" in lib] or libs
    fn = ctypes.CDLL(ours[0]).omp_get_max_threads
    fn.restype = ctypes.c_int
    return lambda: int(fn())
