"""YAML as ssmlm reads it: PyYAML's safe loader, except that a key written twice in one mapping is an error.

YAML itself forbids duplicate keys, but PyYAML keeps the last one silently, so a second ``train:`` section would
drop the first one's ``steps:`` without a word. Keys that a merge (``<<: *anchor``) brings in are not
duplicates: overriding them is what a merge is for."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names one key twice; ``key``, ``first`` and ``second`` (1-based lines) say where."""

    def __init__(self, key: Any, first: int, second: int, mark):
        self.key, self.first, self.second = key, first, second
        super().__init__(problem=f"key '{key}' appears twice (lines {first} and {second})", problem_mark=mark)

    def __str__(self) -> str:
        return self.problem


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, seen[key], line, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """``yaml.safe_load`` with duplicate keys refused (DuplicateKeyError, a yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
