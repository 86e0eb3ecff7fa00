"""The KV cache of finished turns, kept for the trajectory's next turn (the HF scheduler's prefix
cache).

A trajectory's next prompt is its last prompt, the tokens it sampled and the env's observation
tokens: everything but the observation was already in the KV cache when its turn ended. The
scheduler saves a finished row's cache here, keyed by the token ids it holds; a new prompt that
starts with a saved key takes that cache and prefills only the rest. Measured on the eval bench's
stragglers (SmolLM2-135M, 2 CPU cores): a prefill runs at ~610 tokens/s whatever the batch, and a
6-turn trajectory of 512-token turns re-prefills ~10,000 context tokens without this.

Entries are used once (the new turn's cache replaces them) and evicted oldest first beyond a byte
budget: a trajectory that answered is never asked for again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, length, dim]


@dataclass
class Saved:
    """One row's cache: the token ids it holds and each layer's keys and values."""

    ids: list[int]
    layers: KV
    nbytes: int


class PrefixStore:
    """Saved row caches, looked up by the longest saved key that prefixes a prompt."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.entries: OrderedDict[int, Saved] = OrderedDict()
        self.nbytes = 0
        self._next = 0
        self.hits = 0  # prompts served from a saved cache (instrumentation)
        self.reused_tokens = 0  # positions not prefilled again

    def save(self, ids: Sequence[int], layers: KV) -> None:
        """Keep `layers` (cloned by the caller, unpadded) as the cache of `ids`; evicts the oldest
        entries beyond the budget (an entry larger than the whole budget is not kept)."""
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if not ids or nbytes > self.max_bytes:
            return
        self.entries[self._next] = Saved(list(ids), layers, nbytes)
        self._next += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def take(self, prompt: Sequence[int]) -> Saved | None:
        """Remove and return the longest entry whose ids start `prompt` and leave at least one
        token of it to prefill (the next token's logits come from that prefill); None if none."""
        best: int | None = None
        for key, e in self.entries.items():
            n = len(e.ids)
            if n < len(prompt) and (best is None or n > len(self.entries[best].ids)) and list(prompt[:n]) == e.ids:
                best = key
        if best is None:
            return None
        e = self.entries.pop(best)
        self.nbytes -= e.nbytes
        self.hits += 1
        self.reused_tokens += len(e.ids)
        return e
