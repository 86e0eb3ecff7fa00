"""Each component's `__init__` exports its public API, and stays light to import."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

COMPONENTS = ("pvpo.reward", "pvpo.envs", "pvpo.retriever", "pvpo.trainer", "pvpo.evaluation")


@pytest.mark.parametrize("package", COMPONENTS)
def test_every_name_in_all_resolves(package: str) -> None:
    mod = importlib.import_module(package)
    assert mod.__all__, f"{package} exports nothing"
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"
        assert name in dir(mod)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    import pvpo.retriever

    with pytest.raises(AttributeError, match="'pvpo.retriever' has no attribute 'Nope'"):
        pvpo.retriever.Nope  # noqa: B018


def test_the_client_the_config_and_eval_reports_import_without_torch_or_faiss() -> None:
    code = (
        "import sys; from pvpo.retriever import RetrieverClient, Passage; from pvpo.trainer import TrainConfig; "
        "import pvpo.envs, pvpo.evaluation.report; heavy = [m for m in ('torch', 'faiss', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
