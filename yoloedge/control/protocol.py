"""The control protocol's framing and JSON decoding, shared by the server and the client.

One JSON object per line, UTF-8. The decoder is the only place either side turns bytes into
objects, and it is bounded before `json.loads` sees the text: the size is capped by the
caller's framing, the nesting depth is counted by a bracket scan (the C scanner recurses once
per level, so 100,000 `[` would raise RecursionError deep inside it), integers longer than
`MAX_NUMBER_CHARS` are refused (int() of a long digit string is quadratic; Python 3.11 raises
ValueError beyond 4,300 digits), and NaN, Infinity and floats that overflow to infinity are
refused because no field of the protocol can hold them and `json.dumps` would echo them as
invalid JSON. A key given twice is refused too: `json.loads` keeps the last, so
`{"cmd": "status", "cmd": "reload"}` would run a reload that a log or a proxy reading the first
key took for a status.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: a request line may be at most this long; the protocol's requests are a few dozen bytes.
MAX_REQUEST_BYTES = 64 * 1024
#: deepest nesting accepted in a request; a request is one flat object.
MAX_REQUEST_DEPTH = 8
#: deepest nesting accepted in a reply; a status report is five levels deep.
MAX_REPLY_DEPTH = 32
#: longest number literal accepted (a 64-bit integer has 20 characters).
MAX_NUMBER_CHARS = 40
#: a key or field name quoted in an error is cut to this many characters: the peer wrote it.
MAX_QUOTED_NAME = 40

#: a string literal, or an unterminated one up to the end. From a quote it cannot fail (a lone
#: trailing backslash is taken by the optional `.`), so it never backtracks and the scan never
#: restarts inside a string: linear. Were the `.` required, a run of quote-backslash pairs ending
#: in a backslash would fail from every quote after scanning to the end: quadratic, 20 s for
#: 64 KiB. No possessive quantifiers or atomic groups: they need Python 3.11.
_STRINGS = re.compile(r'"(?:[^"\\]|\\.?)*(?:"|\Z)', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


class MalformedMessage(ValueError):
    """The bytes are not one acceptable JSON object; the text says why, for the peer."""


def decode_object(data: bytes, max_depth: int) -> dict:
    """The JSON object in `data`, or MalformedMessage; never RecursionError or MemoryError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"not UTF-8 (byte {exc.start})") from exc
    depth = nesting_depth(text)
    if depth > max_depth:
        raise MalformedMessage(f"nested {depth} levels deep, at most {max_depth} allowed")
    try:
        decoded = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                             parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except MalformedMessage:
        raise
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise MalformedMessage(f"not JSON ({exc})") from exc
    if not isinstance(decoded, dict):
        raise MalformedMessage("expected a JSON object")
    return decoded


def nesting_depth(text: str) -> int:
    """How deeply `[` and `{` nest outside strings; an unterminated string counts as text.

    A scan without recursion, so its cost is linear and its stack flat whatever the input.
    """
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def encode(message: dict) -> bytes:
    """One protocol line. JSON has no NaN or Infinity (the peer's decoder refuses them), so a
    non-finite float, e.g. a rate over an empty window, goes out as null: "unknown"."""
    try:
        text = json.dumps(message, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(message), allow_nan=False)
    return text.encode("utf-8") + b"\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise MalformedMessage(f"number with {len(literal)} characters, at most {MAX_NUMBER_CHARS} allowed")
    return int(literal)


def _parse_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise MalformedMessage(f"number with {len(literal)} characters, at most {MAX_NUMBER_CHARS} allowed")
    value = float(literal)
    if not math.isfinite(value):
        raise MalformedMessage(f"number {literal} is out of range")
    return value


def quoted_name(name: str) -> str:
    """A key or field name from the peer, quoted and cut short for an error message."""
    return repr(name if len(name) <= MAX_QUOTED_NAME else name[:MAX_QUOTED_NAME] + "...")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise MalformedMessage(f"key {quoted_name(key)} given twice")
        seen[key] = value
    return seen


def _refuse_constant(name: str) -> Any:
    raise MalformedMessage(f"{name} is not a number JSON allows")
