"""`UnicodeText`: the env's text observation and action space, usable by Gymnasium's own vector
classes (`AsyncVectorEnv`'s shared memory stores code points, not indices into a charset)."""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Sequence
from types import ModuleType
from typing import Any, overload

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

_PAD = -1  # shared-memory slots past the end of a string


class UnicodeText(spaces.Text):
    """A `Text` space holding any Unicode string within the length bounds. `Text` only admits its
    charset; real questions and passages use all of Unicode, so membership ignores the charset,
    which only serves `sample()` (printable ASCII, tags' angle brackets included)."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    memory = ctx.Array(np.dtype(np.int32).char, n * space.max_length)
    np.frombuffer(memory.get_obj(), dtype=np.int32)[:] = _PAD  # n empty texts
    return memory


class SharedTexts(Sequence[str]):
    """The texts in a shared-memory buffer, decoded at each access. `AsyncVectorEnv` reads its
    shared memory once, at start-up, and relies on the result being a live view (as numpy arrays
    are); a tuple of strings would stay the first observations forever. A deep copy (what
    `AsyncVectorEnv(copy=True)`, the default, returns) is a plain tuple."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data  # (n, max_length) int32 code points, _PAD after each text

    def __len__(self) -> int:
        return len(self._data)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        row = self._data[i]
        return row[row != _PAD].astype(np.uint32).tobytes().decode("utf-32-le")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length)))


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    if len(value) > space.max_length:
        raise ValueError(f"a text of {len(value)} characters does not fit {space!r}")
    size = space.max_length
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size]
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.uint32).astype(np.int32)
    row[: len(codes)] = codes
    row[len(codes) :] = _PAD
