"""The documentation's links, commands and script paths, checked against the tree and the CLI.

README.md and docs/**/*.md link to each other (each fact has one home, the other pages link to
it), so a moved page or a renamed heading must break a test, not a reader's click. What is
checked:
- every relative markdown link resolves to a file or folder of the repository, and its `#anchor`
  (also a bare `#anchor` within the page) to a heading of the target page, by GitHub's slug rules;
- every `yoloedge ...` / `yoloedge-ctl ...` command shown in a code block or inline code names a
  real sub-command and only options its argparse parser (built in-process, no subprocess) knows;
- every `scripts/...` path mentioned exists.
"""
from __future__ import annotations

import argparse
import re
import shlex
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

from yoloedge.cli import ctl as ctl_cli
from yoloedge.cli import main as main_cli

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
COMMAND_START = re.compile(r"^(?:\$\s+)?(?:sudo\s+(?:-\S+\s+)*)?(?:[\w./~-]*/)?(yoloedge(?:-ctl)?)(?=\s|$)")
SCRIPT_PATH = re.compile(r"(?<![\w./-])scripts/[\w./-]*[\w/]")
SHELL_BLOCKS = {"sh", "bash", "shell", "console", "ini", ""}


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def split_blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The page's prose lines, and its fenced code blocks as (language, lines)."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    lang = ""
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                lang = line.strip().lstrip("`~").strip().lower()
                current = []
            else:
                blocks.append((lang, current))
                current = None
            continue
        if current is None:
            prose.append(line)
        else:
            current.append(line)
    return prose, blocks


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation dropped (letters,
    digits, marks, `-` and `_` kept), each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("*", "").lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    prose, _ = split_blocks(page.read_text(encoding="utf-8"))
    for line in prose:
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def links(page: Path) -> list[str]:
    prose, _ = split_blocks(page.read_text(encoding="utf-8"))
    found: list[str] = []
    for line in prose:
        # inline code is not a link, but a link's text may be inline code
        line = INLINE_CODE.sub(lambda m: "code" if "](" in m.group(2) else m.group(0), line)
        found.extend(match.group(1) for match in LINK.finditer(line))
    return found


def link_problem(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.is_relative_to(REPO):
        return f"{target}: points outside the repository"
    if not resolved.exists():
        return f"{target}: no such file"
    if anchor:
        if resolved.suffix != ".md" or not resolved.is_file():
            return f"{target}: an anchor into something that is not a markdown page"
        if anchor not in anchors(resolved):
            return f"{target}: {_page_id(resolved)} has no heading with that anchor"
    return None


def test_github_slug_follows_githubs_rules():
    assert github_slug("Can this host keep the card busy? (`bench pipeline`)") == \
        "can-this-host-keep-the-card-busy-bench-pipeline"
    assert github_slug("The GPU check (`scripts/gpu-check.sh`)") == "the-gpu-check-scriptsgpu-checksh"
    assert github_slug("ONNX → Ascend `.om` with ATC") == "onnx--ascend-om-with-atc"
    assert github_slug("Stages (`bench micro`, `bench model`)") == "stages-bench-micro-bench-model"


def test_the_link_check_can_fail():
    readme = REPO / "README.md"
    assert link_problem(readme, "docs/how-it-works.md#signals-and-shutdown") is None
    assert link_problem(readme, "https://example.com/nowhere") is None
    assert "no such file" in link_problem(readme, "docs/nowhere.md")
    assert "no heading with that anchor" in link_problem(readme, "docs/how-it-works.md#no-such-heading")
    assert "no heading with that anchor" in link_problem(readme, "#no-such-heading")
    assert "outside the repository" in link_problem(readme, "../elsewhere.md")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_resolves(page):
    problems = [p for p in (link_problem(page, t) for t in links(page)) if p]
    assert not problems, f"{_page_id(page)}:\n  " + "\n  ".join(problems)


# -- commands ----------------------------------------------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@lru_cache(maxsize=None)
def programs() -> dict[str, argparse.ArgumentParser]:
    return {"yoloedge": main_cli.build_parser(), "yoloedge-ctl": ctl_cli.build_parser()}


def command_lines(page: Path) -> list[str]:
    """The commands a page shows: lines of code blocks (continuations joined) and inline code
    that start with yoloedge or yoloedge-ctl. In a block that shows a session only the lines after a
    `$ ` prompt are commands; in other blocks without a language, output lines (with a `word:`
    among their first tokens, e.g. `yoloedge 0.1.0: running`) are not."""
    prose, blocks = split_blocks(page.read_text(encoding="utf-8"))
    found: list[str] = []
    for lang, lines in blocks:
        prompted = any(line.startswith("$ ") for line in lines)  # a session: its commands have a prompt
        joined: list[str] = []
        for line in lines:
            if joined and (joined[-1].endswith("\\") or re.match(r"^\s+[\[-]", line)):
                joined[-1] = joined[-1].rstrip("\\") + " " + line.strip()
            else:
                joined.append(line)
        for line in joined:
            line = line.strip()
            if not COMMAND_START.match(line) or (prompted and not line.startswith("$")):
                continue
            if lang not in SHELL_BLOCKS or (lang == "" and not line.startswith("$")
                                            and any(t.endswith(":") for t in line.split()[:4])):
                continue
            found.append(line)
    for line in prose:
        found.extend(m.group(2).strip() for m in INLINE_CODE.finditer(line)
                     if COMMAND_START.match(m.group(2).strip()))
    return found


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in a synopsis
        return line.split()


def command_problem(line: str) -> str | None:
    match = COMMAND_START.match(line)
    assert match
    program = match.group(1)
    parser = programs()[program]
    known = dict(parser._option_string_actions)
    words = _tokens(line[match.end():])
    depth = 0
    chosen: list[str] = []
    takes_value = False
    for word in words:
        if word in ("&&", ";", "||", ">", ">>", "2>&1") or (word == "|" and depth == 0):
            break
        depth += word.count("[") - word.count("]")
        bare = word.strip("[]()")
        if bare in ("", "|", "...") or bare.startswith("..."):
            continue
        if bare.startswith("-") and len(bare) > 1 and not re.fullmatch(r"-[\d.]+", bare):
            option = bare.split("=", 1)[0]
            if re.fullmatch(r"-([a-zA-Z])\1+", option):  # -vv
                option = option[:2]
            if option not in known:
                return f"`{line}`: {' '.join([program, *chosen])} has no option {option}"
            action = known[option]
            takes_value = action.nargs != 0 and "=" not in bare
            continue
        if takes_value:  # the option's value
            takes_value = False
            continue
        subs = _subparsers(parser)
        if subs and bare == word and not any(c in word for c in "|<>{}"):
            if bare.upper() == bare:  # a placeholder (COMMAND, KIND)
                continue
            if bare not in subs:
                return f"`{line}`: {' '.join([program, *chosen])} has no sub-command {bare!r}"
            chosen.append(bare)
            parser = subs[bare]
            known.update(parser._option_string_actions)
    return None


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_shown_is_real(page):
    problems = [p for p in (command_problem(line) for line in command_lines(page)) if p]
    assert not problems, f"{_page_id(page)}:\n  " + "\n  ".join(problems)


def test_the_command_check_can_fail():
    assert command_problem("yoloedge check -c x.yaml") is None
    assert command_problem("yoloedge-ctl status --json --socket /run/x.sock") is None
    assert command_problem("yoloedge-ctl -c FILE status") is None
    assert "no sub-command 'chek'" in command_problem("yoloedge chek -c x.yaml")
    assert "no option --jsn" in command_problem("yoloedge-ctl status --jsn")
    assert "no option --seconds" in command_problem("yoloedge bench micro --seconds 3")
    assert command_problem("yoloedge bench pipeline --seconds 3 | tee out.txt") is None


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_script_path_exists(page):
    text = page.read_text(encoding="utf-8")
    missing = sorted({p for p in SCRIPT_PATH.findall(text) if not (REPO / p).exists()})
    assert not missing, f"{_page_id(page)} names scripts that do not exist: {missing}"
