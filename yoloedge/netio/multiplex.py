"""One I/O thread multiplexing every connection of a listener with non-blocking sockets.

A thread per connection with per-read timeouts lets a few clients that dribble a byte every few
seconds (slowloris), or never read their replies, hold any number of threads. Here only a
complete, parsed request costs a thread (`lanes`), and the loop bounds everything else:

- at most `Limits.max_connections` connections; a new one evicts the connection that has waited
  longest for its request, else (none is still reading: clients that do not read their replies)
  the oldest of all, so a crowd of slow or silent clients delays a newcomer by one accept;
- a per-connection deadline (`Connection.deadline`, from `Limits.timeout_s`) over the reads of a
  request, its wait for a handler and the write of its reply; what happens when it passes is the
  server's (`Service.expired`: answer a partial request, or just close);
- replies are written by the I/O thread as the socket takes them (`send`), and a streaming
  connection's bytes likewise (`Connection.stream`), so a client that never reads pins nothing;
- out of file descriptors, accept() is `accept.Acceptor`'s: the oldest connection still reading
  makes room, else the new one is refused with a reserve descriptor, and the listener rests.

The server above (`Service`) keeps the framing (cutting requests out of `Connection.buffer`),
routing and authentication, and the timers of its own (`due`, `tick`).

Threads: the I/O thread owns the selector, every connection and the lanes' lines; handler threads
hand completions back through `HandlerLanes` and `poke()`. `start`/`stop` are the owner's, called
from one thread at a time (the servers hold their own lock around them). No lock here.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Mapping, TypeVar

from ..accept import Acceptor
from .connection import Completion, Connection, Job, Phase
from .lanes import HandlerLanes, LaneLimit
from .wake import Waker

log = logging.getLogger(__name__)

Clock = Callable[[], float]
C = TypeVar("C", bound=Connection)

#: the I/O thread re-reads the clock at least this often while a deadline or timer is pending.
MAX_WAIT_S = 0.25
#: after an unexpected error in the I/O loop: the pause before it goes on (a lasting fault must not spin)
FAULT_PAUSE_S = 0.05
#: a stream moves at most this much into a connection's outbox at a time.
STREAM_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    max_connections: int
    timeout_s: float
    lanes: Mapping[Hashable, LaneLimit]
    recv_bytes: int = 65536
    #: whether the deadline runs on while a handler computes (one deadline for the whole exchange)
    #: or is lifted until the reply (a reload may take long, and it is not the client's doing)
    deadline_covers_handler: bool = True
    #: best effort, to a connection dropped for a newer one while it still waits for its request
    evicted_notice: bytes = b""


@dataclass(frozen=True)
class Service(Generic[C]):
    """What the server above does with its connections (all on the I/O thread)."""
    #: (socket, peer) -> a new connection (the server's Connection subclass)
    connection: Callable[[socket.socket, str], C]
    #: new bytes in `conn.buffer` (or `conn.eof`), or the connection is READING again after a
    #: reply with possibly more requests buffered: frame and dispatch them
    received: Callable[[C], None]
    #: `conn.deadline` has passed
    expired: Callable[[C], None]
    #: the clock time of the server's own next timer (None: none)
    due: Callable[[], float | None] = lambda: None
    #: every turn of the loop, after the connections' events: run the timers that are due
    tick: Callable[[], None] = lambda: None


class Multiplexer(Generic[C]):
    """Serves `listener`'s connections for `service` (see the module docstring). Made by the
    server's start(), with the selector and wake socket it needs: out of file descriptors, the
    constructor raises OSError (closing what it made, not `listener`) rather than the thread dying.
    `name` names the threads (`name`-io, `name`-handler), `what` the server in the log; `refusal`
    is what a client refused for want of a descriptor is sent."""

    def __init__(self, name: str, what: str, listener: socket.socket, service: Service[C], limits: Limits, *,
                 refusal: bytes, clock: Clock = time.monotonic) -> None:
        self.name, self.what = name, what
        self.limits = limits
        self._listener = listener
        self._service = service
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        try:
            self._waker = Waker()
        except OSError:
            self._selector.close()
            raise
        self.acceptor = Acceptor(what, refusal, clock=clock)
        self.lanes = HandlerLanes(name, what, limits.lanes, self._waker.poke, limits.deadline_covers_handler)
        self.connections: list[C] = []  # I/O thread only
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-io", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """End the I/O thread (dropping every connection), then close the listener, the wake
        socket and the acceptor's reserve. False when the thread did not end within `timeout_s`:
        then nothing is closed under it."""
        self._stopping.set()
        self._waker.poke()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("%s: the I/O thread did not stop within %.1f s", self.what, timeout_s or 0.0)
                return False
        self._listener.close()
        self.acceptor.close()
        self._waker.close()
        return True

    def poke(self) -> None:
        """Wake the I/O thread (any thread; never blocks): a stream has data, or a test moved the clock."""
        self._waker.poke()

    def deadline(self) -> float:
        """The deadline of what the server starts waiting for now."""
        return self._clock() + self.limits.timeout_s

    # -- the I/O thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        """Accept, read, dispatch and write until `stop()`; one bad client never ends it."""
        selector, wake = self._selector, self._waker.reader
        with selector:
            selector.register(self._listener, selectors.EVENT_READ, self._listener)
            selector.register(wake, selectors.EVENT_READ, wake)
            try:
                while not self._stopping.is_set():
                    try:
                        self._round()
                    except Exception:  # noqa: BLE001 -- a bug here must not end the server
                        log.exception("%s: unexpected error; dropping open connections", self.what)
                        self._close_all()
                        self._stopping.wait(FAULT_PAUSE_S)  # a lasting fault must not spin
            finally:
                self._close_all()

    def _round(self) -> None:
        listener = self._listener
        ready = self._selector.select(self._wait_s())
        self.lanes.collect(self._complete)  # first: finished handlers free their slots
        self._pump_streams()
        # Connections before the listener: a request already sent is read before a burst of new
        # connections can make room by dropping its connection.
        for key, events in sorted(ready, key=lambda pair: pair[0].data is listener):
            self._on_ready(key.data, events)
        self._service.tick()
        self._expire()
        self.acceptor.resume(self._selector)

    def _on_ready(self, target: object, events: int) -> None:
        if target is self._waker.reader:
            self._waker.drain()
        elif target is self._listener:
            for _ in range(self.limits.max_connections):  # empty the backlog: a full one refuses clients
                if not self._accept():
                    break
        elif isinstance(target, Connection) and not target.closed:
            conn: C = target  # type: ignore[assignment]  # only this loop's connections are registered
            try:
                if events & selectors.EVENT_READ and conn.phase is Phase.READING:
                    self._read(conn)
                if events & selectors.EVENT_WRITE and conn.phase is Phase.WRITING:
                    self._flush(conn)
                    if conn.phase is Phase.READING and not conn.closed:
                        self._service.received(conn)  # requests pipelined behind the reply
                if conn.phase is Phase.STREAMING and not conn.closed:
                    self._on_stream_ready(conn, events)
            except OSError as exc:
                log.debug("%s: client connection failed: %s", self.what, exc)
                self.close(conn)

    def _wait_s(self) -> float | None:
        due = [c.deadline for c in self.connections if c.deadline is not None]
        timer = self._service.due()
        if timer is not None:
            due.append(timer)
        wait = min(MAX_WAIT_S, max(0.0, min(due) - self._clock())) if due else None  # else a poke wakes it
        pause = self.acceptor.wait_s()
        return pause if wait is None else wait if pause is None else min(wait, pause)

    def _accept(self) -> bool:
        """Accept one connection; False when there is none waiting (or accept failed)."""
        accepted = self.acceptor.accept(self._selector, self._listener, shed=self._evict_reader)
        if accepted is None:
            return False
        sock, address = accepted
        sock.setblocking(False)
        if len(self.connections) >= self.limits.max_connections:
            self._evict_oldest()
        conn = self._service.connection(sock, str(address[0]) if isinstance(address, tuple) else "")
        conn.since = self._clock()
        conn.deadline = conn.since + self.limits.timeout_s
        self.connections.append(conn)
        self.watch(conn)
        return True

    def _evict_reader(self) -> bool:
        """Close the connection waiting longest for its request (to make room for a new one);
        False when none is reading. Busy ones are kept: a reply half written is not dropped for
        a client that may be refused with the reserve descriptor instead."""
        readers = [c for c in self.connections if c.phase is Phase.READING]
        if not readers:
            return False
        oldest = min(readers, key=lambda c: c.since)
        log.debug("%s: %d connections open; dropping the one waiting longest", self.what, len(self.connections))
        if self.limits.evicted_notice:
            _try_send(oldest.sock, self.limits.evicted_notice, self.what)
        self.close(oldest)
        return True

    def _evict_oldest(self) -> None:
        """At the connection limit: the oldest reader, else the oldest of all (clients that do not
        read their replies must not keep a newcomer out for their whole deadline)."""
        if not self._evict_reader() and self.connections:
            oldest = min(self.connections, key=lambda c: c.since)
            log.debug("%s: %d connections open, none reading; dropping the oldest (%s)",
                      self.what, len(self.connections), oldest.phase.value)
            self.close(oldest)

    def _read(self, conn: C) -> None:
        try:
            data = conn.sock.recv(self.limits.recv_bytes)
        except BlockingIOError:
            return
        if data:
            conn.buffer += data
        else:
            conn.eof = True
        self._service.received(conn)

    # -- handlers ---------------------------------------------------------------------------------
    def submit(self, conn: C, lane: Hashable, job: Job) -> bool:
        """Have a handler of `lane` run `job` (see `lanes`); False when its line is full."""
        conn.lane = lane
        if not self.lanes.submit(conn, job):
            return False
        self.watch(conn)
        return True

    def _complete(self, conn: Connection, completion: Completion | None) -> None:
        if completion is None:  # the handler failed (logged): there is no reply to give
            self.close(conn)
        else:
            completion()

    # -- writing ----------------------------------------------------------------------------------
    def send(self, conn: C, data: bytes, close: bool) -> None:
        """Start writing a reply; the rest goes out as the socket becomes writable. Once it is out
        the connection closes (`close`), streams, or reads its next request (a new deadline); the
        caller, not this, goes on to requests already buffered."""
        conn.phase = Phase.WRITING
        conn.outbox = memoryview(data)
        conn.close_after = close
        self.watch(conn)
        self._flush(conn)

    def _flush(self, conn: C) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return
        except OSError as exc:  # the client went away without reading: nothing to tell it
            log.debug("%s: client went away before its reply: %s", self.what, exc)
            self.close(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if conn.outbox:
            return
        if conn.close_after:
            self.close(conn)
        elif conn.stream is not None:  # a stream's first reply is out: its bytes follow
            conn.phase, conn.deadline = Phase.STREAMING, None
            self._pump(conn)
        else:
            conn.phase = Phase.READING
            conn.since = self._clock()
            conn.deadline = conn.since + self.limits.timeout_s
            self.watch(conn)

    def _pump_streams(self) -> None:
        for conn in list(self.connections):
            if conn.phase is Phase.STREAMING and not conn.closed:
                try:
                    self._pump(conn)
                except OSError as exc:
                    log.debug("%s: stream client went away: %s", self.what, exc)
                    self.close(conn)

    def _on_stream_ready(self, conn: C, events: int) -> None:
        if events & selectors.EVENT_READ and _client_left(conn.sock, self.limits.recv_bytes):
            self.close(conn)
            return
        if events & selectors.EVENT_WRITE:
            self._pump(conn)

    def _pump(self, conn: C) -> None:
        """Move the stream's bytes to the socket until it is empty or the socket is full; never
        blocks. A client that stops reading keeps its outbox, and its stream's queue drops."""
        stream = conn.stream
        while stream is not None:
            if not conn.outbox:
                conn.outbox = memoryview(stream.take(STREAM_CHUNK_BYTES))
                if not conn.outbox:
                    break
            try:
                sent = conn.sock.send(conn.outbox)
            except BlockingIOError:
                break
            conn.outbox = conn.outbox[sent:]
            if conn.outbox:
                break
        self.watch(conn)

    # -- deadlines and closing --------------------------------------------------------------------
    def _expire(self) -> None:
        now = self._clock()
        for conn in list(self.connections):
            if conn.deadline is not None and now >= conn.deadline and not conn.closed:
                self._service.expired(conn)

    def watch(self, conn: C) -> None:
        """Register the events the connection's phase waits for (none while queued, handled or delayed)."""
        if not conn.closed:
            _register(self._selector, conn)

    def close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.stream is not None:
            conn.stream.close()
            conn.stream = None
        if conn.phase is Phase.QUEUED:
            self.lanes.withdraw(conn)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass  # not registered while queued or handled, or the selector is closed
        conn.sock.close()
        if conn in self.connections:
            self.connections.remove(conn)

    def _close_all(self) -> None:
        for conn in list(self.connections):
            self.close(conn)


def _register(selector: selectors.BaseSelector, conn: Connection) -> None:
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


def _try_send(sock: socket.socket, data: bytes, what: str) -> None:
    """Best effort, never blocking: the client may be gone or not reading, which is its loss."""
    try:
        sock.send(data)
    except OSError as exc:
        log.debug("%s: could not send a notice to a client: %s", what, exc)


def _client_left(sock: socket.socket, recv_bytes: int) -> bool:
    """A streaming client sends nothing after its request: what it does send is discarded; EOF
    means it has gone."""
    try:
        return not sock.recv(recv_bytes)
    except BlockingIOError:
        return False
