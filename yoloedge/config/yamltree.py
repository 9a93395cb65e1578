"""Parse YAML into a tree that remembers the line of every key and list item.

`yaml.safe_load` forgets where values came from and silently keeps the last of two equal keys; an
operator needs "line 14: cameras[1].fps" and a complaint about the duplicate. So we compose PyYAML's
node tree (which carries marks) and build plain values ourselves, substituting `${VAR}` references
in string scalars on the way.

A config is small, and the file may come from a careless or hostile hand: nesting deeper than
MAX_DEPTH levels and aliases that expand to more than MAX_ALIAS_VALUES values (a "billion laughs"
file of 500 bytes) are refused while composing and building, before they can exhaust the stack or
memory. So is a file of more than MAX_NODES values: the size cap alone lets 1 MiB of `[0,0,0,...]`
cost seconds of CPU and hundreds of MB to build, and a reload would leave the daemon that much
larger. Every string (keys and values, after `${VAR}` substitution) is refused when it holds a
control character: a CR/LF in a camera URL or a broker host would be sent on the wire as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NoReturn

import yaml

from ..textsafe import first_unsafe
from .envsubst import SubstitutionError, has_references, substitute
from .errors import ConfigError, ConfigIssue, IssueLog

STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"

#: deepest nesting of mappings and lists (the example config uses 4).
MAX_DEPTH = 64
#: most values that aliases (`*name`, `<<: *name`) may add in all by repeating anchored ones.
MAX_ALIAS_VALUES = 20_000
#: most values (scalars, lists, mappings, aliases) in one file; a real configuration has a few hundred.
MAX_NODES = 100_000
#: integers are refused from this magnitude on: no setting needs them, and readers compare them
#: with floats (a 400-digit integer overflows float()).
MAX_INTEGER = 2 ** 63


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


class LimitExceeded(yaml.YAMLError):
    """The file is nested too deeply or its aliases expand too far; `mark` is where it happened."""

    def __init__(self, message: str, mark: yaml.Mark | None):
        super().__init__(message)
        self.message = message
        self.mark = mark


def _too_deep(mark: yaml.Mark | None) -> NoReturn:
    raise LimitExceeded(f"nested more than {MAX_DEPTH} levels deep (mappings, lists and aliases); "
                        f"a configuration never needs that many", mark)


def _too_many_nodes(mark: yaml.Mark | None) -> NoReturn:
    raise LimitExceeded(f"the file holds more than {MAX_NODES} values; a configuration has a few hundred "
                        f"(is this the right file?)", mark)


def _too_many_aliased(mark: yaml.Mark | None) -> NoReturn:
    raise LimitExceeded(f"aliases expand to more than {MAX_ALIAS_VALUES} values; write the values out "
                        f"or use fewer nested aliases", mark)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's composer and merge-key flattening recurse once per level: cap the depth there,
    before Python's recursion limit (or the memory of a merge chain) is reached. Count the nodes
    there too: composing is where a long flat list grows, before any Item is built."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                _too_deep(self.peek_event().start_mark)
            if self._nodes > MAX_NODES:
                _too_many_nodes(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                _too_deep(node.start_mark)
            super().flatten_mapping(node)
        finally:
            self._depth -= 1
        if len(node.value) > MAX_ALIAS_VALUES:
            _too_many_aliased(node.start_mark)


def parse_tree(text: str, log: IssueLog, environ: Mapping[str, str]) -> Item | None:
    """The file's top-level Item, None for an empty file; a syntax error or a file over the
    nesting and alias limits raises ConfigError at once."""
    try:
        loader = _BoundedLoader(text)  # reads the whole text: refuses raw control characters at once
    except yaml.reader.ReaderError as exc:
        raise ConfigError([_unreadable_character(log.file, text, exc)]) from None
    try:
        node = loader.get_single_node()
        return None if node is None else _TreeBuilder(loader, log, environ).build(node, "", node.start_mark)
    except LimitExceeded as exc:
        raise ConfigError([_limit_issue(log.file, exc)]) from None
    except RecursionError:  # last resort: every recursive step above is bounded by MAX_DEPTH
        raise ConfigError([ConfigIssue(log.file, None, None, "", None,
                                       f"nested too deeply (more than {MAX_DEPTH} levels)")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([_syntax_issue(log.file, exc)]) from None
    finally:
        loader.dispose()


def _unreadable_character(file: str, text: str, exc: yaml.reader.ReaderError) -> ConfigIssue:
    before = text[:exc.position]
    line, column = before.count("\n") + 1, exc.position - before.rfind("\n")
    return ConfigIssue(file, line, column, "", None,
                       f"the file holds a control character ({ascii(chr(exc.character))[1:-1]} at column {column}); "
                       f"write a YAML text file without them")


def _limit_issue(file: str, exc: LimitExceeded) -> ConfigIssue:
    if exc.mark is None:
        return ConfigIssue(file, None, None, "", None, exc.message)
    return ConfigIssue(file, exc.mark.line + 1, exc.mark.column + 1, "", None, exc.message)


def control_character(text: str) -> str | None:
    """'found \\r at position 23' for the first control character in `text` (C0, DEL, C1, line
    separators, bidi overrides: what `textsafe` escapes on a terminal), else None. The value
    itself is never shown: it may be a password or a URL with credentials."""
    found = first_unsafe(text)
    return None if found is None else f"found {found[1]} at position {found[0]}"


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
        self._open: list[int] = []  # nodes being built, outermost first: the depth, and self-containing aliases
        self._built: set[int] = set()  # nodes built once: building one again expands an alias
        self._repeating = 0  # > 0 while building the subtree of a node built before
        self._repeated = 0  # values built by repeating, against MAX_ALIAS_VALUES
        self._split: dict[int, tuple[list, list]] = {}  # mapping node -> (merged, own) entries

    def build(self, node: yaml.Node, path: str, mark) -> Item:
        line, column = mark.line + 1, mark.column + 1
        if id(node) in self._open:
            self.log.add(line, column, path, "an alias refers to a node that contains it")
            return Item(None, path, line, column, broken=True)
        if len(self._open) >= MAX_DEPTH:
            _too_deep(mark)
        repeat = id(node) in self._built
        self._built.add(id(node))
        self._repeating += repeat
        if self._repeating:
            self._repeated += 1
            if self._repeated > MAX_ALIAS_VALUES:
                _too_many_aliased(mark)
        self._open.append(id(node))
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
            self._open.pop()
            self._repeating -= repeat

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict:
        """Entries in file order; `<<` merges first, own keys override them, own duplicates are errors."""
        merged, own = self._merged_and_own(node)
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

    def _merged_and_own(self, node: yaml.MappingNode) -> tuple[list, list]:
        """Split once per node: flattening rewrites the node, and an alias builds it again."""
        split = self._split.get(id(node))
        if split is None:
            own = [(k, v) for k, v in node.value if k.tag != MERGE_TAG]
            self.loader.flatten_mapping(node)
            split = self._split[id(node)] = (node.value[:len(node.value) - len(own)], own)
        return split

    def _key(self, key_node: yaml.Node, path: str):
        mark = key_node.start_mark
        if not isinstance(key_node, yaml.ScalarNode):
            self.log.add(mark.line + 1, mark.column + 1, path, "a key must be a plain name, not a list or mapping")
            return None
        try:
            key = self.loader.construct_object(key_node)
        except Exception:  # noqa: BLE001 - see _scalar; reported here
            self.log.add(mark.line + 1, mark.column + 1, path, "cannot read this key; write it as a plain name")
            return None
        found = control_character(key) if isinstance(key, str) else None
        if found is not None:
            self.log.add(mark.line + 1, mark.column + 1, path, f"a key must not contain control characters ({found})")
            return None
        return key

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
            value = self.loader.construct_object(node)
        except yaml.constructor.ConstructorError as exc:
            self.log.add(line, column, path, f"cannot read this value: {exc.problem}")
            return Item(None, path, line, column, broken=True)
        except Exception:  # noqa: BLE001 - reported here
            # PyYAML's constructors raise whatever their parsing hits when a value does not fit its
            # (explicit) tag: ValueError for a 5,000-digit number or 2024-13-45, AttributeError
            # for `!!timestamp x`, IndexError for `!!int ""`.
            self.log.add(line, column, path, "cannot read this value (a number or date out of range, or "
                                             "not what its !!tag says?); put it in quotes if it is text")
            return Item(None, path, line, column, broken=True)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INTEGER:
            self.log.add(line, column, path, "this number is too large (at most 2**63 - 1)")
            return Item(None, path, line, column, broken=True)
        found = control_character(value) if isinstance(value, str) else None
        if found is not None:
            self.log.add(line, column, path, f"must not contain control characters ({found})",
                         hint="line breaks, tabs and other control characters are not allowed in values")
            return Item(None, path, line, column, broken=True)
        return Item(value, path, line, column, text=node.value)

    def _substituted(self, node: yaml.ScalarNode) -> yaml.ScalarNode:
        """Fill references; an unquoted value is typed afterwards like any plain YAML scalar,
        so `fps: ${FPS:-5}` gives the number 5 while `"${FPS:-5}"` stays the string '5'."""
        text = substitute(node.value, self.environ)
        tag = self.loader.resolve(yaml.ScalarNode, text, (True, False)) if node.style is None else STR_TAG
        return yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, style=node.style)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)
