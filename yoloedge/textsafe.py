"""Text that came from outside, shown on an operator's terminal without commanding it.

Labels come from a model's metadata or a labels file, camera errors quote what a server or
FFmpeg said, image names are whatever was dropped into a folder. To a terminal, an ESC in them is
a command: `\\x1b]0;...\\x07` retitles the window, `\\x1b[2J` clears the screen, a CR or a
backspace overwrites what the operator is reading, and bidi overrides (U+202E) make text read
differently from what it is. So every printer for humans -- `yoloedge-ctl status`, `yoloedge
detect`, `yoloedge check`, the stderr log -- passes its text through `printable`, which shows each
such character as an escape (`\\x1b`, `\\r`, `\\u202e`) instead of sending it.

JSON output needs nothing more: `json.dumps` (ensure_ascii, the default) already escapes every
control character, C1 and U+2028 included.
"""

from __future__ import annotations

import re

#: besides the C0 controls: DEL, C1 controls, the Unicode line and paragraph separators, and the
#: bidi marks, embeddings, overrides and isolates
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def first_unsafe(text: str) -> tuple[int, str] | None:
    """(1-based position, escaped character) of the first character `printable` would escape, else
    None. Config values are refused by the same rule (`config.yamltree`): one definition of what
    may not pass through unescaped."""
    match = _UNSAFE.search(text)
    return None if match is None else (match.start() + 1, _escape(match))


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character that could command a terminal written as an escape.

    `keep_newlines` leaves LF alone, for text that is meant to span lines (a traceback, a list of
    config problems); everything else, CR included, is escaped either way.
    """
    return (_UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE).sub(_escape, text)
