"""One daemon per control socket: the lock file next to it, and the live-socket probe.

Two daemons with the same configuration would fight over the MQTT client id (the broker
disconnects one each time the other connects) and over the devices. The control socket path
is what identifies an instance, so it is also what excludes a second one:

* `<socket>.lock` is held with `flock` from before the socket is bound until the process ends
  (the kernel drops the lock with the process, however it dies, so a crash leaves no stale
  lock). Two daemons started at the same instant cannot both get it; the holder writes its
  pid into the file so the loser can name it. The file is never removed: unlinking a lock file
  lets a third process lock a fresh inode while the second still holds the old one.
* a socket file that accepts a connection, or refuses one because its accept queue is full,
  belongs to a live daemon even if that one holds no lock (an older version); the peer's pid
  comes from `SO_PEERCRED`. A socket file nobody
  accepts on is what a crash leaves behind and is replaced.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import time

from ..errors import YoloedgeError

log = logging.getLogger(__name__)

#: how long a loser waits for the lock holder to write its pid (it does so right after locking).
PID_WAIT_S = 1.0


class ControlServerError(YoloedgeError, OSError):
    """The control socket cannot be created (path in use by a live daemon, not a socket, ...).

    Also an OSError, like the errors of the directory creation in `ControlServer.start()`, so a
    caller can treat every "no control socket" failure alike.
    """


class AlreadyRunning(ControlServerError):
    """Another live daemon owns this control socket; this process must not start."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"another yoloedge is running with control socket {path} ({who}): the "
                         "socket is in use; stop that one first, or give this one another "
                         "control.socket")


def lock_path(socket_path: str) -> str:
    return socket_path + ".lock"


class InstanceLock:
    """The exclusive lock for one control socket path; `release()` is idempotent."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.path = lock_path(socket_path)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Lock, or raise AlreadyRunning (held by a live process) / ControlServerError (the file
        or its directory cannot be created: the daemon refuses to start then, since without the
        lock nothing keeps a second one out)."""
        if self._fd is not None:
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o755, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise ControlServerError(f"cannot create lock file {self.path}: {exc.strerror or exc}; the "
                                     "directory of control.socket must be writable by this user") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_from(fd)
            os.close(fd)
            raise AlreadyRunning(self.socket_path, pid) from None
        except OSError as exc:
            os.close(fd)
            raise ControlServerError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            log.warning("cannot write the pid into %s: %s", self.path, exc)  # the lock still holds
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _pid_from(fd: int) -> int | None:
    """The holder's pid, waiting briefly: it writes the pid just after taking the lock."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return None
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a crashed daemon; AlreadyRunning if one answers on it.

    Never removes a non-socket (a mistyped path must not delete a user's file).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ControlServerError(f"control socket path {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        pid = peer_pid(probe)
    except ConnectionRefusedError:
        log.info("removing stale control socket %s", path)
        os.unlink(path)
        return
    except (socket.timeout, BlockingIOError):
        pid = None  # a full accept queue (a Unix socket refuses with EAGAIN): alive, just busy
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise ControlServerError(f"cannot check existing control socket {path}: {exc}") from exc
        return
    finally:
        probe.close()
    raise AlreadyRunning(path, pid)


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a connected Unix socket (Linux SO_PEERCRED)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    pid, _uid, _gid = struct.unpack("3i", creds)
    return pid or None
