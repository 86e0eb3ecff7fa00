"""Shared test helpers: where the real data samples live, and a skip when they are absent."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import verl_standin
from verl_support import ADAPTERS, REAL_VERL

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PVPO_SHARED_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as in a terminal, however the suite was started. A shell script's background job
    (`make test &`, `nohup ... &`) starts with SIGINT ignored, which pvpo keeps ignored on purpose
    (`pvpo.signals.stop_on_signals`), so the tests of what Ctrl-C does saw no Ctrl-C: seen as
    test_trainer_faults' SIGINT case and test_owned_folders' held-signal case failing in such a run."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def shared_data(*parts: str) -> Path:
    """Path under ../shared/data; skips the calling test when that sample is not on this machine
    (a user's fresh clone has no ../shared)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data sample {path} is absent (only present beside the dev checkout)")
    return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The tiny one-fact-per-passage retriever (MiniLM + FAISS Flat), built once per session."""
    from pvpo.retriever.index import load_retriever
    from pvpo.retriever.testing import build_tiny_index

    retriever = load_retriever(build_tiny_index(tmp_path_factory.getbasetemp() / "retriever"), device="cpu")
    yield retriever
    retriever.close()


@pytest.fixture
def verl_api(monkeypatch, record_property):
    """verl's modules the adapter uses: the real ones where verl is installed, else the stand-in;
    the adapter modules that bind verl's names at import are imported afresh against them."""
    record_property("verl", "real" if REAL_VERL else "stand-in")
    if not REAL_VERL:
        for name, module in verl_standin.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
    for name in ADAPTERS:
        if name in sys.modules:
            monkeypatch.delitem(sys.modules, name)
    return SimpleNamespace(
        real=REAL_VERL,
        core_algos=importlib.import_module("verl.trainer.ppo.core_algos"),
        agent_loop=importlib.import_module("verl.experimental.agent_loop.agent_loop"),
    )
