"""Client side of the control socket (see `control.server` for the protocol).

Socket errors are turned into exceptions that say what the user should do: "not running"
and "not permitted" are the two everyday cases, and a raw `[Errno 13]` explains neither.
`timeout` bounds the whole exchange (connect, send, every read together), so a peer that
answers a byte at a time cannot hold `yoloedge-ctl` past it.
"""

from __future__ import annotations

import socket
import time
from typing import Generator

from ..errors import YoloedgeError
from .protocol import MAX_REPLY_DEPTH, MalformedMessage, decode_object, encode

#: largest reply accepted; a status report with hundreds of cameras stays far below it.
MAX_REPLY_BYTES = 16 * 1024 * 1024


class ControlError(YoloedgeError):
    """The daemon could not be asked, or its answer made no sense."""


class NotRunning(ControlError):
    """No daemon listens on the control socket (file missing, or nobody accepting)."""


class PermissionDenied(ControlError):
    """The socket (or a directory above it) is not accessible to this user."""


def request(path: str, payload: dict, timeout: float = 5.0) -> dict:
    """Send `payload` as one JSON line to the daemon at `path`; return its JSON reply.

    Raises NotRunning, PermissionDenied, or ControlError (no reply in `timeout` seconds,
    malformed reply).
    """
    line = encode(payload)
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        _connect(sock, path, deadline)
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(line)
            reply = _read_line(sock, deadline)
        except socket.timeout as exc:
            raise ControlError(f"yoloedge did not answer on {path} within {timeout:g} s") from exc
        except OSError as exc:
            raise ControlError(f"lost the connection to yoloedge at {path}: {exc}") from exc
    return _decode(reply, path)


def stream(path: str, payload: dict, timeout: float = 5.0) -> Generator[dict, None, None]:
    """Send `payload` (a streaming command: `watch`) and yield the daemon's reply, then every line
    it sends after it, until it closes the connection (or the caller stops iterating).

    `timeout` bounds the connection and the first reply only: a quiet camera may send nothing
    for hours. Raises what `request` raises.
    """
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        _connect(sock, path, deadline)
        buffer = bytearray()
        answered = False
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(encode(payload))
            while True:
                sock.settimeout(None if answered else _left(deadline))
                chunk = sock.recv(65536)
                if not chunk:
                    if not answered:
                        raise ControlError(f"yoloedge closed the connection on {path} without answering")
                    return
                buffer += chunk
                while (newline := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:newline])
                    del buffer[:newline + 1]
                    answered = True
                    yield _decode(line, path)
                if len(buffer) > MAX_REPLY_BYTES:
                    raise ControlError(f"a line from yoloedge is larger than {MAX_REPLY_BYTES} bytes")
        except socket.timeout as exc:
            raise ControlError(f"yoloedge did not answer on {path} within {timeout:g} s") from exc
        except OSError as exc:
            raise ControlError(f"lost the connection to yoloedge at {path}: {exc}") from exc


#: pause between connection attempts while the daemon's accept queue is full.
CONNECT_RETRY_S = 0.02


def _connect(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect, translating the errors a user meets into actionable messages.

    A Unix socket whose accept queue is full refuses at once with EAGAIN rather than waiting;
    a burst of other clients must not make that "cannot connect", so retry until `deadline`.
    """
    try:
        while True:
            try:
                sock.connect(path)
                return
            except BlockingIOError:
                if time.monotonic() + CONNECT_RETRY_S >= deadline:
                    raise socket.timeout("accept queue full") from None
                time.sleep(CONNECT_RETRY_S)
    except FileNotFoundError as exc:
        raise NotRunning(f"yoloedge is not running (no control socket at {path})") from exc
    except ConnectionRefusedError as exc:
        raise NotRunning(f"yoloedge is not running (nothing accepts connections on {path})") from exc
    except PermissionError as exc:
        raise PermissionDenied(
            f"access to the yoloedge control socket {path} not permitted: "
            "add your user to the 'yoloedge' group or use sudo") from exc
    except socket.timeout as exc:
        raise ControlError(f"yoloedge did not accept the connection on {path} in time") from exc
    except OSError as exc:
        raise ControlError(f"cannot connect to the yoloedge control socket {path}: {exc}") from exc


def _left(deadline: float) -> float:
    """Seconds to `deadline`; socket.timeout once it has passed (settimeout(0) would not block)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    return left


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    """Read up to the first newline (the protocol's reply terminator) or EOF, by `deadline`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(65536)
        if not chunk:
            break
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunks.append(chunk[:newline])
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise ControlError(f"reply from yoloedge is larger than {MAX_REPLY_BYTES} bytes")
    return b"".join(chunks)


def _decode(reply: bytes, path: str) -> dict:
    if not reply:
        raise ControlError(f"yoloedge closed the connection on {path} without answering")
    try:
        return decode_object(reply, MAX_REPLY_DEPTH)
    except MalformedMessage as exc:
        raise ControlError(f"malformed reply from yoloedge on {path}: {exc}") from exc
