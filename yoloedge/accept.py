"""accept() on a listener when the process runs out of file descriptors (EMFILE, ENFILE).

The HTTP endpoint and the control socket each accept on a non-blocking listener that a
level-triggered selector watches. When accept() fails for want of a descriptor, the connection
stays in the backlog, so the listener stays readable and the loop wakes again at once: one
connection attempt became twenty warnings a second that never stopped, and the client hung
unanswered until it gave up. `Acceptor` is what both do instead:

- First its owner may make room (`shed`: close one connection that is still waiting for its
  request), and then accepts as usual.
- Else, as libev and nginx do, it spends a reserve descriptor (an open /dev/null): close it,
  accept each waiting connection into the freed slot, send it a short refusal and close it
  (the client learns at once), then open the reserve again.
- Then it stops watching the listener for a pause that doubles with each failure in a row
  (`Backoff`: PAUSE_FIRST_S to PAUSE_MAX_S), so a lasting shortage costs one try per pause, not
  a spin; the first accept that works ends the shortage and the pauses start over.
- It logs the failure once, then at most once every REPORT_EVERY_S with the count since, and
  once when accepting works again; `stats()` gives the counts for the daemon's status.

One owner (the I/O thread) calls everything but `stats()`, which only reads numbers that the
owner replaces whole.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import time
from typing import Any, Callable

from .backoff import Backoff
from .timeutil import utc_timestamp

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: accept() errors that leave the connection in the backlog until a descriptor is free.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
#: accept() errors about the one connection, which the kernel has already taken off the backlog.
CLIENT_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.ECONNRESET, errno.EPERM})
PAUSE_FIRST_S = 0.05
PAUSE_MAX_S = 2.0
REPORT_EVERY_S = 60.0
#: a failure this recent, with no accept since, makes the listener "failing" in status.
FAILING_FOR_S = 60.0
#: connections refused with the reserve descriptor per failure (the rest wait for the next try).
MAX_REFUSED_AT_ONCE = 64
#: accept() tries per call: each retry follows room made (by `shed`, or a descriptor freed), and
#: room that is taken again each time must not keep the I/O thread here.
MAX_TRIES = 64
_DRAIN_BYTES = 65536


class Acceptor:
    """accept() for one listener (see the module docstring). `what` names it in the log,
    `refusal` is what a connection refused for want of a descriptor gets before it is closed."""

    def __init__(self, what: str, refusal: bytes, clock: Clock = time.monotonic,
                 wall: Clock = time.time) -> None:
        self.what = what
        self._refusal = refusal
        self._clock = clock
        self._wall = wall
        self._backoff = Backoff(PAUSE_FIRST_S, PAUSE_MAX_S)
        self._reserve: int | None = None
        self._take_reserve()
        self._paused: selectors.SelectorKey | None = None
        self._resume_at = 0.0
        # counts and times: replaced whole by the owner, read by stats() from any thread
        self.failures = 0  # accept() calls that failed for want of a resource
        self.refused = 0  # connections accepted with the reserve descriptor and closed
        self._last_failure: float | None = None  # clock
        self._last_failure_wall: float | None = None
        self._last_error = ""
        self._failing = False  # a failure, and no accept that worked since
        self._reported_at: float | None = None  # clock of the last warning line
        self._shortage_reported = False  # a warning line since accepting last worked
        self._unreported = 0  # failures since that line

    # -- the owner's calls -----------------------------------------------------------------------
    def accept(self, selector: selectors.BaseSelector, listener: socket.socket,
               shed: Callable[[], bool] | None = None) -> tuple[socket.socket, Any] | None:
        """The next waiting connection, or None when there is none to serve now (none waits, its
        client already left, or the process is short of descriptors: then the listener is paused).
        `shed()` closes one connection of the owner's to make room, and says whether it did."""
        for _ in range(MAX_TRIES):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                if exc.errno in CLIENT_GONE:
                    log.debug("%s: a client left before it was accepted: %s", self.what, exc)
                    return None
                self._failed(exc)
                if shed is not None and shed():  # room made: try again
                    continue
                self._pause(selector, listener)  # from now, not from when the refused clients were told
                if exc.errno in OUT_OF_DESCRIPTORS and self._refuse_waiting(listener):
                    self._unpause(selector)  # a descriptor was freed meanwhile: accept as usual
                    continue
                return None
            self._worked()
            return sock, address
        self._pause(selector, listener)  # room was made again and again, and taken again: rest
        return None

    def resume(self, selector: selectors.BaseSelector) -> None:
        """Watch the listener again once its pause is over (call it every turn of the loop)."""
        if self._paused is not None and self._clock() >= self._resume_at:
            self._unpause(selector)

    def wait_s(self) -> float | None:
        """How long the loop may sleep before `resume` has work (None: no pause)."""
        if self._paused is None:
            return None
        return max(0.0, self._resume_at - self._clock())

    def close(self) -> None:
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def stats(self) -> dict:
        """For the daemon's status: failed accepts, connections refused, the last failure (UTC),
        and whether accepting is failing now."""
        last, wall = self._last_failure, self._last_failure_wall
        return {"accept_failures": self.failures, "refused": self.refused,
                "last_accept_failure": None if wall is None else utc_timestamp(wall),
                "accept_failing": self._failing and last is not None and self._clock() - last < FAILING_FOR_S,
                "accept_error": self._last_error or None}

    # -- inside ----------------------------------------------------------------------------------
    def _failed(self, exc: OSError) -> None:
        now = self._clock()
        self.failures += 1
        self._last_failure, self._last_failure_wall = now, self._wall()
        self._last_error = exc.strerror or str(exc)
        self._unreported += 1
        if self._reported_at is None or now - self._reported_at >= REPORT_EVERY_S:
            earlier = self._unreported - 1
            log.warning("%s: cannot accept connections: %s; refusing new ones until it can (a shortage "
                        "of file descriptors: raise LimitNOFILE= or ulimit -n)%s", self.what, self._last_error,
                        f"; {earlier} more failed accepts since the last report" if earlier else "")
            self._reported_at, self._unreported = now, 0
            self._shortage_reported = True
        self._failing = True

    def _worked(self) -> None:
        if not self._failing:
            return
        self._failing = False
        self._backoff.reset()
        if self._shortage_reported:  # not after every shortage: one line per report at most
            self._shortage_reported = False
            log.info("%s: accepting connections again (%d failed accepts and %d connections refused so far)",
                     self.what, self.failures, self.refused)

    def _refuse_waiting(self, listener: socket.socket) -> bool:
        """Spend the reserve descriptor on each waiting connection in turn (accept, refuse, close)
        while the process is still short; True when it no longer is."""
        for _ in range(MAX_REFUSED_AT_ONCE):
            if self._has_spare():
                return True
            if self._reserve is None:
                return False
            os.close(self._reserve)
            self._reserve = None
            try:
                sock, _ = listener.accept()
            except OSError:  # none waits any more (BlockingIOError), or the slot was taken meanwhile
                sock = None
            if sock is not None:
                self.refused += 1
                _refuse(sock, self._refusal)
            self._take_reserve()
            if sock is None:
                return False
        return False

    def _has_spare(self) -> bool:
        """Whether a file besides the reserve can be opened now. Opened, not dup()ed: a dup needs
        only a slot in this process's table, so it works under ENFILE (the system's table full),
        where accept() still fails."""
        self._take_reserve()
        if self._reserve is None:
            return False
        try:
            os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return False
        return True

    def _unpause(self, selector: selectors.BaseSelector) -> None:
        key, self._paused = self._paused, None
        if key is not None:
            selector.register(key.fileobj, key.events, key.data)

    def _pause(self, selector: selectors.BaseSelector, listener: socket.socket) -> None:
        if self._paused is None:
            self._paused = selector.unregister(listener)
        self._resume_at = self._clock() + self._backoff.next_delay()

    def _take_reserve(self) -> None:
        if self._reserve is not None:
            return
        try:
            self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # still short: the next failure tries again
            log.debug("%s: no reserve descriptor yet: %s", self.what, exc)


def _refuse(sock: socket.socket, refusal: bytes) -> None:
    """Read what the client sent (so that closing sends a FIN, not a reset that could discard the
    refusal), send the refusal, close; never blocks."""
    try:
        sock.setblocking(False)
        try:
            sock.recv(_DRAIN_BYTES)
        except BlockingIOError:
            pass  # it has sent nothing yet
        sock.send(refusal)
    except OSError as exc:
        log.debug("a refused client went away: %s", exc)
    finally:
        sock.close()
