"""YAML as its author means it: a key given twice in one mapping is refused with both lines.

PyYAML keeps the last of two equal keys without a word, so a spec with `target:` twice would build for whichever
came last. Merge keys (``<<``) still let a mapping's own keys override what they bring.
"""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    """A mapping holds one key twice; the message names the key and both (1-based) lines."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"line {line}: `{key}` is given a second time (first on line {first_line}); "
                         "YAML would keep the last silently: keep one")


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                first = first_lines.get(key)
            except TypeError:
                continue  # an unhashable key: SafeLoader's own error names it
            if first is not None:
                raise DuplicateKey(key, key_node.start_mark.line + 1, first)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``text`` parsed as ``yaml.safe_load`` does, but ``DuplicateKey`` for a key given twice in one mapping."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
