"""torch's CPU threads for `pvpo eval`, chosen for the machine as it is: the CPUs other work leaves
idle, unless `--threads` or `OMP_NUM_THREADS` says otherwise."""

from __future__ import annotations

import pytest
import torch

from pvpo.hardware import choose_torch_threads, threads_for


def test_threads_are_the_idle_cpus_at_least_one_at_most_torchs_own_choice() -> None:
    assert threads_for(2, 2.9, 2) == 1  # 2 cores beside a training run
    assert threads_for(2, 0.3, 2) == 2  # an idle laptop
    assert threads_for(16, 3.6, 8) == 8  # torch's physical cores bound it
    assert threads_for(16, 3.6, 16) == 12
    assert threads_for(4, 9.0, 4) == 1


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_flag_wins_then_omp_num_threads_then_the_load(monkeypatch: pytest.MonkeyPatch, restore_threads) -> None:
    assert choose_torch_threads(1)[0] == 1 == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    n, why = choose_torch_threads(None)
    assert n == torch.get_num_threads() and "OMP_NUM_THREADS" in why
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("pvpo.hardware.usable_cpus", lambda: 4)
    monkeypatch.setattr("os.getloadavg", lambda: (2.2, 1.0, 1.0))
    torch.set_num_threads(4)
    n, why = choose_torch_threads(None)
    assert n == 2 == torch.get_num_threads()
    assert why == "torch: 2 CPU threads (4 CPUs, load average 2.2 from other work; --threads N to change)"
    monkeypatch.setattr("os.getloadavg", lambda: (3.0, 1.0, 1.0))
    assert choose_torch_threads(None)[1].startswith("torch: 1 CPU thread (4 CPUs, load average 3.0")


def test_a_later_thread_takes_the_callers_torch_threads_not_the_process_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from omp_support import omp_max_threads_reader

    from pvpo.hardware import carry_torch_threads

    omp_threads = omp_max_threads_reader()
    before = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        # as vLLM's CPU worker leaves it once it has bound its threads
        monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
        apply = carry_torch_threads()
        seen: dict[str, int] = {}

        def fresh(name: str, first=None) -> None:
            if first is not None:
                first()
            seen[name] = omp_threads()

        for name, first in (("plain", None), ("carried", apply)):
            t = threading.Thread(target=fresh, args=(name, first))
            t.start()
            t.join()
        if seen["plain"] == 1:
            pytest.skip("a new thread starts at 1 OpenMP thread here too (one CPU): nothing to tell apart")
        assert seen["carried"] == 1
    finally:
        torch._C.set_num_threads(before)
