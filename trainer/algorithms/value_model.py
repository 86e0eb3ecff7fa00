"""A value model over prompt embeddings: V0.5's prior without a generalist value model
(arXiv:2603.10848 uses V0, a pretrained one; we have none offline, so the prior is learned on the
run's own prompts as they are seen). The embeddings come from the trainer (`pvpo.trainer.model.embed`).

Each trained prompt's mean reward is stored with its embedding (the packaged MiniLM by default);
a prompt's value is the similarity-weighted mean over its `k` nearest stored prompts (`knn`), or a
ridge regression on the embeddings (`ridge`). Its own latest entry counts (a prompt seen in an
earlier epoch is its own best neighbour, as PVPO's anchor is). With nothing stored it predicts
None and V0.5 falls back to the group mean. The store is a JSON file in the run directory.

Under torchrun every rank keeps the same store: each step's entries (embedding and mean reward of
each rank's prompts) are gathered from all ranks and added on each in rank order, as one process
would add them; every rank reads the file on resume and only the main rank writes it (`read_only`
on the others).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pvpo.atomic import DamagedFileError, atomic_write_json, read_json
from pvpo.registry import Registry

_REDO = "delete it and resume: the run learns it again"

Embed = Callable[[Sequence[str]], np.ndarray]
Predictor = Callable[..., np.ndarray]  # (queries [Q, D], stored [N, D], values [N], k=, alpha=) -> [Q]

PREDICTORS: Registry[Predictor] = Registry("value model")


@PREDICTORS.register("knn")
def knn_predict(q: np.ndarray, x: np.ndarray, y: np.ndarray, *, k: int, alpha: float) -> np.ndarray:
    """Similarity-weighted mean value of the `k` most similar stored prompts (unit vectors:
    cosine); dissimilar neighbours count least, never negatively."""
    sims = q @ x.T
    out = np.empty(len(q), dtype=np.float64)
    for i, row in enumerate(sims):
        top = np.argsort(-row)[:k]
        wts = np.clip(row[top], 1e-6, None)
        out[i] = float((wts * y[top]).sum() / wts.sum())
    return out


@PREDICTORS.register("ridge")
def ridge_predict(q: np.ndarray, x: np.ndarray, y: np.ndarray, *, k: int, alpha: float) -> np.ndarray:
    """Ridge regression (L2 penalty `alpha`, with an intercept) on the embeddings, clipped to [0, 1]."""
    xb = np.hstack([x, np.ones((len(x), 1), dtype=np.float32)]).astype(np.float64)
    w = np.linalg.solve(xb.T @ xb + alpha * np.eye(xb.shape[1]), xb.T @ y)
    return np.clip(np.hstack([q, np.ones((len(q), 1), dtype=np.float32)]) @ w, 0.0, 1.0)


class PromptValueModel:
    """uid -> (embedding, mean reward); `predict` by kNN or ridge (module docstring)."""

    def __init__(
        self,
        embed: Embed,
        *,
        kind: str = "knn",
        k: int = 8,
        alpha: float = 1.0,
        path: str | Path | None = None,
        read_only: bool = False,
    ) -> None:
        self.predictor = PREDICTORS.get(kind)  # UnknownNameError (a ValueError) listing the kinds
        self.embed, self.kind, self.k, self.alpha = embed, kind, k, alpha
        self.path = Path(path) if path is not None else None
        self.read_only = read_only  # loads `path`, never writes it
        self.vectors: dict[str, np.ndarray] = {}
        self.values: dict[str, float] = {}
        if self.path is not None and self.path.exists():
            doc = read_json(self.path, fix=_REDO)
            try:
                for uid, (vec, val) in doc["entries"].items():
                    self.vectors[uid], self.values[uid] = np.asarray(vec, dtype=np.float32), float(val)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DamagedFileError(self.path, f"not a value model ({type(e).__name__}: {e})", _REDO) from None

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
        pred = self.predictor(q, x, y, k=self.k, alpha=self.alpha)
        return {u: float(p) for u, p in zip(uids, pred, strict=True)}

    def embeddings(self, uids: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """`[len(uids), D]`: the prompts' embeddings (computed once per uid)."""
        return self._vectors(uids, texts)

    def update(
        self,
        uids: Sequence[str],
        texts: Sequence[str],
        values: Sequence[float],
        vectors: Sequence[np.ndarray] | None = None,
    ) -> None:
        """Store each prompt's latest mean reward (replacing an older one) and save. `vectors`:
        the prompts' embeddings as another rank computed them (a uid keeps its first one)."""
        if vectors is None:
            self._vectors(uids, texts)
        else:
            for u, vec in zip(uids, vectors, strict=True):
                self.vectors.setdefault(u, np.asarray(vec, dtype=np.float32))
        for u, v in zip(uids, values, strict=True):
            self.values[u] = float(v)
        self.save()

    def save(self) -> None:
        if self.path is None or self.read_only:
            return
        doc = {"entries": {u: [self.vectors[u].tolist(), v] for u, v in self.values.items()}}
        atomic_write_json(self.path, doc)
