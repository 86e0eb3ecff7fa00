"""The resident memory of a process tree: a process and all its descendants (a shell, the server
it starts in the background, the commands it runs) sampled together with psutil, so the peak of
everything a documented block runs at once is one figure; and the tree's leftovers stopped by PID.

The sum of resident sets is an upper bound of the tree's memory: pages two processes share (a
library both map, a fork's copy-on-write pages) count once per process. PSS would not count them
twice but reads each process's smaps, too slow to sample every 0.5 s for a process holding torch.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

GIB = 2**30


class TreeSampler:
    """Every `every` s, psutil's resident set summed over process `pid` and its descendants (and
    those seen before that outlive it): the samples (time, bytes), the peak sum and the largest
    single process. `seen` keeps each descendant's creation time, to stop the leftovers by PID."""

    def __init__(self, pid: int, every: float) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, int]] = []
        self.peak_single, self.peak_single_cmd = 0, ""
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._thread.start()

    def alive(self) -> list[psutil.Process]:
        """The processes of the tree now: `pid`, its descendants, and those seen still running."""
        procs: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.pid)
            procs = {p.pid: p for p in (root, *root.children(recursive=True))}
        except psutil.Error:
            pass
        for pid, created in list(self.seen.items()):
            if pid not in procs:
                try:
                    p = psutil.Process(pid)
                    if p.create_time() == created:
                        procs[pid] = p
                except psutil.Error:
                    del self.seen[pid]
        return list(procs.values())

    def sample(self) -> int:
        """One sample: the summed resident set of the tree now, in bytes."""
        total = 0
        for p in self.alive():
            try:
                rss = p.memory_info().rss
                self.seen.setdefault(p.pid, p.create_time())
                if rss > self.peak_single:
                    self.peak_single, self.peak_single_cmd = rss, " ".join(Path(a).name for a in p.cmdline()[:3])
            except psutil.Error:
                continue
            total += rss
        self.samples.append((time.time(), total))
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_total(self) -> int:
        return max((s for _, s in self.samples), default=0)


def stop_leftovers(sampler: TreeSampler, grace_s: float = 15.0) -> list[str]:
    """SIGTERM to the tree's processes still running (by PID), SIGKILL `grace_s` later to those that
    ignored it; their commands."""
    left = [p for p in sampler.alive() if p.pid != os.getpid()]
    names = []
    for p in left:
        try:
            names.append(" ".join(p.cmdline()[:3]))
            p.terminate()
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(left, timeout=grace_s)
    for p in still:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=5)
    return names
