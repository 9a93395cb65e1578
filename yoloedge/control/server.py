"""The daemon's control socket: `yoloedge-ctl` asks for status or a reload through it.

A Unix stream socket rather than TCP: access is governed by the file's owner and mode
(0660, group `yoloedge`), nothing listens on the network, and no authentication is needed.
Anyone in the group can still connect, so every input is treated as hostile.

Protocol (`control.protocol`): the client sends one JSON object per line, e.g.
`{"cmd": "status"}`; the server answers each with one JSON line, whatever `handler(request)`
returned. Every malformed request is answered with `{"ok": false, "error": "..."}`: not UTF-8,
not JSON, nested too deeply, a number too long or not finite, a key given twice, not an object
with a string "cmd", a handler that raised (logged; the server keeps serving). A request line longer than
`MAX_REQUEST_BYTES`, or one not complete `client_timeout_s` after the server started waiting
for it, is answered and the connection closed (the stream cannot be trusted past it). A client
that has sent nothing by then is closed without a word.

Design (the loop and its bounds are `netio.multiplex`'s; this module frames, dispatches and
answers): one I/O thread multiplexes every connection with non-blocking sockets, and only a
complete, parsed request costs a thread (at most `MAX_HANDLERS` at once; more wait their turn,
and are answered "busy" if it does not come by their deadline). Commands named `slow` (a reload,
which waits for the main loop) have handler slots of their own, so however many of them wait,
`status` is never queued behind them. A client that dribbles a byte every few seconds therefore
holds no thread, and the deadline covers the whole request (the sum of its reads and its wait
for a handler), not each read. At most `MAX_CONNECTIONS` connections are kept; a new one evicts
the connection that has waited longest for its request (else, when none is still reading, the
oldest), so a crowd of slow or silent clients can delay `yoloedge-ctl` by nothing more than one
accept. A thread per connection with per-read timeouts, as before, let 16 slow clients take
every slot. Replies are written by the I/O thread too, under the same deadline, so a client that
never reads its reply pins nothing either.

Pipelined lines are served by a loop, never by recursion: a reply that cannot be written at once
resumes the loop only when the socket becomes writable. A connection that sends
`MAX_MALFORMED_LINES` malformed lines is answered and closed: no client of the protocol does
that, and the lines behind it are more of the same.

Streaming commands (`streams=`, e.g. `watch`, see `control.watch`) are opened on the I/O thread and
hold no handler: after the first reply the connection carries the stream's lines, written by the
I/O thread as the socket takes them (its send buffer kept small), until the client disconnects. A
watcher that stops reading fills its own bounded queue, which drops its oldest lines; nothing waits
for it, so `status` and the pipeline go on.

Out of file descriptors, accept() is `accept.Acceptor`'s: the oldest connection still waiting
for its request makes room, else the new one is told and closed with a reserve descriptor, and
the listener rests for a growing pause instead of waking the loop again at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping

from ..accept import Acceptor
from ..netio.connection import Connection, Phase, Stream
from ..netio.lanes import LaneLimit
from ..netio.multiplex import Limits, Multiplexer, Service
from .instance import (AlreadyRunning, ControlServerError, InstanceLock, lock_path,
                       remove_stale_socket)
from .protocol import (MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH, MalformedMessage, decode_object, encode,
                       quoted_name)

__all__ = ["AlreadyRunning", "ControlServer", "ControlServerError", "Handler", "MAX_CONNECTIONS",
           "MAX_HANDLERS", "MAX_REQUEST_BYTES", "lock_path", "parse_request"]

log = logging.getLogger(__name__)

Handler = Callable[[dict], dict]
Clock = Callable[[], float]

DEFAULT_MODE = 0o660
#: connections kept open at once; beyond it the one waiting longest for its request is dropped.
MAX_CONNECTIONS = 64
#: requests being handled at once, per lane (quick, slow); more wait in line, and are answered
#: "busy" if no handler of their lane is free by their deadline.
MAX_HANDLERS = 4
#: malformed request lines after which a connection is closed (after answering the last one).
MAX_MALFORMED_LINES = 16
_RECV_BYTES = 65536
#: kernel send buffer of a streaming connection: what a stuck watcher can pin besides its queue.
STREAM_SNDBUF_BYTES = 32 * 1024


#: streams[cmd](request, wake) -> (first reply, Stream or None when refused). Runs on the I/O
#: thread, so it must be quick; the stream calls `wake()` when lines arrive in an empty queue.
StreamOpener = Callable[[dict, Callable[[], None]], "tuple[dict, Stream | None]"]


class Lane(Enum):
    """Which handler slots a request uses: slow commands cannot take the quick ones."""
    QUICK = "quick"
    SLOW = "slow"


@dataclass(eq=False)
class _Client(Connection):
    malformed: int = 0  # malformed lines so far


class ControlServer:
    """Serves `handler` on a Unix stream socket at `path` (see the module docstring).

    `start()` and `stop()` are idempotent; `stop()` removes the socket file (if it is still the
    one this server created) and drops open connections. `start()` raises AlreadyRunning when
    another live process owns the path. `clock` is injectable so tests can move deadlines.

    `instance`: an InstanceLock the caller already holds and keeps (the daemon holds it for its
    whole life, socket or not); without one the server takes its own and releases it on stop.
    `slow`: commands that may wait long (see the module docstring).
    """

    def __init__(self, path: str, mode: int, handler: Handler, *,
                 client_timeout_s: float = 5.0, clock: Clock = time.monotonic,
                 instance: InstanceLock | None = None, slow: frozenset[str] = frozenset(),
                 streams: Mapping[str, StreamOpener] | None = None) -> None:
        self.path = path
        self.mode = mode
        self.handler = handler
        self.client_timeout_s = client_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._owns_instance = instance is None
        self._instance = instance or InstanceLock(path)
        self.slow = slow
        self.streams = dict(streams or {})
        self._identity: tuple[int, int] | None = None
        self._mux: Multiplexer[_Client] | None = None  # from start() to stop()
        self.acceptor: Acceptor | None = None  # from start(); its stats() for the daemon's status

    @property
    def running(self) -> bool:
        return self._mux is not None

    def start(self) -> None:
        """Take the instance lock (creating the directory), replace a stale socket, bind."""
        with self._lock:
            if self._mux is not None:
                return
            self._instance.acquire()  # creates the parent directory
            try:
                remove_stale_socket(self.path)
                mux = self._serve(_bind(self.path, self.mode))
            except BaseException:
                if self._owns_instance:
                    self._instance.release()
                raise
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._mux, self.acceptor = mux, mux.acceptor
            mux.start()
        log.info("control socket listening at %s (mode %o)", self.path, self.mode)

    def _serve(self, listener: socket.socket) -> Multiplexer[_Client]:
        """The I/O thread's multiplexer, made before it starts: out of file descriptors, `start()`
        fails (the caller logs it) rather than the thread dying on its own."""
        limits = Limits(MAX_CONNECTIONS, self.client_timeout_s, dict.fromkeys(Lane, LaneLimit(MAX_HANDLERS)),
                        recv_bytes=_RECV_BYTES, deadline_covers_handler=False,
                        evicted_notice=encode(_error("too many connections; dropped the one waiting longest")))
        service = Service(_Client, self._next_request, self._expired)
        try:
            return Multiplexer("control", "control socket", listener, service, limits,
                               refusal=encode(_error(OUT_OF_DESCRIPTORS)), clock=self.clock)
        except OSError as exc:
            listener.close()
            os.unlink(self.path)
            raise ControlServerError(f"cannot set up control socket {self.path}: {exc}") from exc

    def stop(self) -> None:
        """Stop serving, close the socket and remove its file, then release the instance lock
        (unless the caller passed it in: then it is the caller's to release)."""
        with self._lock:
            mux, self._mux = self._mux, None
            if mux is None:
                return
            mux.stop()
            self._unlink_own_socket()
            if self._owns_instance:
                self._instance.release()

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

    def stats(self) -> dict:
        """For the daemon's status: the socket's path and how its accept() fares."""
        acceptor = self.acceptor
        return {"socket": self.path, **(acceptor.stats() if acceptor is not None else {})}

    # -- the I/O thread: framing ----------------------------------------------------------------
    def _next_request(self, conn: _Client) -> None:
        """Dispatch the complete lines in the buffer while their replies go out at once; then
        keep reading (or close). The only place that dispatches, and nothing it calls comes back
        here: a thousand pipelined lines are a thousand turns of this loop, not a deep stack."""
        mux = self._mux
        while mux is not None and conn.phase is Phase.READING and not conn.closed:
            newline = conn.buffer.find(b"\n", 0, MAX_REQUEST_BYTES + 1)
            if newline < 0 and len(conn.buffer) > MAX_REQUEST_BYTES or newline > MAX_REQUEST_BYTES:
                self._reply(conn, _error(f"request longer than {MAX_REQUEST_BYTES} bytes"), close=True)
                return
            if newline < 0:
                if conn.eof:  # a last request without its newline is still a request
                    line = bytes(conn.buffer)
                    conn.buffer.clear()
                    if line.strip():
                        self._dispatch(mux, conn, line, close=True)
                    else:
                        mux.close(conn)
                return
            line = bytes(conn.buffer[:newline])
            del conn.buffer[:newline + 1]
            if line.strip():
                self._dispatch(mux, conn, line, close=False)

    def _dispatch(self, mux: Multiplexer[_Client], conn: _Client, line: bytes, close: bool) -> None:
        request, error = parse_request(line)
        if request is None:
            conn.malformed += 1
            if conn.malformed >= MAX_MALFORMED_LINES:
                error += f"; {MAX_MALFORMED_LINES} malformed requests, closing the connection"
                close = True
            self._reply(conn, _error(error), close=close)
            return
        opener = self.streams.get(request["cmd"])
        if opener is not None:
            self._open_stream(mux, conn, request, opener, close)
            return
        conn.close_after = close
        mux.submit(conn, Lane.SLOW if request["cmd"] in self.slow else Lane.QUICK,
                   lambda: self._handle(conn, request))  # a lane's line is never full: connections bound it

    def _handle(self, conn: _Client, request: dict) -> Callable[[], None]:
        """Handler thread: compute the reply; the I/O thread writes it (the completion returned)."""
        try:
            data = encode(self._answer(request))
        except (TypeError, ValueError) as exc:
            log.error("control request %r: reply is not JSON: %s", request.get("cmd"), exc)
            data = encode(_error(f"internal error: reply is not JSON: {exc}"))
        return lambda: self._replied(conn, data)

    def _answer(self, request: dict) -> dict:
        """The reply to one request; never raises."""
        try:
            reply = self.handler(request)
            if not isinstance(reply, dict):
                raise TypeError(f"handler returned {type(reply).__name__}, not a dict")
        except Exception as exc:  # noqa: BLE001 -- one bad request must not kill the server
            log.exception("control request %r failed", request.get("cmd"))
            return _error(f"internal error: {type(exc).__name__}: {exc}")
        return reply

    def _replied(self, conn: _Client, data: bytes) -> None:
        self._send(conn, data, close=conn.close_after)
        self._next_request(conn)

    def _reply(self, conn: _Client, reply: dict, close: bool) -> None:
        self._send(conn, encode(reply), close)

    def _send(self, conn: _Client, data: bytes, close: bool) -> None:
        """Start writing a reply, under a deadline of its own; the caller goes on to the next request."""
        mux = self._mux
        if mux is not None:
            conn.deadline = mux.deadline()
            mux.send(conn, data, close)

    def _open_stream(self, mux: Multiplexer[_Client], conn: _Client, request: dict, opener: StreamOpener,
                     close: bool) -> None:
        """Opened here on the I/O thread, not by a handler: opening is a lookup and a queue, and a
        stream must not hold a handler slot for its whole life."""
        if close:  # the client has shut its side: its leaving could not be noticed
            self._reply(conn, _error(f"{quoted_name(request['cmd'])} streams until the client disconnects; "
                                     "keep the connection open"), close=True)
            return
        try:
            reply, stream = opener(request, mux.poke)
        except Exception as exc:  # noqa: BLE001 -- one bad request must not kill the server
            log.exception("control request %r failed", request.get("cmd"))
            reply, stream = _error(f"internal error: {type(exc).__name__}: {exc}"), None
        if stream is not None:
            conn.stream = stream
            try:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF_BYTES)
            except OSError as exc:
                log.debug("control socket: cannot bound a stream's send buffer: %s", exc)
        self._reply(conn, reply, close=False)
        self._next_request(conn)

    def _expired(self, conn: _Client) -> None:
        """The per-request deadline: answer a partial request or a queued one, drop everything else."""
        mux = self._mux
        if mux is None:
            return
        if conn.phase is Phase.QUEUED:
            mux.lanes.withdraw(conn)
            self._reply(conn, _error("server busy, try again"), close=conn.close_after)
            self._next_request(conn)
        elif conn.phase is Phase.READING and conn.buffer.strip():
            log.debug("control client did not finish its request in %.1f s", self.client_timeout_s)
            self._reply(conn, _error(f"request not complete within {self.client_timeout_s:g} s"), close=True)
        else:
            log.debug("control client idle for %.1f s (%s); disconnected", self.client_timeout_s, conn.phase.value)
            mux.close(conn)


def parse_request(line: bytes) -> tuple[dict | None, str]:
    """(request, "") for a well-formed line, else (None, why it was rejected)."""
    try:
        request = decode_object(line, MAX_REQUEST_DEPTH)
    except MalformedMessage as exc:
        return None, f"malformed request: {exc}"
    if not isinstance(request.get("cmd"), str):
        return None, 'malformed request: missing "cmd" string'
    return request, ""


def unexpected_fields(request: dict, takes: Iterable[str] = ()) -> dict | None:
    """The error reply naming the fields of `request` that its command does not take, else None.
    Ignoring them would let `{"cmd": "reload", "config": "other.yaml"}` answer "reloaded" after
    reloading the configured file, and the client believe it loaded another."""
    extra = sorted(set(request) - {"cmd", *takes})
    if not extra:
        return None
    names = ", ".join(quoted_name(str(name)) for name in extra[:5]) + (", ..." if len(extra) > 5 else "")
    allowed = ", ".join(sorted(takes)) or "none besides cmd"
    return _error(f"command {quoted_name(request['cmd'])} does not take field(s) {names} (it takes {allowed})")


OUT_OF_DESCRIPTORS = "the daemon is out of file descriptors; try again"


def _error(text: str) -> dict:
    return {"ok": False, "error": text}


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
        listener.listen(MAX_CONNECTIONS)
        listener.setblocking(False)
    except OSError as exc:
        listener.close()
        os.unlink(path)
        raise ControlServerError(f"cannot set up control socket {path}: {exc}") from exc
    return listener
