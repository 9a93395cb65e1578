"""What the MQTT client says about its problems: the error kinds it de-duplicates, the warnings it
rate-limits, and the count of dropped messages (publish/mqtt.py has the design).

Why its own module: the link's health (link_health.py), the outbox (outbox.py), the drain
(drain.py) and the client itself all report into the same book and the same drop count, so
`stats()` shows one `last_error` and one `dropped`, and the journal gets one warning per kind.

Locks: `_lock` guards the drop counters; it is a leaf (nothing is called while it is held), taken
with or without the client's `_send_lock` and `_lock`. The error book's lock is a leaf too.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Callable

from ..health.errorbook import ErrorBook

logger = logging.getLogger("yoloedge.publish.mqtt")

#: at most one "dropped messages" warning per this many seconds; the rest are summed into it.
DROP_LOG_INTERVAL_S = 10.0
#: an error of one kind that persists is logged as a warning again after this many seconds.
ERROR_REPEAT_LOG_S = 300.0


class ErrorKind(enum.Enum):
    """The kinds of error the log de-duplicates separately (health/errorbook.py), and what ends
    each one."""

    CONNECTION = "connection"  # cannot connect, refused, no CONNACK, lost: until a CONNACK
    REFUSED = "refused"  # the inbound guard dropped a connection: until one lasts FLAP_WINDOW_S
    UNSTABLE = "unstable"  # fresh connections closed again and again: the same
    ACK_STALL = "ack_stall"  # connected, but nothing acknowledged: until an acknowledgement
    SPOOL_WRITE = "spool_write"  # a message could not be appended: until one can
    DRAIN = "drain"  # the drain thread failed (spool read, fsync, delete): until a round works
    SPOOL_CLOSE = "spool_close"  # the final fsync at stop failed: holds (nothing follows)
    SPOOL_LOST = "spool_lost"  # messages found unreadable in the spool: an event
    INTERNAL = "internal"  # a bug caught in a callback or in stop(): an event


class Diagnostics:
    """The error book (`last_error`, one warning per kind) and the dropped-message count."""

    def __init__(self, broker: str, clock: Callable[[], float]):
        self.broker = broker
        self._clock = clock
        self.errors = ErrorBook(ERROR_REPEAT_LOG_S, clock)
        self._lock = threading.Lock()
        self._dropped = 0
        self._unlogged = 0
        self._last_log: float | None = None

    def record(self, kind: ErrorKind, message: str, active: bool = True) -> None:
        """Keep the error for stats(); warn when its kind is news (the first of its kind, or
        the first since that kind was resolved) and again every ERROR_REPEAT_LOG_S while it
        persists, with the count of the repeats in between: a long outage stays visible without
        a warning per retry, and two errors that alternate do not defeat that."""
        warn = self.errors.report(kind, message, active=active)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.warning("MQTT: %s%s", message, warn.suffix())

    def internal(self, message: str) -> None:
        """A bug caught (call it in the `except` block): logged with its traceback like any
        error kind, once and then once per ERROR_REPEAT_LOG_S, so a callback that fails on
        every packet cannot flood the journal."""
        warn = self.errors.report(ErrorKind.INTERNAL, message, active=False)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.exception("MQTT: %s%s", message, warn.suffix())

    def note_drop(self, reason: str, count: int = 1) -> None:
        """Count dropped messages; warn at most once per DROP_LOG_INTERVAL_S with the sum."""
        now = self._clock()
        with self._lock:
            self._dropped += count
            self._unlogged += count
            if self._last_log is not None and now - self._last_log < DROP_LOG_INTERVAL_S:
                return
            self._last_log = now
            count, self._unlogged = self._unlogged, 0
            total = self._dropped
        logger.warning("MQTT: dropped %d message(s): %s (%d dropped in total; broker %s)",
                       count, reason, total, self.broker)

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._dropped

    def take_unlogged(self) -> tuple[int, int]:
        """(drops not reported yet, drops in total); the former are reported from now on."""
        with self._lock:
            unlogged, self._unlogged = self._unlogged, 0
            return unlogged, self._dropped
