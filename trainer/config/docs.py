"""Every config key with its type, default and description, read from the pydantic models'
`Field(description=...)` (their single source) for `pvpo config keys` and tools."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from pvpo.trainer.config.schema import TrainConfig


@dataclass(frozen=True)
class KeyDoc:
    """One leaf key of the config: dotted name, type, default value and description."""

    key: str
    type: str
    default: Any
    description: str


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    return str(annotation).replace("typing.", "")


def config_keys(section: BaseModel | None = None, prefix: str = "") -> list[KeyDoc]:
    """The leaf keys under `section` (default: the whole `TrainConfig()`), in declaration order,
    with the defaults of that instance."""
    section = TrainConfig() if section is None else section
    out: list[KeyDoc] = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out += config_keys(value, key + ".")
        else:
            default = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            out.append(KeyDoc(key, _type_name(field.annotation), default, field.description or ""))
    return out


def format_keys(keys: list[KeyDoc]) -> str:
    """`key = default  (type)` then the description, indented, one key after another."""
    lines = []
    for k in keys:
        lines.append(f"{k.key} = {json.dumps(k.default, ensure_ascii=False)}  ({k.type})")
        if k.description:
            lines.append(f"    {k.description}")
    return "\n".join(lines)
