"""The daemon's control socket: `yoloedge-ctl` asks for status or a reload through it.

A Unix stream socket rather than TCP: access is governed by the file's owner and mode
(0660, group `yoloedge`), nothing listens on the network, and no authentication is needed.

Protocol: the client sends one JSON object per line, e.g. `{"cmd": "status"}`; the server
answers each with one JSON line, whatever `handler(request)` returned. A line that is not a
JSON object with a string "cmd" gets `{"ok": false, "error": "..."}`, and so does a request
whose handler raised (the exception is logged; the server keeps serving). A client that sends
nothing for `client_timeout_s` is disconnected, so a stuck client cannot pin a thread.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import socket
import stat
import threading
from typing import BinaryIO, Callable

from ..errors import YoloedgeError

log = logging.getLogger(__name__)

Handler = Callable[[dict], dict]

DEFAULT_MODE = 0o660
#: one request line may be at most this long; the protocol's requests are tiny.
MAX_REQUEST_BYTES = 64 * 1024
#: connections served at once; more are answered "busy" (a loop of `yoloedge-ctl` calls must
#: not exhaust threads).
MAX_CLIENTS = 16


class ControlServerError(YoloedgeError, OSError):
    """The control socket cannot be created (path in use by a live daemon, not a socket, ...).

    Also an OSError, like the errors of the directory creation in `start()`, so a caller can
    treat every "no control socket" failure alike.
    """


class ControlServer:
    """Serves `handler` on a Unix stream socket at `path`, one daemon thread per client.

    `start()` and `stop()` are idempotent; `stop()` removes the socket file (if it is still
    the one this server created).
    """

    def __init__(self, path: str, mode: int, handler: Handler, *,
                 client_timeout_s: float = 5.0) -> None:
        self.path = path
        self.mode = mode
        self.handler = handler
        self.client_timeout_s = client_timeout_s
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._identity: tuple[int, int] | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Create the parent directory, replace a stale socket file, bind, chmod, listen."""
        with self._lock:
            if self._listener is not None:
                return
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o755, exist_ok=True)
            _remove_stale(self.path)
            listener = _bind(self.path, self.mode)
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._listener = listener
            self._wake = socket.socketpair()
            self._thread = threading.Thread(target=self._accept_loop, args=(listener, self._wake[0]),
                                            name="control-accept", daemon=True)
            self._thread.start()
        log.info("control socket listening at %s (mode %o)", self.path, self.mode)

    def stop(self) -> None:
        """Stop accepting, close the socket and remove its file; clients being served finish."""
        with self._lock:
            listener, wake, thread = self._listener, self._wake, self._thread
            if listener is None or wake is None or thread is None:
                return
            self._listener = self._wake = self._thread = None
            wake[1].send(b"x")
            thread.join()
            listener.close()
            wake[0].close()
            wake[1].close()
            self._unlink_own_socket()

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _unlink_own_socket(self) -> None:
        """Remove the socket file unless another process has since replaced it with its own."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return
        if (info.st_dev, info.st_ino) == self._identity:
            os.unlink(self.path)

    def _accept_loop(self, listener: socket.socket, wake: socket.socket) -> None:
        """Accept until `stop()` writes to the wake socket."""
        while True:
            readable, _, _ = select.select([listener, wake], [], [])
            if wake in readable:
                return
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                log.warning("control socket accept failed: %s", exc)
                continue
            if not self._slots.acquire(blocking=False):
                _reply_and_close(conn, {"ok": False, "error": "server busy, try again"})
                continue
            threading.Thread(target=self._serve_client, args=(conn,), name="control-client",
                             daemon=True).start()

    def _serve_client(self, conn: socket.socket) -> None:
        """Answer each request line until the client closes, misbehaves or goes quiet."""
        try:
            with conn:
                conn.settimeout(self.client_timeout_s)
                with conn.makefile("rb") as reader:
                    self._serve_lines(conn, reader)
        except socket.timeout:
            log.debug("control client sent nothing for %.1f s; disconnected", self.client_timeout_s)
        except (BrokenPipeError, ConnectionResetError) as exc:
            log.debug("control client went away: %s", exc)
        except OSError as exc:
            log.warning("control client connection failed: %s", exc)
        finally:
            self._slots.release()

    def _serve_lines(self, conn: socket.socket, reader: BinaryIO) -> None:
        while True:
            line = reader.readline(MAX_REQUEST_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_REQUEST_BYTES:
                _send(conn, {"ok": False, "error": f"request longer than {MAX_REQUEST_BYTES} bytes"})
                return
            if line.strip():
                _send(conn, self._answer(line))

    def _answer(self, line: bytes) -> dict:
        """The reply to one request line; never raises."""
        request, error = parse_request(line)
        if request is None:
            return {"ok": False, "error": error}
        try:
            reply = self.handler(request)
            if not isinstance(reply, dict):
                raise TypeError(f"handler returned {type(reply).__name__}, not a dict")
            json.dumps(reply)
        except Exception as exc:  # noqa: BLE001 -- one bad request must not kill the server
            log.exception("control request %r failed", request.get("cmd"))
            return {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
        return reply


def parse_request(line: bytes) -> tuple[dict | None, str]:
    """(request, "") for a well-formed line, else (None, why it was rejected)."""
    try:
        request = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"malformed request: not JSON ({exc})"
    if not isinstance(request, dict):
        return None, "malformed request: expected a JSON object"
    if not isinstance(request.get("cmd"), str):
        return None, 'malformed request: missing "cmd" string'
    return request, ""


def _send(conn: socket.socket, reply: dict) -> None:
    conn.sendall(json.dumps(reply).encode("utf-8") + b"\n")


def _reply_and_close(conn: socket.socket, reply: dict) -> None:
    """Best effort: the client may already be gone, which is fine for a rejection."""
    with conn:
        try:
            conn.settimeout(1.0)
            _send(conn, reply)
        except OSError as exc:
            log.debug("could not send rejection to control client: %s", exc)


def _remove_stale(path: str) -> None:
    """Remove a socket file left by a crashed daemon, but never a live daemon's or a non-socket."""
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
    except ConnectionRefusedError:
        log.info("removing stale control socket %s", path)
        os.unlink(path)
        return
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise ControlServerError(f"cannot check existing control socket {path}: {exc}") from exc
        return
    finally:
        probe.close()
    raise ControlServerError(f"control socket {path} is in use: is another yoloedge running?")


def _bind(path: str, mode: int) -> socket.socket:
    """Bind, chmod, then listen: nobody can connect before the mode is right."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as exc:
        listener.close()
        raise ControlServerError(f"cannot bind control socket {path}: {exc}") from exc
    try:
        os.chmod(path, mode)
        listener.listen(MAX_CLIENTS)
    except OSError as exc:
        listener.close()
        os.unlink(path)
        raise ControlServerError(f"cannot set up control socket {path}: {exc}") from exc
    return listener
