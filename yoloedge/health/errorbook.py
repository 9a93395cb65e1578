"""Errors that repeat: one warning per kind of error, then one per interval with a count, and the
status fields that say whether the latest one still holds.

Why per kind: a part with two problems at once (the broker down and the spool's disk full) used
to compare each message with the last one it had warned about, so two alternating messages
defeated the de-duplication: a warning a second each. Here each kind (a member of the caller's
enum) has its own state: its first report is a warning; later reports while it persists are
debug lines, summed into one warning per `repeat_s` ("N more time(s) in the last 300 s"). Once the
caller resolves it (the broker took the connection, the spool was written), its next report is
news again.

Why the status shape: `last_error` used to keep an old failure next to `connected: true`, which
reads as a current problem. `status()` gives the most recent error that still holds, or when none
does the most recent one of all, with `last_error_at` (UTC, when it was last reported) and
`error_active` (whether it still holds). One-off events (messages found lost, an internal error)
are reported with `active=False`: they are shown and de-duplicated, but nothing holds.

Thread-safe; the lock is a leaf (nothing is called while it is held). The clock (monotonic
seconds) paces the warnings and is injectable, so tests move it instead of waiting.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..timeutil import utc_timestamp


@dataclass(frozen=True)
class Warn:
    """A report that is to be logged as a warning: `held` reports of the same kind were logged
    at debug level since the last warning, over `since_s` seconds."""

    held: int
    since_s: float

    def suffix(self) -> str:
        """What to append to the warning, e.g. " (4 more time(s) in the last 300 s)"."""
        return f" ({self.held} more time(s) in the last {self.since_s:.0f} s)" if self.held else ""


@dataclass
class _Entry:
    message: str
    at: str  # UTC timestamp of the last report
    order: int  # reports are numbered, so "most recent" needs no clock
    active: bool
    warned_at: float | None = None  # clock time of the last warning
    held: int = 0  # reports since that warning, logged at debug level
    news: bool = True  # the next report is a warning (first report, or resolved since)


class ErrorBook:
    """See the module docstring."""

    def __init__(self, repeat_s: float, clock: Callable[[], float] = time.monotonic):
        self.repeat_s = repeat_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[enum.Enum, _Entry] = {}
        self._order = 0

    def report(self, kind: enum.Enum, message: str, *, active: bool = True) -> Warn | None:
        """Record `message` as the latest error of `kind`; a `Warn` when it is to be logged as a
        warning, None when it is a repeat to log at debug level."""
        now = self._clock()
        with self._lock:
            entry = self._record(kind, message, active)
            due = entry.warned_at is None or now - entry.warned_at >= self.repeat_s
            if not (entry.news or due):
                entry.held += 1
                return None
            since = 0.0 if entry.warned_at is None else now - entry.warned_at
            warn = Warn(0 if entry.news else entry.held, since)
            entry.warned_at, entry.held, entry.news = now, 0, False
            return warn

    def update(self, kind: enum.Enum, message: str, *, warned: bool = False) -> None:
        """Record `message` for `kind` without a logging decision: the caller logs (or not) by
        its own rule (a flapping connection's summary, a stall whose age grows). `warned`: the
        caller has just warned about it, which starts the kind's interval."""
        now = self._clock()
        with self._lock:
            entry = self._record(kind, message, True)
            if warned:
                entry.warned_at, entry.held, entry.news = now, 0, False

    def _record(self, kind: enum.Enum, message: str, active: bool) -> _Entry:
        self._order += 1
        entry = self._entries.get(kind)
        if entry is None:
            entry = self._entries[kind] = _Entry(message, utc_timestamp(), self._order, active)
        else:
            entry.message, entry.at, entry.order = message, utc_timestamp(), self._order
            entry.active = active
        return entry

    def resolve(self, kind: enum.Enum) -> bool:
        """`kind` no longer holds; its next report is news. True when it held until now and was
        warned about (so the caller may say it is over)."""
        with self._lock:
            entry = self._entries.get(kind)
            if entry is None or not entry.active:
                return False
            entry.active, entry.news = False, True
            return entry.warned_at is not None

    def active(self, kind: enum.Enum) -> bool:
        with self._lock:
            entry = self._entries.get(kind)
            return entry is not None and entry.active

    def status(self) -> dict:
        """`last_error`, `last_error_at`, `error_active` (see the module docstring)."""
        with self._lock:
            entries = list(self._entries.values())
            holding = [e for e in entries if e.active]
            latest = max(holding or entries, key=lambda e: e.order, default=None)
            if latest is None:
                return {"last_error": None, "last_error_at": None, "error_active": False}
            return {"last_error": latest.message, "last_error_at": latest.at,
                    "error_active": latest.active}
