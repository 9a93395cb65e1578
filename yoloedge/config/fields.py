"""Typed readers for config values: each checks one Item, reports what is wrong, returns the value.

A reader returns `INVALID` after reporting a problem, so the loader carries on and every mistake in
the file is reported in one go. The requirement text of a reader ("must be a number > 0") is what
the operator reads, so it doubles as the documentation of the key: `describe()` gives it as the
type column of docs/configuration.md.

Each key is declared once, as a `Key` in its section's table: the reader (type and bounds) and the
one-line meaning; its default is the section dataclass's field default (`config.schema`), or the
Key's `default` text where that is computed or not what the operator writes. `config.reference`
builds docs/configuration.md from these tables.
"""

from __future__ import annotations

import difflib
import math
import os
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..files import regular_file_problem
from ..redact import SECRETS, redact, redact_value
from .errors import IssueLog
from .yamltree import Item

#: returned by a reader whose value was reported as bad; the caller leaves the default in place.
INVALID: Any = type("Invalid", (), {"__repr__": lambda self: "INVALID", "__bool__": lambda self: False})()

#: characters that cannot appear in one MQTT topic level (camera and device names become levels).
TOPIC_RESERVED = ("/", "+", "#")

_MAX_SHOWN = 60

# Every value has an upper bound: a key the operator never meant to be huge (a 1e300 timeout, a
# 100000-frame queue, a 70,000-character name) passes nothing on to threading, OpenCV, paho or the
# allocator that would crash, hang or exhaust the daemon later. Readers take a per-key bound; these
# are the backstops for a reader given none.

#: the maximum of a number whose key names none; below threading.TIMEOUT_MAX (about 9.2e9 s), so
#: no duration can overflow a wait. Only sizes in bytes name a larger one.
MAX_NUMBER = 1_000_000_000
#: the longest string (UTF-8 bytes) a Text accepts unless its key needs more (URLs) or less (names).
MAX_TEXT_BYTES = 4096
#: names that become an MQTT topic level, a client id or a file name (device_id, camera and
#: accelerator names): long enough for any naming scheme, and a topic built of them stays far
#: below MQTT's 65,535 bytes.
MAX_NAME_BYTES = 128
#: the most entries of a list (cameras, devices, anchors) unless its key says otherwise.
MAX_LIST_ITEMS = 1000

Reader = Callable[["Context", Item], Any]


@dataclass(frozen=True)
class Key:
    """One config key: how it is read (`reader`: type, bounds, checks) and what it means. `type`:
    the type as text, for a reader that cannot describe itself (a function); `default`: the
    default as text where the dataclass field's is computed, required or not what is written.
    Called like its reader. `reader` None: the key is read elsewhere (an accelerator's backend
    sections, by `config.catalogue`), and declared here for the reference only."""

    reader: Reader | None
    meaning: str
    type: str | None = None
    default: str | None = None

    def __call__(self, ctx: "Context", item: Item) -> Any:
        if self.reader is None:
            raise TypeError("this key is read by its section, not through its table")
        return self.reader(ctx, item)

    def describe(self) -> str:
        """The type and bounds as the reference shows them: `number > 0 and <= 3600`."""
        if self.type is not None:
            return self.type
        describe = getattr(self.reader, "describe", None)
        if describe is None:
            raise TypeError(f"a Key reading with {self.reader!r} needs a type text")
        return str(describe())


class Context:
    """What readers need besides the value: where to report, and where relative paths start."""

    def __init__(self, log: IssueLog, base_dir: str):
        self.log = log
        self.base_dir = base_dir

    def bad_value(self, item: Item, requirement: str, hint: str | None = None, secret: bool = False) -> Any:
        """Report `item`'s value as not allowed; returns INVALID for the reader to pass on."""
        if not item.broken:
            self.log.add(item.line, item.column, item.path, requirement, show(item.value, secret), hint)
        return INVALID

    def problem(self, item: Item, message: str, hint: str | None = None, path: str | None = None) -> Any:
        """Report a problem that is not about one shown value (missing key, missing file)."""
        self.log.add(item.line, item.column, item.path if path is None else path, message, None, hint)
        return INVALID

    def resolve_path(self, path: str) -> str:
        """Relative paths are taken from the config file's folder: a daemon's working directory is /."""
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(path)))


def show(value: Any, secret: bool = False) -> str:
    """How a bad value appears in a message: YAML-like, shortened, with secrets and credentials hidden."""
    if secret:
        return redact(value)
    if isinstance(value, dict):
        return "a mapping" if value else "{}"
    if isinstance(value, list):
        return "a list" if value else "[]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = redact_value(value)
        text = text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."
        return repr(text)
    return str(value)


def key_name(item: Item) -> str:
    """The last key of the item's path (`cameras[1].fps` -> `fps`), for `e.g. fps: 5` hints."""
    return item.path.rsplit(".", 1)[-1].split("[", 1)[0]


def example_hint(item: Item, example: Any) -> str | None:
    return None if example is None else f"e.g. {key_name(item)}: {example}"


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def is_number(value: Any) -> bool:
    """YAML's true/false are Python bools, which are ints: never accept them as numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- scalar readers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Number:
    """A finite real number in a range; `gt`/`ge`/`le` bound it, `optional` also allows null.
    `le` is always set: every key names its own maximum, MAX_NUMBER is the default."""

    gt: float | None = None
    ge: float | None = None
    le: float = MAX_NUMBER
    optional: bool = False
    example: Any = None
    integer: bool = False

    def __call__(self, ctx: Context, item: Item) -> Any:
        value = item.value
        if value is None and self.optional:
            return None
        if not self._fits(value):
            hint = yaml11_number_hint(value) or example_hint(item, self.example)
            return ctx.bad_value(item, self.requirement, hint)
        return int(value) if self.integer else float(value)

    def _fits(self, value: Any) -> bool:
        if not is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        # an int of 5000 digits compares exactly here; math.isfinite would raise OverflowError
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and value <= self.le)

    @property
    def requirement(self) -> str:
        kind = "a whole number" if self.integer else "a number"
        low = self.ge if self.ge is not None else self.gt
        high = _num(self.le)
        if self.gt is not None:
            text = f"must be {kind} > {_num(self.gt)} and <= {high}"
        elif low is not None:
            text = f"must be {kind} from {_num(low)} to {high}"
        else:
            text = f"must be {kind} <= {high}"
        return text + (" or null" if self.optional else "")

    def describe(self) -> str:
        return self.requirement.removeprefix("must be ").removeprefix("a ")


def Integer(ge: int | None = None, le: int = MAX_NUMBER, optional: bool = False, example: Any = None) -> Number:
    return Number(ge=ge, le=le, optional=optional, example=example, integer=True)


def yaml11_number_hint(value: Any) -> str | None:
    """PyYAML follows YAML 1.1, where a float needs a '.' and a signed exponent: `5e-1` and `1e3`
    are strings. Such a string gets told how to write the number it looks like."""
    if not isinstance(value, str):
        return None
    try:
        number = float(value.strip().replace("_", ""))
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    text = repr(number)
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exponent):+d}"
    return f"YAML 1.1 reads {value.strip()} as text: write {text}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class Boolean:
    optional: bool = False

    def __call__(self, ctx: Context, item: Item) -> Any:
        if item.value is None and self.optional:
            return None
        if not isinstance(item.value, bool):
            return ctx.bad_value(item, "must be true or false" + (" or null" if self.optional else ""))
        return item.value

    def describe(self) -> str:
        return "true or false" + (" or null" if self.optional else "")


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of strings; the message lists them all."""

    choices: Sequence[str]
    optional: bool = False

    def __call__(self, ctx: Context, item: Item) -> Any:
        if item.value is None and self.optional:
            return None
        if not isinstance(item.value, str) or item.value not in self.choices:
            allowed = ", ".join(self.choices) + (", or null" if self.optional else "")
            hint = did_you_mean(item.value, self.choices) if isinstance(item.value, str) else None
            return ctx.bad_value(item, f"must be one of: {allowed}", hint)
        return item.value

    def describe(self) -> str:
        return " ".join(f"`{choice}`" for choice in self.choices) + (" or null" if self.optional else "")


@dataclass(frozen=True)
class Text:
    """A string of at most `max_bytes` UTF-8 bytes; `topic_safe` forbids the MQTT topic wildcards and
    separators (the value becomes a topic level), `secret` shows the value as *** in messages."""

    optional: bool = False
    allow_empty: bool = False
    topic_safe: bool = False
    secret: bool = False
    max_bytes: int = MAX_TEXT_BYTES

    def __call__(self, ctx: Context, item: Item) -> Any:
        value = item.value
        if value is None and self.optional:
            return None
        if not isinstance(value, str):
            hint = "put it in quotes" if is_number(value) or isinstance(value, bool) else None
            return ctx.bad_value(item, "must be a string" + (" or null" if self.optional else ""),
                                 hint, self.secret)
        if not value.strip() and not self.allow_empty:
            return ctx.bad_value(item, "must not be empty", secret=self.secret)
        if self.secret:
            SECRETS.add_secret(value)  # so that no log line or error text can quote it
        if len(value.encode("utf-8", "surrogatepass")) > self.max_bytes:
            return ctx.bad_value(item, f"is longer than {self.max_bytes:,} bytes (UTF-8), the most this key "
                                       f"takes", secret=self.secret)
        if self.topic_safe and not topic_safe(value):
            return ctx.bad_value(item, "must not contain '/', '+', '#', spaces or control characters "
                                       "(it becomes part of MQTT topics)")
        return value

    def describe(self) -> str:
        text = f"string, <= {self.max_bytes:,} bytes" + (", may be empty" if self.allow_empty else "")
        text += ", no `/` `+` `#` or spaces" if self.topic_safe else ""
        return text + (", or null" if self.optional else "")


def topic_safe(value: str) -> bool:
    return not any(c in value for c in TOPIC_RESERVED) and all(c.isprintable() and not c.isspace() for c in value)


@dataclass(frozen=True)
class FilePath:
    """A path to an existing regular file, relative to the config file's folder; stored resolved.
    `max_bytes` bounds files the daemon reads whole (labels), so one that would exhaust memory is a
    config error now rather than a MemoryError at start."""

    optional: bool = False
    max_bytes: int | None = None

    def __call__(self, ctx: Context, item: Item) -> Any:
        if item.value is None and self.optional:
            return None
        text = Text()(ctx, item)
        if text is INVALID:
            return INVALID
        path = ctx.resolve_path(text)
        problem = regular_file_problem(path, self.max_bytes)
        if problem is None:
            return path
        if problem.reason == "not found":
            return ctx.problem(item, f"file not found: {path}")
        return ctx.problem(item, str(problem))

    def describe(self) -> str:
        bound = "" if self.max_bytes is None else f" <= {self.max_bytes:,} bytes"
        return f"path of a regular file{bound}" + (" or null" if self.optional else "")


# -- structure ---------------------------------------------------------------------------------

def mapping_or_report(ctx: Context, item: Item, optional: bool = False) -> dict | None:
    """The item's entries, or None (after reporting) when it is not a mapping."""
    if item.is_mapping:
        return item.value
    if not (optional and item.value is None):
        ctx.bad_value(item, "must be a mapping (key: value lines)")
    return None


def sequence_or_report(ctx: Context, item: Item, what: str, most: int = MAX_LIST_ITEMS) -> list[Item] | None:
    """The list's items, or None after reporting a value that is not a list or has over `most` items."""
    if not item.is_sequence:
        ctx.bad_value(item, f"must be a list of {what}")
        return None
    if len(item.value) > most:
        ctx.problem(item, f"lists {len(item.value):,} {what}; at most {most:,} are allowed")
        return None
    return item.value


def read_fields(ctx: Context, item: Item, fields: Mapping[str, Reader], required: Sequence[str] = ()) -> dict | None:
    """Read a mapping against `fields`: unknown keys, missing required keys and bad values are all
    reported; returns the valid values by key (callers apply them over the dataclass defaults)."""
    entries = mapping_or_report(ctx, item)
    if entries is None:
        return None
    report_unknown_keys(ctx, entries, fields)
    for key in required:
        if key not in entries:
            ctx.problem(item, "required key is missing", path=_join(item.path, key))
    values = {}
    for key, reader in fields.items():
        if key in entries:
            value = reader(ctx, entries[key])
            if value is not INVALID:
                values[key] = value
    return values


def report_unknown_keys(ctx: Context, entries: dict, allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for key, child in entries.items():
        if not isinstance(key, str):
            ctx.problem(child, f"{show(key)} is not a valid key: keys are names",
                        f"allowed: {', '.join(allowed)}")
        elif key not in allowed:
            ctx.problem(child, _unknown_key(key), did_you_mean(key, allowed) or f"allowed: {', '.join(allowed)}")


def _unknown_key(key: str) -> str:
    """A homoglyph (`pаth` with a Cyrillic а) looks exactly like the key it is mistaken for, so
    "did you mean 'path'?" alone reads as nonsense: name the character that differs."""
    foreign = next((char for char in key if not char.isascii()), None)
    if foreign is None:
        return "unknown key"
    name = unicodedata.name(foreign, "an unnamed character")
    return f"unknown key {key!r} (it contains U+{ord(foreign):04X} {name}; keys are ASCII)"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def read_present(ctx: Context, entries: dict, fields: Mapping[str, Reader]) -> dict:
    """Values of the keys in `fields` that the mapping has; a bad one is kept as INVALID, so the
    caller can tell that the whole section failed."""
    return {key: reader(ctx, entries[key]) for key, reader in fields.items() if key in entries}


def read_string_list(ctx: Context, item: Item, what: str, most: int = MAX_LIST_ITEMS) -> Any:
    """A non-empty list of non-empty strings."""
    children = sequence_or_report(ctx, item, what, most)
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, f"must be a non-empty list of {what}")
    texts = [Text()(ctx, child) for child in children]
    return INVALID if INVALID in texts else texts


def range_order_ok(ctx: Context, entries: dict, low_key: str, high_key: str, values: dict) -> bool:
    """An upper bound (backoff_max_s, reconnect_max_s) below its lower bound is a typo."""
    low = values.get(low_key)
    high = values.get(high_key)
    if low is not None and high is not None and high < low:
        ctx.bad_value(entries[high_key], f"must be >= {low_key} ({low:g})")
        return False
    return True


def report_duplicate_names(ctx: Context, children: list[Item], names: list[Any], what: str) -> None:
    """Names identify cameras and accelerators in topics, status and references: one each."""
    first_line: dict[str, int] = {}
    for child, name in zip(children, names):
        if not isinstance(name, str):
            continue
        where = child.value.get("name", child) if child.is_mapping else child
        if name in first_line:
            ctx.problem(where, f"duplicate {what} name {name!r} (first used at line {first_line[name]}); "
                               f"names must be unique")
        else:
            first_line[name] = where.line


def read_section(ctx: Context, item: Item | None, fields: Mapping[str, Reader]) -> Any:
    """A backend's own settings section (`ascend:`, `simulated:`): absent or null means every
    default ({}); else the validated values, or INVALID once an unknown key or bad value was reported."""
    if item is None or item.value is None:
        return {}
    if mapping_or_report(ctx, item) is None:
        return INVALID
    values = read_fields(ctx, item, fields)
    if values is None or len(values) != len(item.value):
        return INVALID
    return values


def plain(item: Item) -> Any:
    """The Item tree as ordinary dicts, lists and scalars (for sections passed on unvalidated)."""
    if item.is_mapping:
        return {k: plain(v) for k, v in item.value.items()}
    if item.is_sequence:
        return [plain(v) for v in item.value]
    return item.value
