"""The BM25 backend imports bm25s without letting JAX (which bm25s runs at import where installed)
preallocate the GPU that the policy shares."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import os; from pvpo.retriever.bm25 import import_bm25s; import_bm25s(); print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))"


@pytest.mark.parametrize(("given", "seen"), [(None, "false"), ("true", "true")])
def test_importing_bm25s_turns_off_jax_preallocation_unless_the_user_chose(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    if given is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == seen
