"""The continuous batcher's KV cache (`hf_scheduler.ContinuousBatcher`): a transformers
`DynamicCache` whose layers keep room for the tokens still to come (`rebuild`), and the padding
a row's cache needs to join a batch (`left_pad`)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from pvpo.trainer.rollout.kv_prefix import KV


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`t` with zeros before it along `dim`, to `width` positions."""
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


@functools.cache
def growing_layer_class() -> type:
    """The `GrowingLayer` class (made on first use: transformers is imported only then)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A `DynamicLayer` whose keys/values live in a buffer with room for the tokens still to
        come: a decoding step writes its token in place instead of `torch.cat`-ing the whole cache
        (transformers' `DynamicLayer.update` copies every layer's K and V at every step, which costs
        more memory traffic than the attention that reads them). `keys`/`values` are views of the
        filled part; the buffer grows (copied once) if a step overruns it."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
            super().__init__()
            self.device, self.is_initialized, self.length = keys.device, True, keys.shape[-2]
            self.k_buf, self.v_buf = (with_room(x, spare) for x in (keys, values))
            self._views()

        def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = self.k_buf[..., : self.length, :], self.v_buf[..., : self.length, :]
            self.keys, self.values = keys, values
            return keys, values

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            n = key_states.shape[-2]
            if self.length + n > self.k_buf.shape[-2]:  # overrun: grow by half again at least
                room = max(n, self.length // 2)
                self.k_buf, self.v_buf = (with_room(x, room) for x in self._views())
            self.k_buf[..., self.length : self.length + n, :] = key_states
            self.v_buf[..., self.length : self.length + n, :] = value_states
            self.length += n
            return self._views()

        def trim(self, n: int) -> None:
            """Forget the last `n` positions (written by a step, needed by no row)."""
            self.length -= n
            self._views()

    return GrowingLayer


def with_room(x: torch.Tensor, spare: int) -> torch.Tensor:
    """A copy of `x` ([batch, heads, length, dim]) in a buffer with `spare` free positions after it."""
    b, h, n, d = x.shape
    buf = torch.empty((b, h, n + max(0, spare), d), dtype=x.dtype, device=x.device)
    buf[:, :, :n] = x
    return buf


def rebuild(layers: list[tuple[torch.Tensor, torch.Tensor]], spare: int) -> Any:
    """A KV cache holding `layers`, each with room for `spare` more tokens (`growing_layer_class`)."""
    from transformers import DynamicCache

    grow = growing_layer_class()
    new = DynamicCache()
    new.layers = [grow(k, v, spare) for k, v in layers]
    return new


def kv_layers(cache: Any) -> KV:
    """Each layer's (keys, values) of a transformers cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
