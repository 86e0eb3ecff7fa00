"""YAML read with bounds: a config is a small document written by a person, so a file that is
large, whose aliases expand into a huge document (a "billion laughs" bomb: nine levels of nine
aliases are 387 million nodes, which PyYAML builds as shared objects in a moment and every later
walk - validation, `pvpo config show` - expands until it hangs or the allocator gives up), that
refers to itself, or that gives one key twice (where PyYAML silently keeps the last) is refused
with the line and column to fix, before anything else reads it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

# bytes of one YAML document (the largest shipped preset is under 8 KiB)
MAX_BYTES = 1 << 20
# nodes the document would have with every alias expanded (the largest preset has about 400)
MAX_NODES = 100_000


class YAMLBoundsError(yaml.YAMLError):
    """A YAML document refused by a bound; `problem_mark` says where (as PyYAML's own errors)."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark, self.context = problem, mark, None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts the expanded size of a document before building it and
    refuses a key given twice in one mapping."""

    def construct_document(self, node: Node) -> Any:
        _expanded_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not None:
                line = first.start_mark.line + 1
                raise YAMLBoundsError(f"key {key!r} is given twice (first on line {line})", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: Node) -> int:
    """Nodes of `root`'s document with every alias expanded; YAMLBoundsError past MAX_NODES or on
    a node that contains itself."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise YAMLBoundsError("an alias refers to a node that contains it", node.start_mark)
        on_path.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        on_path.discard(key)
        if total > MAX_NODES:
            raise YAMLBoundsError(
                f"its aliases expand to over {MAX_NODES:,} values (a YAML alias bomb?)", node.start_mark
            )
        sizes[key] = total
        return total

    return size(root)


def load_yaml(text: str) -> Any:
    """The YAML document in `text`, read safely (no Python objects) within the bounds above;
    yaml.YAMLError (YAMLBoundsError for a bound) otherwise."""
    if len(text.encode("utf-8", "surrogateescape")) > MAX_BYTES:
        raise YAMLBoundsError(f"it is over {MAX_BYTES >> 20} MiB; a config is a few KiB")
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
