"""One client connection of a `multiplex.Multiplexer`, and the phases it goes through.

Kept apart from the multiplexer so that `lanes` can move a connection between phases without
importing the loop. A server subclasses `Connection` for its framing's own fields.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Hashable, Protocol

#: what a handler thread hands back: run on the I/O thread, while the connection is still open.
Completion = Callable[[], None]
#: run on a handler thread (see `lanes`); returns the completion that writes its reply.
Job = Callable[[], Completion]


class Phase(Enum):
    """Allowed moves: READING -> QUEUED -> HANDLING -> (DELAYED ->) WRITING -> READING or closed;
    READING -> WRITING (an answer without a handler); WRITING -> STREAMING (a stream's first reply
    is out). Any phase -> closed."""
    READING = "reading"  # waiting for (the rest of) a request
    QUEUED = "queued"  # parsed, waiting for a free handler of its lane
    HANDLING = "handling"  # a handler thread is computing the reply
    DELAYED = "delayed"  # the reply is built and held until the server's timer writes it
    WRITING = "writing"  # sending the reply
    STREAMING = "streaming"  # after a stream's first reply: its lines, until the client leaves


class Stream(Protocol):
    """What a connection carries after its reply when it streams (`watch`): the I/O thread takes
    its bytes as the socket accepts them, and closes it with the connection."""

    def take(self, max_bytes: int) -> bytes: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    peer: str = ""  # the client's address (empty on a Unix socket)
    #: when the server started waiting for the current request: the eviction order
    since: float = 0.0
    #: when the connection is dropped (see `Multiplexer`); None while nothing of it is awaited
    deadline: float | None = None
    phase: Phase = Phase.READING
    buffer: bytearray = field(default_factory=bytearray)  # received, not yet framed
    outbox: memoryview = field(default_factory=lambda: memoryview(b""))  # to send
    eof: bool = False  # the client shut down its sending side
    close_after: bool = False  # close once the outbox is written
    closed: bool = False
    lane: Hashable = None  # of the request waiting or being handled
    job: Job | None = None  # while QUEUED
    stream: Stream | None = None


#: a server's connection class (or any factory): (socket, peer) -> its Connection
ConnectionFactory = Callable[[socket.socket, str], Connection]
