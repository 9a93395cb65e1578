"""The package layout, as docs/development.md draws it, checked against the imports in the code.

An `ast` walk of every module under `yoloedge/` collects which part imports which (a part is a
subpackage; the root modules such as `errors`, `files`, `redact` form the foundation, and the
tools `verify` and `__main__` are parts of their own). Imports under `if TYPE_CHECKING:` are left
out: they never run. The tests fail on an arrow the layout does not allow, on one it forbids, on a
cycle between parts. (That loading a config imports no reader or device code at all, third-party
modules included, is `test_sources_config.py`.)
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "yoloedge"
LAYOUT_DOC = ROOT / "docs" / "development.md"

#: root modules run as programs; they belong to the tools (every other root module is foundation).
TOOL_MODULES = {"verify", "__main__"}


class Layout:
    """The parts, their ranks and the forbidden arrows, read from docs/development.md "Layout".

    A part may import a part of a lower rank, or one of its own rank where the "may import" column
    names that arrow (`postprocess -> preprocess`); never one its "must never import" column names.
    The tools import anything; nothing imports them (they have the highest rank).
    """

    def __init__(self, text: str):
        section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
        self.rank: dict[str, int] = {}
        self.foundation: set[str] = set()
        for number, body in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |^\s*$)", section, re.M | re.S):
            names = re.findall(r"\*\*`?([a-z_]+)/?`?\*\*", body)
            if names == ["foundation"]:
                self.foundation = set(re.findall(r"`([a-z_]+)`", body))
            if names == ["tools"]:
                names += [n.rstrip("/") for n in re.findall(r"`([a-z_]+)/?`", body)]
            for name in names:
                self.rank[name] = int(number)
        self.same_rank: set[tuple[str, str]] = set()
        self.never: set[tuple[str, str]] = set()
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.startswith("|") or len(cells) != 3 or set(cells[0]) <= {"-"}:
                continue
            sources = re.findall(r"`([a-z_]+)`", cells[0]) or [cells[0]]
            self.same_rank |= set(re.findall(r"`([a-z_]+) -> ([a-z_]+)`", cells[1]))
            for target in re.findall(r"`([a-z_]+)`", cells[2]):
                self.never |= {(source, target) for source in sources}

    def problem(self, source: str, target: str) -> str | None:
        """Why the arrow source -> target breaks the layout; None when it is allowed."""
        for part in (source, target):
            if part not in self.rank:
                return f"{part} is not a part of the layout"
        if (source, target) in self.never:
            return "an arrow the layout forbids"
        if self.rank[source] == self.rank["tools"] or self.rank[target] < self.rank[source]:
            return None
        if (source, target) in self.same_rank:
            return None
        return "it points up or sideways"


LAYOUT = Layout(LAYOUT_DOC.read_text(encoding="utf-8"))


def part_of(parts: tuple[str, ...]) -> str | None:
    """The part a dotted module path (`yoloedge.x.y`) belongs to; None outside the package."""
    if not parts or parts[0] != "yoloedge":
        return None
    if len(parts) == 1:
        return "foundation"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return parts[1] if parts[1] in TOOL_MODULES else "foundation"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def _targets(node: ast.AST, package: tuple[str, ...]) -> list[tuple[str, ...]]:
    if isinstance(node, ast.Import):
        return [tuple(alias.name.split(".")) for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = package[:len(package) - node.level + 1] if node.level else ()
    module = base + tuple(node.module.split(".") if node.module else ())
    if len(module) == 1:  # `from yoloedge import x` or `from .. import x` at the top
        return [module + (alias.name,) for alias in node.names]
    return [module]


def import_arrows() -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the files making that arrow, run-time imports only."""
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("yoloedge",) + path.relative_to(PACKAGE).with_suffix("").parts
        package = parts[:-1] if parts[-1] == "__init__" else parts[:-1]
        source = part_of(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            for target in _targets(node, package):
                imported = part_of(target)
                if imported is not None and source is not None and imported != source:
                    arrows[(source, imported)].append(str(path.relative_to(PACKAGE.parent)))
    return arrows


def cycles(arrows) -> list[list[str]]:
    """The strongly connected components of more than one part (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in arrows:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph)):
        if node not in index:
            visit(node)
    return found


def test_every_part_and_root_module_is_in_the_layout():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    roots = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} - TOOL_MODULES
    assert parts - set(LAYOUT.rank) == set()
    assert roots - LAYOUT.foundation == set(), "a root module docs/development.md does not list"


def test_no_cycle_between_parts():
    assert cycles(import_arrows()) == []


def test_every_arrow_is_allowed_by_the_layout():
    wrong = [f"{source} -> {target}: {why} ({', '.join(sorted(set(files)))})"
             for (source, target), files in sorted(import_arrows().items())
             if (why := LAYOUT.problem(source, target))]
    assert wrong == []


def test_the_layout_as_written_reads_as_meant():
    """The parser is not vacuous: ranks, exceptions and forbidden arrows come out of the page."""
    assert LAYOUT.rank["foundation"] < LAYOUT.rank["model"] < LAYOUT.rank["config"] < LAYOUT.rank["pipeline"]
    assert {"errors", "redact", "files"} <= LAYOUT.foundation
    assert ("postprocess", "preprocess") in LAYOUT.same_rank
    assert ("config", "sources") in LAYOUT.never and ("pipeline", "publish") in LAYOUT.never
    assert LAYOUT.problem("config", "sources") and LAYOUT.problem("sources", "pipeline")
    assert LAYOUT.problem("preprocess", "postprocess") and not LAYOUT.problem("postprocess", "preprocess")
    assert not LAYOUT.problem("cli", "daemon") and LAYOUT.problem("daemon", "cli")


def test_the_walk_finds_arrows_and_cycles():
    arrows = import_arrows()
    assert any(f.startswith("yoloedge/config/") for f in arrows[("config", "foundation")])
    assert ("daemon", "pipeline") in arrows and ("pipeline", "backends") in arrows
    assert cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]
