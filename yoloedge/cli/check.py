"""`yoloedge check`: validate a config file without starting anything.

Prints "FILE: OK (N cameras, M accelerators)" and exits 0, or prints every problem on stderr, one
per line as FILE:LINE: KEY: MESSAGE, and exits 78 (EX_CONFIG), the code `yoloedge run` and systemd
see for the same mistakes. It never opens a camera, a device, the broker or the model: it is safe to
run next to the running daemon, e.g. before `systemctl reload yoloedge`.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import re
import sys
from dataclasses import dataclass
from enum import Enum, auto
from typing import Mapping, Sequence, TextIO

from ..backends.ort_install import config_clash
from ..config import Config
from ..config.catalogue import CATALOGUE
from ..config.errors import EX_CONFIG, ConfigError, ConfigIssue
from ..config.loader import DEFAULT_PATH, load_config, read_text_file
from ..runtime import module_installed
from ..textsafe import printable

#: the largest environment file read (a few KEY=VALUE lines; a certificate in one stays far below).
MAX_ENV_FILE_BYTES = 1024 * 1024


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="validate a configuration file",
                       description="Validate a configuration file and list every problem with its line. "
                                   f"Exits 0 when it is usable, {EX_CONFIG} otherwise.")
    p.add_argument("-c", "--config", default=DEFAULT_PATH, help=f"configuration file (default {DEFAULT_PATH})")
    p.add_argument("--env-file", action="append", default=[], metavar="FILE",
                   help="read ${VAR} values from this KEY=VALUE file too (the service's EnvironmentFile=), "
                        "over the current environment; may be repeated")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        from_files = environment({}, args.env_file)
        config = load_config(args.config, {**os.environ, **from_files})
    except ConfigError as exc:
        print(printable(str(exc), keep_newlines=True), file=err)  # messages quote the file's keys
        return EX_CONFIG
    print(printable(f"{args.config}: OK ({_count(len(config.cameras), 'camera')}, "
                    f"{_count(len(config.accelerators), 'accelerator')})"), file=out)
    service_path = [entry for entry in from_files.get("PYTHONPATH", "").split(os.pathsep) if entry]
    for note in runtime_notes(config, service_path):
        print(printable(f"{args.config}: note: {note}"), file=err)
    return 0


def runtime_notes(config: Config, service_path: Sequence[str] = ()) -> list[str]:
    """One line per accelerator whose backend runtime is not installed on this machine. A note, not
    an error: the file is valid, and `check` may run where the daemon will not (a build host).
    `service_path`: the PYTHONPATH of the env files (the service's, e.g. CANN's from ascend.env),
    where a runtime this shell lacks is still found by the service."""
    notes = []
    for accelerator in config.accelerators:
        entry = CATALOGUE.get(accelerator.backend)
        if entry is not None:
            missing, install = entry.missing_runtime(), entry.install
        else:
            module = accelerator.backend.split(":", 1)[0]
            missing, install = (module if not module_installed(module) else None), f"make {module!r} importable"
        if missing is not None and not found_on(missing, service_path):
            notes.append(f"accelerator {accelerator.name} (backend {accelerator.backend}): the module {missing!r} "
                         f"is not installed here, so its workers would fail to start; install: {install}")
    clash = config_clash(a.backend for a in config.accelerators)
    if clash is not None:
        notes.append(f"ONNX Runtime: {clash}")
    return notes + dvpp_notes(config)


#: what a dvpp camera is assumed to send when its config does not cap it (`fps:`): the card's
#: budget is counted in 1080p frames, and the stream's real size and rate are known only once it opens
ASSUMED_DVPP_FPS = 30.0


def dvpp_notes(config: Config) -> list[str]:
    """Per Ascend accelerator with `decoder: dvpp` cameras: whether they fit its cards' VDEC
    channels and decode budget, for each chip the card might be (the chip is asked only when the
    daemon opens the card). Cameras are spread over the devices as the daemon spreads them (the
    fewest first)."""
    from ..backends.dvpp_limits import DVPP_LIMITS
    notes = []
    for accelerator in config.accelerators:
        cameras = [c for c in config.cameras if c.enabled and c.decoder == "dvpp"
                   and (c.accelerator or config.accelerators[0].name) == accelerator.name]
        if accelerator.backend != "ascend" or not cameras:
            continue
        devices = max(1, len(accelerator.devices))
        per_card = -(-len(cameras) // devices)
        fps = sum(c.fps or ASSUMED_DVPP_FPS for c in cameras) / devices
        for soc, limits in DVPP_LIMITS.items():
            over = []
            if per_card > limits.vdec_channels:
                over.append(f"{per_card} cameras a card is more than its {limits.vdec_channels} VDEC channels")
            if fps > limits.vdec_fps_1080p:
                over.append(f"about {fps:.0f} frames/s a card (1080p, {ASSUMED_DVPP_FPS:g} a camera without fps:) "
                            f"is more than its decode budget of {limits.vdec_fps_1080p}{limits.budget_note()}")
            if over:
                notes.append(f"accelerator {accelerator.name}: on an {soc}, {'; '.join(over)}: the cameras over "
                             f"the channels fail, those over the budget drop frames; add devices or set fps:")
    return notes


def found_on(name: str, path: Sequence[str]) -> bool:
    """Whether the top-level package of module `name` is in one of the folders `path` (without
    importing anything)."""
    return bool(path) and importlib.machinery.PathFinder.find_spec(name.split(".", 1)[0], list(path)) is not None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def environment(base: Mapping[str, str], env_files: list[str]) -> dict[str, str]:
    """`base` with the variables of each env file on top, as systemd would set them."""
    environ = dict(base)
    for path in env_files:
        environ.update(read_env_file(path))
    return environ


def read_env_file(path: str) -> dict[str, str]:
    """The variables systemd's EnvironmentFile= would set from `path`, or ConfigError. Read as the
    config file is (a FIFO, a device, a binary file are ConfigErrors, not a hang or a traceback)."""
    text = read_text_file(path, MAX_ENV_FILE_BYTES, "the environment file",
                          "an environment file holds a few KEY=VALUE lines")
    values: dict[str, str] = {}
    for assignment in _EnvFileParser(text).assignments():
        problem = _dropped_by_systemd(assignment.key, assignment.value, assignment.open_quote)
        if problem is None and assignment.value is not None:
            values[assignment.key] = assignment.value
        else:
            raise ConfigError([ConfigIssue(path, assignment.line, 1, "", None, *(problem or _NO_EQUALS))])
    return values


class _State(Enum):
    PRE_KEY = auto()
    KEY = auto()
    PRE_VALUE = auto()
    VALUE = auto()
    VALUE_ESCAPE = auto()
    SINGLE_QUOTED = auto()
    DOUBLE_QUOTED = auto()
    DOUBLE_QUOTED_ESCAPE = auto()
    COMMENT = auto()


#: systemd's line ends in an environment file (a CR ends a line too); other Unicode breaks are text.
_NEWLINE = "\n\r"
_WHITESPACE = " \t\n\r"
#: what a backslash escapes inside double quotes; before any other character it stays.
_ESCAPED_IN_DOUBLE_QUOTES = "\"\\`$"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class _Assignment:
    """One KEY=VALUE as systemd reads it; `value` None for a line that has no '='."""

    key: str
    value: str | None
    line: int
    open_quote: bool = False  # the file ended inside a quoted value


class _EnvFileParser:
    """A port of systemd's env-file state machine (parse_env_file_internal): check must set the
    variables the service gets, or check says OK and the service exits 78 with "X is not set".
    Quotes may be glued to text (`"ab"cd` is abcd), backslash escapes outside single quotes
    (`a\\$b` is a$b), a backslash before a line end continues the value, only '#'/';' at the start
    of a line begin a comment, and a key's surrounding blanks are dropped."""

    def __init__(self, text: str):
        self.text = text
        self.found: list[_Assignment] = []
        self.key: list[str] = []
        self.value: list[str] | None = None
        self.key_line = self.line = 1
        self.value_end: int | None = None  # where trailing blanks of an unquoted value begin

    def assignments(self) -> list[_Assignment]:
        state = _State.PRE_KEY
        for char in self.text:
            state = self._step(state, char)
            if char == "\n":
                self.line += 1
        if state in (_State.KEY, _State.PRE_VALUE, _State.VALUE, _State.VALUE_ESCAPE, _State.SINGLE_QUOTED,
                     _State.DOUBLE_QUOTED, _State.DOUBLE_QUOTED_ESCAPE):
            self._end(state, open_quote=state in (_State.SINGLE_QUOTED, _State.DOUBLE_QUOTED,
                                                  _State.DOUBLE_QUOTED_ESCAPE))
        return self.found

    def _step(self, state: _State, char: str) -> _State:  # noqa: C901 - one branch per state, as in systemd
        if state is _State.PRE_KEY:
            if char in "#;":
                return _State.COMMENT
            if char not in _WHITESPACE:
                self.key, self.value, self.key_line = [char], None, self.line
                return _State.KEY
            return state
        if state is _State.KEY:
            if char in _NEWLINE:
                return self._end(state)
            if char == "=":
                self.value, self.value_end = [], None
                return _State.PRE_VALUE
            self.key.append(char)
            return state
        value = self.value if self.value is not None else []
        if state is _State.PRE_VALUE:
            if char in _NEWLINE:
                return self._end(state)
            if char == "'":
                return _State.SINGLE_QUOTED
            if char == '"':
                return _State.DOUBLE_QUOTED
            if char == "\\":
                return _State.VALUE_ESCAPE
            if char not in _WHITESPACE:
                value.append(char)
                return _State.VALUE
            return state
        if state is _State.VALUE:
            if char in _NEWLINE:
                return self._end(state)
            if char == "\\":
                self.value_end = None
                return _State.VALUE_ESCAPE
            if char not in _WHITESPACE:
                self.value_end = None
            elif self.value_end is None:
                self.value_end = len(value)
            value.append(char)
            return state
        if state is _State.VALUE_ESCAPE:
            if char not in _NEWLINE:  # an escaped line end continues the value
                value.append(char)
            return _State.VALUE
        if state is _State.SINGLE_QUOTED:
            if char == "'":
                return _State.PRE_VALUE
            value.append(char)
            return state
        if state is _State.DOUBLE_QUOTED:
            if char == '"':
                return _State.PRE_VALUE
            if char == "\\":
                return _State.DOUBLE_QUOTED_ESCAPE
            value.append(char)
            return state
        if state is _State.DOUBLE_QUOTED_ESCAPE:
            if char in _ESCAPED_IN_DOUBLE_QUOTES:
                value.append(char)
            elif char != "\n":
                value.extend(("\\", char))
            return _State.DOUBLE_QUOTED
        return _State.PRE_KEY if char in _NEWLINE else state  # COMMENT

    def _end(self, state: _State, open_quote: bool = False) -> _State:
        """Close the assignment begun at `key_line`; blanks around the key and after an unquoted value go."""
        value = None
        if self.value is not None:
            chars = self.value[:self.value_end] if state is _State.VALUE and self.value_end is not None \
                else self.value
            value = "".join(chars)
        self.found.append(_Assignment("".join(self.key).strip(" \t\n\r"), value, self.key_line, open_quote))
        self.key, self.value = [], None
        return _State.PRE_KEY


_NO_EQUALS = ("expected KEY=VALUE", "systemd ignores a line without '='; remove it or make it a # comment")


def _dropped_by_systemd(key: str, value: str | None, open_quote: bool) -> tuple[str, str] | None:
    """(problem, hint) for an assignment the service would not get, else None. systemd drops such a
    line with at most a debug message; check refuses it, so it never says OK to a file whose
    variable the service then lacks."""
    if value is None:
        return _NO_EQUALS
    if open_quote:
        return ("a quote opened in this value is never closed",
                "systemd would take the rest of the file as the value; close the quote")
    if key.startswith("export") and key[len("export"):][:1] in (" ", "\t"):
        name = key.split()[-1]
        name = name if _NAME.fullmatch(name) else "the variable"
        return ("'export' is shell syntax, not EnvironmentFile syntax",
                f"systemd ignores this line, so the service would not get {name}; remove 'export '")
    if not _NAME.fullmatch(key):
        return ("expected KEY=VALUE with KEY made of letters, digits and '_', not starting with a digit",
                "systemd ignores an assignment to any other name")
    if any((char < " " or char == "\x7f") and char not in "\t\n" for char in value):
        return ("the value holds a control character",
                "systemd ignores an assignment whose value holds control characters other than tab and newline")
    return None
