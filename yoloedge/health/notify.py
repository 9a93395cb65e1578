"""Our own sd_notify: tell systemd when the daemon is ready, reloading, stopping or alive.

The protocol is one datagram of newline-separated `KEY=VALUE` lines to the socket systemd
names in `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading '@'). It is
small enough to write here, and that is why yoloedge does not depend on a library for it:

* `sdnotify` (0.3.2, its latest release) swallows every error unless in debug mode (then it
  raises from `notify`), returns nothing, encodes as Latin-1 (a STATUS= line naming a camera
  `Tür-Nord` is lost) and reads `NOTIFY_SOCKET` from the environment itself, once, when
  constructed. A watchdog ping that silently fails is exactly what a health protocol must not do.
* systemd-python's `systemd.daemon.notify` is a good wrapper of libsystemd's `sd_notify`, but it
  builds only against libsystemd's headers, and yoloedge must install with plain pip on boxes
  without them (it stays optional, for journald logging).

What this module adds: a return value, one logged warning per streak of failures, UTF-8, and the
environment read once by the daemon and passed in.

The daemon reads `NOTIFY_SOCKET` (and `WATCHDOG_USEC` / `WATCHDOG_PID`) from `os.environ`
once at start-up and passes them in; nothing here reads the environment.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable, Mapping

log = logging.getLogger(__name__)


def _monotonic_usec() -> int:
    """CLOCK_MONOTONIC in µs: the clock systemd compares MONOTONIC_USEC against."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def _address(socket_path: str | None) -> str | None:
    """systemd writes abstract socket names as '@name'; the kernel wants '\\0name'."""
    if not socket_path:
        return None
    if socket_path.startswith("@"):
        return "\0" + socket_path[1:]
    return socket_path


class SystemdNotifier:
    """Sends sd_notify messages; a no-op (every call returns False) without a socket.

    Failures (socket gone, EACCES) never raise: a notification that cannot be delivered must
    not take the daemon down. The first failure of a streak is logged as a warning, later
    ones at debug level, so a watchdog ping every few seconds cannot flood the journal.
    """

    def __init__(self, socket_path: str | None, *,
                 monotonic_usec: Callable[[], int] = _monotonic_usec) -> None:
        self.socket_path = socket_path or None
        self._address = _address(socket_path)
        self._monotonic_usec = monotonic_usec
        self._lock = threading.Lock()
        self._failing = False

    @property
    def enabled(self) -> bool:
        """True when started by systemd with a notify socket (Type=notify)."""
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send `assignments` ("READY=1", "STATUS=...") as one datagram; True if it was sent."""
        for item in assignments:
            if "=" not in item or "\n" in item:
                raise ValueError(f"not a single-line KEY=VALUE sd_notify assignment: {item!r}")
        if self._address is None:
            return False
        payload = "\n".join(assignments).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(payload, self._address)
        except OSError as exc:
            self._report_failure(exc)
            return False
        with self._lock:
            self._failing = False
        return True

    def _report_failure(self, exc: OSError) -> None:
        """Warn once per streak of failures, so an unreachable socket is noticed but not spammed."""
        with self._lock:
            first = not self._failing
            self._failing = True
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "cannot notify systemd via %s: %s", self.socket_path, exc)

    def ready(self, status: str | None = None) -> bool:
        """Start-up (or a reload) finished; systemd starts the watchdog after the first one."""
        return self.notify("READY=1", *_status(status))

    def status(self, text: str) -> bool:
        """Free-form one-line status shown by `systemctl status`."""
        return self.notify(*_status(text))

    def watchdog(self) -> bool:
        """Keep-alive ping; send it only while every worker makes progress."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown started; systemd stops expecting watchdog pings."""
        return self.notify("STOPPING=1", *_status(status))

    def reloading(self, status: str | None = None) -> bool:
        """Reload started; follow with `ready()` when done.

        MONOTONIC_USEC goes in the same datagram: Type=notify-reload (systemd >= 253) waits
        for it; older versions ignore the unknown key.
        """
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={self._monotonic_usec()}", *_status(status))


def _status(text: str | None) -> tuple[str, ...]:
    """STATUS= must be one line; fold newlines rather than fail on a multi-line error."""
    if text is None:
        return ()
    return ("STATUS=" + " ".join(text.splitlines()),)


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """How often to send WATCHDOG=1: half of WATCHDOG_USEC, or None when no watchdog is set.

    WATCHDOG_PID, when present, names the process the watchdog is meant for; a child that
    inherited the environment must not ping on its parent's behalf.
    """
    usec_text = environ.get("WATCHDOG_USEC")
    if not usec_text:
        return None
    pid_text = environ.get("WATCHDOG_PID")
    try:
        usec = int(usec_text)
        if pid_text and int(pid_text) != pid:
            return None
    except ValueError:
        log.warning("ignoring malformed watchdog environment WATCHDOG_USEC=%r WATCHDOG_PID=%r",
                    usec_text, pid_text)
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000
