"""One registry type for every pluggable part (rewards, protocols, dataset formats and datasets,
prompt templates, rollout engines, GT sources, advantage estimators, retriever backends).

Before it, nine hand-written dicts disagreed: some raised on a duplicate name and some silently
overwrote, unknown names raised KeyError in some and ValueError in others, and not all listed the
known names. Here a duplicate name with a different object is refused, re-registering the same
(or an equal) object is a no-op (re-running a notebook cell), and an unknown name raises `UnknownNameError`
(a KeyError and a ValueError, so callers written against either keep working) naming the kind,
the name and every known name, lazily loaded ones included.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that no registry entry has; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ValueError):
    """A name registered twice with two different objects."""


class Registry(Generic[T]):
    """Named entries of one kind, in registration order.

    `kind` names the registry in errors ("reward", "rollout engine"); `lazy` maps names to the
    modules that register them on import (imported the first time the name is asked for, so an
    optional dependency such as vLLM is only imported when used)."""

    def __init__(self, kind: str, *, lazy: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = dict(lazy or {})

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, value: T) -> T: ...

    def register(self, name: str, value: T | None = None) -> T | Callable[[T], T]:
        """Add `value` under `name`; without `value`, a decorator that adds what it decorates."""
        if value is None:

            def deco(obj: T) -> T:
                return self.register(name, obj)

            return deco
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        if name not in self._entries and name in self._lazy:
            # the module that owns the name registers it first (a no-op while that module is the
            # one registering it), so another object cannot take a lazily declared name unnoticed
            importlib.import_module(self._lazy[name])
        existing = self._entries.get(name)
        if existing is not None and existing is not value and existing != value:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered (as {existing!r})")
        self._entries[name] = value
        return value

    def get(self, name: str) -> T:
        """The entry registered as `name`; `UnknownNameError` listing the known names otherwise."""
        if name not in self._entries and name in self._lazy:
            importlib.import_module(self._lazy[name])
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            known = ", ".join(self.names()) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def check(self, name: str) -> str:
        """`name` if it is known (lazily registered names included, nothing imported);
        `UnknownNameError` listing the known names otherwise. Config validation uses it, so
        checking a name never imports the module that implements it."""
        if name not in self:
            self.get(name)  # raises, listing the known names
        return name

    def load_lazy(self) -> None:
        """Import every lazily registered module (each one that is installed)."""
        for name in list(self._lazy):
            if name not in self._entries:
                importlib.import_module(self._lazy[name])

    def names(self) -> list[str]:
        """Every known name, sorted; lazily loaded ones included before they are imported."""
        return sorted(set(self._entries) | set(self._lazy))

    def values(self) -> list[T]:
        """Registered entries in registration order (lazy ones only once imported)."""
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
