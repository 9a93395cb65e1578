"""Track ids: short strings unique across restarts and cameras.

An id is "<start>-<n>": `start` is the moment the TrackIds was made, in microseconds since the
epoch written in base36 (10 characters until the year 5188), and `n` counts up from 1. A restart
makes a new TrackIds, so its ids start with a later prefix. One TrackIds is meant to be shared by
every tracker of the process (the router does): `next()` is safe from several threads (an
itertools.count step is atomic under the GIL), so no two cameras can hand out the same id.
"""

from __future__ import annotations

import itertools
import time

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(number: int) -> str:
    if number < 0:
        raise ValueError(f"base36 of a negative number: {number}")
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = _DIGITS[digit] + text
        if number == 0:
            return text


class TrackIds:
    """Hands out track ids; `prefix` (tests) or `start` (Unix seconds) fix the prefix, else now."""

    def __init__(self, *, start: float | None = None, prefix: str | None = None):
        if prefix is None:
            micros = time.time_ns() // 1000 if start is None else int(round(start * 1e6))
            prefix = base36(micros)
        self.prefix = prefix
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}-{next(self._counter)}"
