"""Waking an I/O thread that sleeps in select(): a non-blocking socket pair.

Handler threads, streams and `stop()` poke; the I/O thread drains. A poke never blocks: a full
wake socket means the I/O thread is already due to wake, so nothing is lost by not writing.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)

_DRAIN_BYTES = 4096


class Waker:
    """A socket pair: `reader` goes into the selector, `poke()` may be called from any thread."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        for end in (self.reader, self._writer):  # a full wake socket must never block a poke
            end.setblocking(False)

    def poke(self) -> None:
        """Wake the I/O thread; from any thread, never blocking, never raising. After `close()`
        (a handler finishing after stop) there is nobody to wake: that is logged, not raised."""
        try:
            self._writer.send(b"x")
        except BlockingIOError:
            pass  # the wake socket is full: the I/O thread is already due to wake
        except OSError as exc:
            log.debug("wake-up of an I/O thread failed: %s", exc)

    def drain(self) -> None:
        """I/O thread: read every poke so far, so the reader is not readable again at once."""
        try:
            while self.reader.recv(_DRAIN_BYTES):
                pass
        except BlockingIOError:
            return

    def close(self) -> None:
        self.reader.close()
        self._writer.close()
