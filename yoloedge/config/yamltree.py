"""Parse YAML into a tree that remembers the line of every key and list item.

`yaml.safe_load` forgets where values came from and silently keeps the last of two equal keys; an
operator needs "line 14: cameras[1].fps" and a complaint about the duplicate. So we compose PyYAML's
node tree (which carries marks) and build plain values ourselves, substituting `${VAR}` references
in string scalars on the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from .envsubst import SubstitutionError, has_references, substitute
from .errors import ConfigError, ConfigIssue, IssueLog

STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class Item:
    """One value in the file and where it is.

    `value` is a dict (key -> Item) for a mapping, a list of Items for a sequence, else a scalar.
    `line`/`column` (1-based) are those of the key for a mapping entry, of the item for a list entry.
    `broken` marks a value whose problem was already reported (e.g. an unset ${VAR}), so readers
    skip it instead of piling a second, confusing complaint on top.
    """

    value: Any
    path: str
    line: int
    column: int
    broken: bool = False
    #: a scalar as written in the file (after ${VAR} substitution), e.g. "0660" for a file mode.
    text: str | None = None

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.value, list)


def parse_tree(text: str, log: IssueLog, environ: Mapping[str, str]) -> Item | None:
    """The file's top-level Item, None for an empty file; a syntax error raises ConfigError at once."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _TreeBuilder(loader, log, environ).build(node, "", node.start_mark)
    except yaml.YAMLError as exc:
        raise ConfigError([_syntax_issue(log.file, exc)]) from None
    finally:
        loader.dispose()


def _syntax_issue(file: str, exc: yaml.YAMLError) -> ConfigIssue:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        context = f"{context} (from line {context_mark.line + 1})"
    detail = f"{context}: {problem}" if context else problem
    hint = "indent with spaces; YAML does not allow tabs" if "'\\t'" in problem else None
    if mark is None:
        return ConfigIssue(file, None, None, "", None, f"YAML syntax error: {detail}", hint)
    return ConfigIssue(file, mark.line + 1, mark.column + 1, "", None,
                       f"YAML syntax error at column {mark.column + 1}: {detail}", hint)


class _TreeBuilder:
    """Walks composed nodes into Items; reports duplicates and substitution failures to `log`."""

    def __init__(self, loader: yaml.SafeLoader, log: IssueLog, environ: Mapping[str, str]):
        self.loader = loader
        self.log = log
        self.environ = environ
        self._open: set[int] = set()  # nodes being built, to catch an alias that contains itself

    def build(self, node: yaml.Node, path: str, mark) -> Item:
        line, column = mark.line + 1, mark.column + 1
        if id(node) in self._open:
            self.log.add(line, column, path, "an alias refers to a node that contains it")
            return Item(None, path, line, column, broken=True)
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return Item(self._mapping(node, path), path, line, column)
            if isinstance(node, yaml.SequenceNode):
                return Item([self.build(child, f"{path}[{i}]", child.start_mark)
                             for i, child in enumerate(node.value)], path, line, column)
            if isinstance(node, yaml.ScalarNode):
                return self._scalar(node, path, line, column)
            raise TypeError(f"{path}: unexpected YAML node {type(node).__name__}")  # PyYAML has no other kind
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict:
        """Entries in file order; `<<` merges first, own keys override them, own duplicates are errors."""
        own = [(k, v) for k, v in node.value if k.tag != MERGE_TAG]
        self.loader.flatten_mapping(node)
        merged = node.value[:len(node.value) - len(own)]
        entries: dict = {}
        for key_node, value_node in merged:
            key = self._key(key_node, path)
            if key is not None:
                entries[key] = self.build(value_node, _join(path, key), key_node.start_mark)
        first_seen: dict = {}
        for key_node, value_node in own:
            key = self._key(key_node, path)
            if key is None:
                continue
            if key in first_seen:
                self._duplicate(key_node, _join(path, key), first_seen[key])
                continue
            first_seen[key] = key_node.start_mark.line + 1
            entries[key] = self.build(value_node, _join(path, key), key_node.start_mark)
        return entries

    def _key(self, key_node: yaml.Node, path: str):
        if not isinstance(key_node, yaml.ScalarNode):
            mark = key_node.start_mark
            self.log.add(mark.line + 1, mark.column + 1, path, "a key must be a plain name, not a list or mapping")
            return None
        return self.loader.construct_object(key_node)

    def _duplicate(self, key_node: yaml.Node, path: str, first_line: int) -> None:
        mark = key_node.start_mark
        self.log.add(mark.line + 1, mark.column + 1, path,
                     f"duplicate key (first given at line {first_line}; only one is allowed)")

    def _scalar(self, node: yaml.ScalarNode, path: str, line: int, column: int) -> Item:
        if node.tag == STR_TAG and has_references(node.value):
            try:
                node = self._substituted(node)
            except SubstitutionError as exc:
                self.log.add(line, column, path, str(exc))
                return Item(None, path, line, column, broken=True)
        try:
            return Item(self.loader.construct_object(node), path, line, column, text=node.value)
        except yaml.constructor.ConstructorError as exc:
            self.log.add(line, column, path, f"cannot read this value: {exc.problem}")
            return Item(None, path, line, column, broken=True)

    def _substituted(self, node: yaml.ScalarNode) -> yaml.ScalarNode:
        """Fill references; an unquoted value is typed afterwards like any plain YAML scalar,
        so `fps: ${FPS:-5}` gives the number 5 while `"${FPS:-5}"` stays the string '5'."""
        text = substitute(node.value, self.environ)
        tag = self.loader.resolve(yaml.ScalarNode, text, (True, False)) if node.style is None else STR_TAG
        return yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, style=node.style)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)
