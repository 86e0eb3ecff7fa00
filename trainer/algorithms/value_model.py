"""A value model over prompt embeddings: V0.5's prior without a generalist value model
(arXiv:2603.10848 uses V0, a pretrained one; we have none offline, so the prior is learned on the
run's own prompts as they are seen).

Each trained prompt's mean reward is stored with its embedding (the packaged MiniLM by default);
a prompt's value is the similarity-weighted mean over its `k` nearest stored prompts (`knn`), or a
ridge regression on the embeddings (`ridge`). Its own latest entry counts (a prompt seen in an
earlier epoch is its own best neighbour, as PVPO's anchor is). With nothing stored it predicts
None and V0.5 falls back to the group mean. The store is a JSON file in the run directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

Embed = Callable[[Sequence[str]], np.ndarray]


def minilm_embed(model: str | None = None) -> Embed:
    """Unit-length prompt embeddings from the retriever's encoder (packaged MiniLM when None)."""
    from pvpo.retriever.encoder import Encoder

    enc = Encoder(model, device="cpu")
    return lambda texts: np.asarray(enc.encode_queries(list(texts)), dtype=np.float32)


class PromptValueModel:
    """uid -> (embedding, mean reward); `predict` by kNN or ridge (module docstring)."""

    def __init__(
        self, embed: Embed, *, kind: str = "knn", k: int = 8, alpha: float = 1.0, path: str | Path | None = None
    ) -> None:
        if kind not in ("knn", "ridge"):
            raise ValueError(f"unknown value model {kind!r}; known: knn, ridge")
        self.embed, self.kind, self.k, self.alpha = embed, kind, k, alpha
        self.path = Path(path) if path is not None else None
        self.vectors: dict[str, np.ndarray] = {}
        self.values: dict[str, float] = {}
        if self.path is not None and self.path.exists():
            doc = json.loads(self.path.read_text())
            for uid, (vec, val) in doc["entries"].items():
                self.vectors[uid], self.values[uid] = np.asarray(vec, dtype=np.float32), float(val)

    def _vectors(self, uids: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        todo = [i for i, u in enumerate(uids) if u not in self.vectors]
        if todo:
            new = self.embed([texts[i] for i in todo])
            for i, v in zip(todo, new, strict=True):
                self.vectors[uids[i]] = np.asarray(v, dtype=np.float32)
        return np.stack([self.vectors[u] for u in uids]) if uids else np.zeros((0, 0), dtype=np.float32)

    def predict(self, uids: Sequence[str], texts: Sequence[str]) -> dict[str, float | None]:
        """Predicted value of each prompt (None while nothing is stored)."""
        q = self._vectors(uids, texts)
        known = list(self.values)
        if not known:
            return dict.fromkeys(uids)
        x = np.stack([self.vectors[u] for u in known])
        y = np.asarray([self.values[u] for u in known], dtype=np.float64)
        if self.kind == "ridge":
            xb = np.hstack([x, np.ones((len(x), 1), dtype=np.float32)]).astype(np.float64)
            w = np.linalg.solve(xb.T @ xb + self.alpha * np.eye(xb.shape[1]), xb.T @ y)
            pred = np.hstack([q, np.ones((len(q), 1), dtype=np.float32)]) @ w
            return {u: float(np.clip(p, 0.0, 1.0)) for u, p in zip(uids, pred, strict=True)}
        sims = q @ x.T  # unit vectors: cosine
        out: dict[str, float | None] = {}
        for u, row in zip(uids, sims, strict=True):
            top = np.argsort(-row)[: self.k]
            wts = np.clip(row[top], 1e-6, None)  # dissimilar neighbours count least, never negatively
            out[u] = float((wts * y[top]).sum() / wts.sum())
        return out

    def update(self, uids: Sequence[str], texts: Sequence[str], values: Sequence[float]) -> None:
        """Store each prompt's latest mean reward (replacing an older one) and save."""
        self._vectors(uids, texts)
        for u, v in zip(uids, values, strict=True):
            self.values[u] = float(v)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        doc = {"entries": {u: [self.vectors[u].tolist(), v] for u, v in self.values.items()}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)
