"""Redact what native code writes to file descriptor 2.

FFmpeg and OpenCV print their own messages with `fprintf(stderr, ...)`, straight to fd 2: Python's
logging and its redaction never see them. Under systemd fd 2 is the journal stream, so an RTSP
server that echoes the request URL in its error reply (`[rtsp @ 0x..] method OPTIONS failed: 454
(... password=...)`), or OPENCV_LOG_LEVEL=DEBUG / OPENCV_VIDEOIO_DEBUG=1 printing every camera URL,
would put a password in the journal.

`StderrGuard` keeps a duplicate of the real fd 2 and puts a pipe in its place; a reader thread
splits what arrives into lines, passes each through `redact_text` and `printable` (control
characters as escapes) and writes it to the real fd 2 -- the same target as before. Python's own
stderr log passes through too; redacting it twice changes nothing.

What can go wrong, and what then happens:

- the reader thread fails: it writes one line saying so to the real fd 2 and puts the real fd 2
  back, so writers are never blocked forever on a full pipe (later native messages are then no
  longer redacted: a leak is the lesser harm than a daemon hung in a `write`);
- shutdown (`remove`): what is already in the pipe is written out first (bounded by
  `flush_timeout_s`), then fd 2 is restored and the reader drains the rest and stops;
- a crash: faulthandler writes to the real fd 2, not into a pipe whose reader is dead with the
  process;
- a line longer than `max_line` bytes (no newline for 64 KiB): its first `max_line` bytes are
  written, marked as cut, and the rest up to the next newline is dropped, so memory stays bounded.
"""

from __future__ import annotations

import faulthandler
import fcntl
import os
import select
import sys
import termios
import threading
import time
from typing import Callable

from ..redact import redact_text
from ..textsafe import printable

STDERR = 2
#: longest line kept whole; the rest of a longer one is dropped (see the module docstring).
MAX_LINE_BYTES = 64 * 1024
#: how long `remove` waits for the reader to write out what is in the pipe.
FLUSH_TIMEOUT_S = 2.0
#: how often the reader looks whether it is asked to stop while the pipe is quiet.
_POLL_S = 0.1
CUT_MARK = " [line cut]"


def safe_line(text: str) -> str:
    """How one line of native stderr output reaches the journal: secrets and URL credentials
    hidden, control characters escaped (the newline kept)."""
    return printable(redact_text(text), keep_newlines=True)


class StderrGuard:
    """Fd 2 through a redacting pipe, from `install` until `remove`; see the module docstring.

    `transform` is the per-line filter (`safe_line`); tests hand in one that fails.
    """

    def __init__(self, transform: Callable[[str], str] = safe_line, max_line: int = MAX_LINE_BYTES,
                 flush_timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        self._transform = transform
        self._max_line = max_line
        self._flush_timeout_s = flush_timeout_s
        self._real: int | None = None
        self._read_end: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._idle = threading.Event()  # set while the reader holds no bytes it has not written out
        self._idle.set()
        self._restore_lock = threading.Lock()
        self._restored = True
        self._faulthandler_was_enabled = False

    @property
    def active(self) -> bool:
        """Whether fd 2 is the guarded pipe (False before `install`, after `remove` or a failure)."""
        return not self._restored

    def install(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the stderr guard is installed already")
        sys.stderr.flush()
        self._real = os.dup(STDERR)
        read_end, write_end = os.pipe()
        self._read_end = read_end
        os.dup2(write_end, STDERR)
        os.close(write_end)
        self._restored = False
        self._faulthandler_was_enabled = faulthandler.is_enabled()
        faulthandler.enable(file=self._real, all_threads=True)
        self._thread = threading.Thread(target=self._run, name="stderr-guard", daemon=True)
        self._thread.start()

    def remove(self) -> None:
        """Write out what is in the pipe (bounded), restore fd 2, and stop the reader."""
        thread = self._thread
        if thread is None:
            return
        sys.stderr.flush()
        deadline = time.monotonic() + self._flush_timeout_s
        while (thread.is_alive() and (self._pending() or not self._idle.is_set())
               and time.monotonic() < deadline):
            time.sleep(0.01)
        self._restore()
        self._stop.set()
        thread.join(max(0.0, deadline - time.monotonic()) + _POLL_S * 2)
        if thread.is_alive():
            return  # stuck writing to the real fd 2: leave its descriptors to the exiting process
        self._thread = None
        for fd in (self._read_end, self._real):
            if fd is not None:
                os.close(fd)
        self._read_end = self._real = None

    def _pending(self) -> int:
        """Bytes waiting in the pipe."""
        if self._read_end is None:
            return 0
        buf = bytearray(4)
        fcntl.ioctl(self._read_end, termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)

    def _restore(self) -> None:
        """Fd 2 back to the real target, and faulthandler as it was; once, from either thread."""
        with self._restore_lock:
            if self._restored or self._real is None:
                return
            self._restored = True
            os.dup2(self._real, STDERR)
            if self._faulthandler_was_enabled:
                faulthandler.enable(file=STDERR, all_threads=True)
            else:
                faulthandler.disable()

    def _run(self) -> None:
        try:
            self._pump()
        except BaseException as exc:  # noqa: BLE001 -- reported on the real fd 2, then fd 2 restored
            self._restore()
            self._write(f"yoloedge: stderr guard stopped ({type(exc).__name__}); native messages are "
                        f"no longer redacted\n".encode())
            self._drain_discarding()

    def _pump(self) -> None:
        read_end = self._read_end
        if read_end is None:
            return
        pending = b""
        dropping = False  # inside the dropped rest of a cut line
        while True:
            ready, _, _ = select.select([read_end], [], [], _POLL_S)
            if not ready:
                if self._stop.is_set():
                    break
                continue
            self._idle.clear()
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            pending += chunk
            while True:
                newline = pending.find(b"\n")
                if newline == -1:
                    if len(pending) > self._max_line:
                        if not dropping:
                            self._emit(pending[:self._max_line] + CUT_MARK.encode() + b"\n")
                        dropping = True
                        pending = b""
                    break
                line, pending = pending[:newline + 1], pending[newline + 1:]
                if not dropping:
                    self._emit(line if len(line) <= self._max_line + 1
                               else line[:self._max_line] + CUT_MARK.encode() + b"\n")
                dropping = False
            self._idle.set()  # a partial line is held until its newline, or until the reader stops
        if pending and not dropping:
            self._emit(pending)

    def _emit(self, line: bytes) -> None:
        self._write(self._transform(line.decode("utf-8", "replace")).encode("utf-8", "replace"))

    def _write(self, data: bytes) -> None:
        real = self._real
        if real is None:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(real, view):]

    def _drain_discarding(self) -> None:
        """After a failure: read the pipe until every write end is gone, so that a writer blocked
        on a full pipe wakes up; what it wrote is dropped, not shown unredacted."""
        read_end = self._read_end
        if read_end is None:
            return
        while os.read(read_end, 65536):
            pass
