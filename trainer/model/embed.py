"""Prompt embeddings for V0.5's value model (`pvpo.trainer.algorithms.value_model`): the
retriever's sentence-transformers encoder, the packaged MiniLM unless another is named."""

from __future__ import annotations

import numpy as np

from pvpo.trainer.algorithms.value_model import Embed


def minilm_embed(model: str | None = None) -> Embed:
    """Unit-length prompt embeddings from the retriever's encoder (packaged MiniLM when None)."""
    from pvpo.retriever.encoder import Encoder

    enc = Encoder(model, device="cpu")
    return lambda texts: np.asarray(enc.encode_queries(list(texts)), dtype=np.float32)
