"""The first `pvpo retriever build` with an exported encoder prints no TracerWarning: the ONNX export
of MiniLM silences that category (and only it) where it traces the model."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.slow
def test_the_onnx_export_raises_no_tracer_warning(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    torch = pytest.importorskip("torch")
    from pvpo.retriever.encoder import Encoder
    from pvpo.retriever.runtimes import _export_onnx

    st_model = Encoder(device="cpu", backend="torch").model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _export_onnx(st_model, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").stat().st_size > 0
    tracer = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert tracer == []
    # the filter is the export's own: afterwards the category shows again
    assert warnings.filters[:1] != [("ignore", None, torch.jit.TracerWarning, None, 0)]
