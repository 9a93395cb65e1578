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

Design: one I/O thread multiplexes every connection with non-blocking sockets, and only a
complete, parsed request costs a thread (at most `MAX_HANDLERS` at once; more wait their
turn, and are answered "busy" if it does not come by their deadline). Commands named `slow`
(a reload, which waits for the main loop) have handler slots of their own, so however many of
them wait, `status` is never queued behind them. A client that dribbles
a byte every few seconds therefore holds no thread, and the deadline covers the whole request
(the sum of its reads and its wait for a handler), not each read. At most
`MAX_CONNECTIONS` connections are kept; a new one evicts the connection that has waited
longest for its request, so a crowd of slow or silent clients can delay `yoloedge-ctl` by
nothing more than one accept. A thread per connection with per-read timeouts, as before, let
16 slow clients take every slot. Replies are written by the I/O thread too, under the same
deadline, so a client that never reads its reply pins nothing either.

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

import collections
import logging
import os
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable, Mapping, Protocol

from ..accept import Acceptor
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
#: the I/O thread re-reads the clock at least this often while connections are open.
MAX_WAIT_S = 0.25
#: after an unexpected error in the I/O loop: the pause before it goes on (a lasting fault must not spin)
FAULT_PAUSE_S = 0.05
_RECV_BYTES = 65536
#: a stream moves at most this much into a connection's outbox at a time.
STREAM_CHUNK_BYTES = 64 * 1024
#: kernel send buffer of a streaming connection: what a stuck watcher can pin besides its queue.
STREAM_SNDBUF_BYTES = 32 * 1024


class Stream(Protocol):
    """What a streaming command (`watch`) turns its connection into, after its first reply: the
    I/O thread takes its lines as the socket accepts them, and closes it with the connection."""

    def take(self, max_bytes: int) -> bytes: ...

    def close(self) -> None: ...


#: streams[cmd](request, wake) -> (first reply, Stream or None when refused). Runs on the I/O
#: thread, so it must be quick; the stream calls `wake()` when lines arrive in an empty queue.
StreamOpener = Callable[[dict, Callable[[], None]], "tuple[dict, Stream | None]"]


class Lane(Enum):
    """Which handler slots a request uses: slow commands cannot take the quick ones."""
    QUICK = "quick"
    SLOW = "slow"


class Phase(Enum):
    READING = "reading"  # waiting for (the rest of) a request line
    QUEUED = "queued"  # parsed, waiting for a free handler
    HANDLING = "handling"  # a handler thread is computing the reply
    WRITING = "writing"  # sending the reply
    STREAMING = "streaming"  # after a stream's first reply: its lines, until the client leaves


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    since: float  # when the server started waiting for the current request (or reply)
    phase: Phase = Phase.READING
    buffer: bytearray = field(default_factory=bytearray)
    outbox: bytes = b""
    eof: bool = False  # the client shut down its sending side
    close_after: bool = False  # close once the outbox is written
    closed: bool = False
    request: dict | None = None  # while QUEUED
    lane: Lane = Lane.QUICK  # of the request queued or being handled
    malformed: int = 0  # malformed lines so far
    stream: Stream | None = None  # a streaming command's subscription


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
        self._listener: socket.socket | None = None
        self._identity: tuple[int, int] | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._replies: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._connections: list[_Connection] = []  # I/O thread only
        self._in_flight = dict.fromkeys(Lane, 0)  # I/O thread only
        self.acceptor: Acceptor | None = None  # from start(); its stats() for the daemon's status
        self._queued = {lane: collections.deque[_Connection]() for lane in Lane}  # I/O thread only
        self._selector: selectors.BaseSelector | None = None

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Take the instance lock (creating the directory), replace a stale socket, bind."""
        with self._lock:
            if self._listener is not None:
                return
            self._instance.acquire()  # creates the parent directory
            try:
                remove_stale_socket(self.path)
                listener = _bind(self.path, self.mode)
                selector, wake = _loop_parts(listener, self.path)
            except BaseException:
                if self._owns_instance:
                    self._instance.release()
                raise
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._listener = listener
            self.acceptor = Acceptor("control socket", encode(_error(OUT_OF_DESCRIPTORS)), clock=self.clock)
            self._wake = wake
            self._stopping.clear()
            self._replies = queue.SimpleQueue()
            self._connections, self._in_flight = [], dict.fromkeys(Lane, 0)
            for waiting in self._queued.values():
                waiting.clear()
            self._thread = threading.Thread(target=self._io_loop,
                                            args=(selector, listener, wake[0], self.acceptor),
                                            name="control-io", daemon=True)
            self._thread.start()
        log.info("control socket listening at %s (mode %o)", self.path, self.mode)

    def stop(self) -> None:
        """Stop serving, close the socket and remove its file, then release the instance lock
        (unless the caller passed it in: then it is the caller's to release)."""
        with self._lock:
            listener, wake, thread = self._listener, self._wake, self._thread
            if listener is None or wake is None or thread is None:
                return
            self._listener = self._wake = self._thread = None
            self._stopping.set()
            _poke(wake[1])
            thread.join()
            listener.close()
            if self.acceptor is not None:
                self.acceptor.close()
            wake[0].close()
            wake[1].close()
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

    # -- the I/O thread -----------------------------------------------------------------------
    def stats(self) -> dict:
        """For the daemon's status: the socket's path and how its accept() fares."""
        acceptor = self.acceptor
        return {"socket": self.path, **(acceptor.stats() if acceptor is not None else {})}

    def _io_loop(self, selector: selectors.BaseSelector, listener: socket.socket, wake: socket.socket,
                 acceptor: Acceptor) -> None:
        """Accept, read, dispatch and write until `stop()`; one bad client never ends it."""
        with selector:
            self._selector = selector
            selector.register(listener, selectors.EVENT_READ, listener)
            selector.register(wake, selectors.EVENT_READ, wake)
            try:
                while not self._stopping.is_set():
                    try:
                        self._io_round(selector, listener, wake, acceptor)
                    except Exception:  # noqa: BLE001 -- a bug here must not end `yoloedge-ctl` access
                        log.exception("control socket: unexpected error; dropping open connections")
                        for conn in list(self._connections):
                            self._close(conn)
                        self._stopping.wait(FAULT_PAUSE_S)  # a lasting fault must not spin
            finally:
                for conn in list(self._connections):
                    self._close(conn)
                self._selector = None

    def _io_round(self, selector: selectors.BaseSelector, listener: socket.socket,
                  wake: socket.socket, acceptor: Acceptor) -> None:
        ready = selector.select(_earliest(self._wait_s(), acceptor.wait_s()))
        self._collect_replies()  # first: finished handlers free their slots
        self._pump_streams()
        # Connections before the listener: a request already sent is read before a burst of new
        # connections can make room by dropping its connection.
        for key, events in sorted(ready, key=lambda pair: pair[0].data is listener):
            self._on_ready(key.data, events, listener, wake, acceptor)
        self._expire()
        acceptor.resume(selector)

    def _on_ready(self, target: object, events: int, listener: socket.socket, wake: socket.socket,
                  acceptor: Acceptor) -> None:
        if target is wake:
            _drain(wake)
        elif target is listener:
            for _ in range(MAX_CONNECTIONS):  # empty the backlog: a full one refuses ctl's connect
                if not self._accept(listener, acceptor):
                    break
        elif isinstance(target, _Connection) and not target.closed:
            try:
                if events & selectors.EVENT_READ and target.phase is Phase.READING:
                    self._read(target)
                if events & selectors.EVENT_WRITE and target.phase is Phase.WRITING:
                    self._flush(target)
                    self._next_request(target)
                if target.phase is Phase.STREAMING and not target.closed:
                    self._on_stream_ready(target, events)
            except OSError as exc:
                log.debug("control client connection failed: %s", exc)
                self._close(target)

    def _wait_s(self) -> float | None:
        deadlines = [c.since + self.client_timeout_s for c in self._connections
                     if c.phase not in (Phase.HANDLING, Phase.STREAMING)]
        if not deadlines:
            return None  # a handler's reply arrives with a poke
        return min(MAX_WAIT_S, max(0.0, min(deadlines) - self.clock()))

    def _accept(self, listener: socket.socket, acceptor: Acceptor) -> bool:
        """Accept one connection; False when there is none waiting (or accept failed)."""
        selector = self._selector
        accepted = acceptor.accept(selector, listener, shed=self._evict_oldest_reader) if selector else None
        if accepted is None:
            return False
        sock = accepted[0]
        sock.setblocking(False)
        if len(self._connections) >= MAX_CONNECTIONS and not self._evict_oldest_reader():
            _try_send(sock, _error("server busy, try again"))
            sock.close()
            return True
        conn = _Connection(sock, since=self.clock())
        self._connections.append(conn)
        self._watch(conn)
        return True

    def _evict_oldest_reader(self) -> bool:
        readers = [c for c in self._connections if c.phase is Phase.READING]
        if not readers:
            return False
        oldest = min(readers, key=lambda c: c.since)
        log.debug("control socket: %d connections open; dropping the one waiting longest",
                  len(self._connections))
        _try_send(oldest.sock, _error("too many connections; dropped the one waiting longest"))
        self._close(oldest)
        return True

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        if data:
            conn.buffer += data
        else:
            conn.eof = True
        self._next_request(conn)

    def _next_request(self, conn: _Connection) -> None:
        """Dispatch the complete lines in the buffer while their replies go out at once; then
        keep reading (or close). The only place that dispatches, and nothing it calls comes back
        here: a thousand pipelined lines are a thousand turns of this loop, not a deep stack."""
        while conn.phase is Phase.READING and not conn.closed:
            newline = conn.buffer.find(b"\n", 0, MAX_REQUEST_BYTES + 1)
            if newline < 0 and len(conn.buffer) > MAX_REQUEST_BYTES or newline > MAX_REQUEST_BYTES:
                self._reply(conn, _error(f"request longer than {MAX_REQUEST_BYTES} bytes"), close=True)
                return
            if newline < 0:
                if conn.eof:  # a last request without its newline is still a request
                    line = bytes(conn.buffer)
                    conn.buffer.clear()
                    if line.strip():
                        self._dispatch(conn, line, close=True)
                    else:
                        self._close(conn)
                return
            line = bytes(conn.buffer[:newline])
            del conn.buffer[:newline + 1]
            if line.strip():
                self._dispatch(conn, line, close=False)

    def _dispatch(self, conn: _Connection, line: bytes, close: bool) -> None:
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
            self._open_stream(conn, request, opener, close)
            return
        conn.close_after = close
        conn.lane = Lane.SLOW if request["cmd"] in self.slow else Lane.QUICK
        if self._in_flight[conn.lane] >= MAX_HANDLERS:
            conn.phase, conn.request = Phase.QUEUED, request
            self._watch(conn)
            self._queued[conn.lane].append(conn)
            return
        self._start_handler(conn, request)

    def _start_handler(self, conn: _Connection, request: dict) -> None:
        self._in_flight[conn.lane] += 1
        conn.phase = Phase.HANDLING
        self._watch(conn)
        wake = self._wake
        threading.Thread(target=self._handle, args=(conn, request, self._replies, wake and wake[1]),
                         name="control-handler", daemon=True).start()

    def _handle(self, conn: _Connection, request: dict,
                replies: queue.SimpleQueue[tuple[_Connection, bytes]], wake: socket.socket | None) -> None:
        """Handler thread: compute the reply and hand it to the I/O thread that started it."""
        data = b""
        try:
            data = encode(self._answer(request))
        except (TypeError, ValueError) as exc:
            log.error("control request %r: reply is not JSON: %s", request.get("cmd"), exc)
            data = encode(_error(f"internal error: reply is not JSON: {exc}"))
        finally:
            replies.put((conn, data))
            if wake is not None:
                _poke(wake)

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

    def _collect_replies(self) -> None:
        while True:
            try:
                conn, data = self._replies.get_nowait()
            except queue.Empty:
                return
            lane = conn.lane  # the next request on this connection may take another
            self._in_flight[lane] -= 1
            if not conn.closed:
                self._send(conn, data, close=conn.close_after)
                self._next_request(conn)
            self._start_queued(lane)

    def _start_queued(self, lane: Lane) -> None:
        waiting = self._queued[lane]
        while waiting and self._in_flight[lane] < MAX_HANDLERS:
            conn = waiting.popleft()
            request, conn.request = conn.request, None
            if not conn.closed and conn.phase is Phase.QUEUED and request is not None:
                self._start_handler(conn, request)

    def _reply(self, conn: _Connection, reply: dict, close: bool) -> None:
        self._send(conn, encode(reply), close)

    def _send(self, conn: _Connection, data: bytes, close: bool) -> None:
        """Start writing a reply; the caller, not this, goes on to the next request."""
        conn.phase = Phase.WRITING
        conn.outbox = data
        conn.close_after = close
        conn.since = self.clock()
        self._watch(conn)
        self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        """Write what the socket takes; once the reply is out, close or go back to READING."""
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return
        except OSError as exc:  # the client went away without reading: nothing to tell it
            log.debug("control client went away before its reply: %s", exc)
            self._close(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if conn.outbox:
            return
        if conn.close_after:
            self._close(conn)
            return
        if conn.stream is not None:  # a stream's first reply is out: its lines follow
            conn.phase = Phase.STREAMING
            self._pump(conn)
            return
        conn.phase = Phase.READING
        conn.since = self.clock()
        self._watch(conn)

    # -- streams (see `Stream`) ---------------------------------------------------------------
    def _open_stream(self, conn: _Connection, request: dict, opener: StreamOpener, close: bool) -> None:
        """Opened here on the I/O thread, not by a handler: opening is a lookup and a queue, and a
        stream must not hold a handler slot for its whole life."""
        if close:  # the client has shut its side: its leaving could not be noticed
            self._reply(conn, _error(f"{quoted_name(request['cmd'])} streams until the client disconnects; "
                                     "keep the connection open"), close=True)
            return
        wake = self._wake
        try:
            reply, stream = opener(request, (lambda: _poke(wake[1])) if wake is not None else (lambda: None))
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

    def _pump_streams(self) -> None:
        for conn in list(self._connections):
            if conn.phase is Phase.STREAMING and not conn.closed:
                try:
                    self._pump(conn)
                except OSError as exc:
                    log.debug("control stream client went away: %s", exc)
                    self._close(conn)

    def _on_stream_ready(self, conn: _Connection, events: int) -> None:
        if events & selectors.EVENT_READ and _client_left(conn.sock):
            self._close(conn)
            return
        if events & selectors.EVENT_WRITE:
            self._pump(conn)

    def _pump(self, conn: _Connection) -> None:
        """Move the stream's lines to the socket until it is empty or the socket is full; never
        blocks. A watcher that stops reading keeps its outbox, and its queue drops lines."""
        stream = conn.stream
        while stream is not None:
            if not conn.outbox:
                conn.outbox = stream.take(STREAM_CHUNK_BYTES)
                if not conn.outbox:
                    break
            try:
                sent = conn.sock.send(conn.outbox)
            except BlockingIOError:
                break
            conn.outbox = conn.outbox[sent:]
            if conn.outbox:
                break
        self._watch(conn)

    def _expire(self) -> None:
        """Apply the per-request deadline: answer a partial request, drop everything else."""
        now = self.clock()
        for conn in list(self._connections):
            if conn.phase in (Phase.HANDLING, Phase.STREAMING) or now - conn.since < self.client_timeout_s:
                continue
            if conn.phase is Phase.QUEUED:
                self._queued[conn.lane].remove(conn)
                conn.request = None
                self._reply(conn, _error("server busy, try again"), close=conn.close_after)
                self._next_request(conn)
            elif conn.phase is Phase.READING and conn.buffer.strip():
                log.debug("control client did not finish its request in %.1f s", self.client_timeout_s)
                self._reply(conn, _error(f"request not complete within {self.client_timeout_s:g} s"),
                            close=True)
            else:
                log.debug("control client idle for %.1f s (%s); disconnected",
                          self.client_timeout_s, conn.phase.value)
                self._close(conn)

    def _watch(self, conn: _Connection) -> None:
        """Register the events the connection's phase waits for (none while handling)."""
        selector = self._selector
        if selector is None or conn.closed:
            return
        wanted = {Phase.READING: selectors.EVENT_READ, Phase.WRITING: selectors.EVENT_WRITE}.get(conn.phase, 0)
        if conn.phase is Phase.STREAMING:  # reading only to notice the client leaving
            wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        try:
            registered = selector.get_key(conn.sock).events
        except KeyError:
            registered = 0
        if wanted == registered:
            return
        if not wanted:
            selector.unregister(conn.sock)
        elif registered:
            selector.modify(conn.sock, wanted, conn)
        else:
            selector.register(conn.sock, wanted, conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.stream is not None:
            conn.stream.close()
            conn.stream = None
        if conn.phase is Phase.QUEUED:
            self._queued[conn.lane].remove(conn)
        if self._selector is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass  # not registered while handling, or already detached
        conn.sock.close()
        if conn in self._connections:
            self._connections.remove(conn)


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


def _earliest(a: float | None, b: float | None) -> float | None:
    """The shorter of two waits, None meaning none."""
    return b if a is None else a if b is None else min(a, b)


def _error(text: str) -> dict:
    return {"ok": False, "error": text}


def _try_send(sock: socket.socket, reply: dict) -> None:
    """Best effort, never blocking: the client may be gone or not reading, which is its loss."""
    try:
        sock.send(encode(reply))
    except OSError as exc:
        log.debug("could not send a rejection to a control client: %s", exc)


def _client_left(sock: socket.socket) -> bool:
    """A streaming client sends nothing after its request: what it does send is discarded; EOF
    means it has gone."""
    try:
        return not sock.recv(_RECV_BYTES)
    except BlockingIOError:
        return False


def _poke(sock: socket.socket) -> None:
    try:
        sock.send(b"x")
    except BlockingIOError:
        pass  # the wake socket is full: the I/O thread is already due to wake
    except OSError as exc:
        log.debug("control socket wake-up failed: %s", exc)


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        return


WakePair = tuple[socket.socket, socket.socket]


def _loop_parts(listener: socket.socket, path: str) -> tuple[selectors.BaseSelector, WakePair]:
    """The I/O thread's selector and wake socket pair, made before it starts: out of file
    descriptors, `start()` fails (the caller logs it) rather than the thread dying on its own."""
    try:
        selector = selectors.DefaultSelector()
    except OSError as exc:
        listener.close()
        os.unlink(path)
        raise ControlServerError(f"cannot set up control socket {path}: {exc}") from exc
    try:
        wake = socket.socketpair()
    except OSError as exc:
        selector.close()
        listener.close()
        os.unlink(path)
        raise ControlServerError(f"cannot set up control socket {path}: {exc}") from exc
    for end in wake:  # a full wake socket must never block a handler or stop()
        end.setblocking(False)
    return selector, wake


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
