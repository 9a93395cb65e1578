"""A small HTTP/1.1 server for the daemon's read-only endpoints (`/metrics`, `/api/status`).

Not `http.server.ThreadingHTTPServer`: it spends a thread per connection for as long as the
client takes, so a few clients that dribble a header line every few seconds (slowloris) or
never read their reply would hold any number of threads. Here, as for the control socket, one I/O
thread multiplexes every connection with non-blocking sockets (`netio.multiplex`; this module
parses heads, routes and authenticates); only a complete, parsed request reaches a handler
thread (at most `HANDLERS` at once), which builds the reply (a scrape, a JSON status) and hands it
back for the I/O thread to write. The pipeline never waits on any of it.

Bounds: a request head is at most `MAX_HEAD_BYTES` (431 past it); the whole exchange (head, wait
for a handler, writing the reply) must end within `timeout_s` of the accept, or the connection
is closed; at most `MAX_CONNECTIONS` are kept, a new one evicting the connection that has waited
longest for its request, else (none is still reading) the oldest: a crowd of silent clients
delays a scrape by one accept; at most `MAX_WAITING` parsed requests wait for a handler, more
are answered 503 at once. Every reply closes its connection (no keep-alive: a scrape every few
seconds does not need it, and a held-open connection is one more thing to bound). GET and HEAD
only.

Before routing, the Host header is checked (`access.HostPolicy`: 421 for a name the endpoint is
not meant for, which is what a DNS-rebinding page sends), then basic auth (`BasicAuth`), in
constant time; a refused request gets 401 with `WWW-Authenticate`, and the credentials are never
logged. A client whose last credentials were wrong gets its 401 late (`access.AuthThrottle`):
the reply is parked (`Phase.DELAYED`) and written by the I/O thread when it is due, so a
delay holds no thread. Out of file descriptors, accept() is `accept.Acceptor`'s: refuse with 503
and close, pause the listener, retry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import socket
import time
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Callable

from ..accept import Acceptor
from ..netio.connection import Connection, Phase
from ..netio.lanes import LaneLimit
from ..netio.multiplex import Limits, Multiplexer, Service
from ..textsafe import printable
from .access import AuthThrottle, HostPolicy

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128
MAX_HEAD_BYTES = 8192
MAX_HEADERS = 64
#: handler threads: replies are built in milliseconds, so two keep up with any sane scraper
HANDLERS = 2
#: parsed requests waiting for a handler; more are answered 503 at once
MAX_WAITING = 16
REQUEST_TIMEOUT_S = 10.0
_RECV_BYTES = 16384

Clock = Callable[[], float]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # names in lower case
    version: str = "HTTP/1.1"
    client: str = ""  # the peer's address


@dataclass(frozen=True)
class Response:
    status: HTTPStatus
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    #: how long the server holds the reply before writing it (a 401 after wrong credentials)
    delay_s: float = 0.0

    def encode(self, head_only: bool) -> bytes:
        lines = [f"HTTP/1.1 {self.status.value} {self.status.phrase}",
                 f"Content-Type: {self.content_type}",
                 f"Content-Length: {len(self.body)}",
                 "Connection: close",
                 "Cache-Control: no-store",
                 "X-Content-Type-Options: nosniff",
                 *(f"{name}: {value}" for name, value in self.headers)]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def text_response(status: HTTPStatus, text: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, ((text or status.phrase) + "\n").encode(), headers=headers)


Route = Callable[[Request], Response]

MISDIRECTED_TEXT = ("Misdirected Request: this endpoint does not answer to that host name "
                    "(see http.allowed_hosts)")


class BasicAuth:
    """HTTP basic auth against one user name and password. Both the given and the expected
    credentials are hashed first, so the comparison takes the same time whatever their lengths
    and wherever they differ."""

    CHALLENGE = ("WWW-Authenticate", 'Basic realm="yoloedge", charset="UTF-8"')

    def __init__(self, username: str, password: str):
        self._expected = hashlib.sha256(f"{username}:{password}".encode()).digest()

    def allows(self, header: str | None) -> bool:
        scheme, _, token = (header or "").strip().partition(" ")
        try:
            given = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            given = b""
        same = hmac.compare_digest(hashlib.sha256(given).digest(), self._expected)
        return same and scheme.lower() == "basic"


_UNAUTHORIZED = text_response(HTTPStatus.UNAUTHORIZED, headers=(BasicAuth.CHALLENGE,))
#: what a connection gets when the process has no descriptor to serve it with
_OUT_OF_DESCRIPTORS = text_response(HTTPStatus.SERVICE_UNAVAILABLE, "the daemon is out of file descriptors; try again",
                                    headers=(("Retry-After", "5"),)).encode(False)


class Router:
    """Exact paths and path prefixes (`/api/cameras/`) to routes, behind an optional Host check
    and optional basic auth. Both can be swapped while serving (a reload that changes only them)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._exact: dict[str, Route] = {}
        self._prefixes: dict[str, Route] = {}
        self.hosts: HostPolicy | None = None
        self.auth: BasicAuth | None = None
        self.throttle = AuthThrottle(clock)

    def add(self, path: str, route: Route) -> None:
        self._exact[path] = route

    def add_prefix(self, prefix: str, route: Route) -> None:
        self._prefixes[prefix] = route

    def __call__(self, request: Request) -> Response:
        hosts = self.hosts
        refused = hosts.refusal(request.version, request.headers.get("host")) if hosts is not None else None
        if refused is not None:
            return text_response(refused, MISDIRECTED_TEXT if refused is HTTPStatus.MISDIRECTED_REQUEST else None)
        auth = self.auth
        denied = self._check_auth(auth, request) if auth is not None else None
        if denied is not None:
            return denied
        route = self._exact.get(request.path)
        if route is None:
            route = next((r for p, r in self._prefixes.items() if request.path.startswith(p)), None)
        if route is None:
            return text_response(HTTPStatus.NOT_FOUND)
        return route(request)

    def _check_auth(self, auth: BasicAuth, request: Request) -> Response | None:
        """None when the credentials are right; else the 401, late after wrong ones. A client
        still waiting after a wrong guess is not checked at all (see `access.AuthThrottle`); a
        request without credentials (a browser's first) is no guess and is answered at once."""
        header = request.headers.get("authorization")
        if header is None:
            return _UNAUTHORIZED
        wait_s = self.throttle.wait_s(request.client)
        if wait_s > 0:
            return replace(_UNAUTHORIZED, delay_s=wait_s)
        if auth.allows(header):
            self.throttle.succeeded(request.client)
            return None
        return replace(_UNAUTHORIZED, delay_s=self.throttle.failed(request.client))


@dataclass(eq=False)
class _Exchange(Connection):
    held: bytes = b""  # a DELAYED reply
    send_at: float = 0.0  # when it is due


class HttpServer:
    """Listens on (host, port) from `start()` (which raises OSError when it cannot bind) to `stop()`."""

    def __init__(self, host: str, port: int, app: Route, *, timeout_s: float = REQUEST_TIMEOUT_S,
                 clock: Clock = time.monotonic):
        self.host, self.port = host, port
        self._app = app
        self._timeout_s = timeout_s
        self._clock = clock
        self._listener: socket.socket | None = None
        self._mux: Multiplexer[_Exchange] | None = None  # from start() to stop()
        self._delayed: list[_Exchange] = []  # I/O thread only
        self.acceptor: Acceptor | None = None  # from start(); its stats() for the daemon's status

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the real port when 0 was asked for)."""
        if self._listener is None:
            return (self.host, self.port)
        name = self._listener.getsockname()
        return (name[0], name[1])

    @property
    def held_replies(self) -> int:
        """Replies built and held until they are due (401s after wrong passwords)."""
        return len(self._delayed)

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(MAX_CONNECTIONS)
            listener.setblocking(False)
            # here, not in the thread: out of file descriptors, start() fails rather than the thread
            mux = Multiplexer("http", "HTTP endpoint", listener, self._service(), self._limits(),
                              refusal=_OUT_OF_DESCRIPTORS, clock=self._clock)
        except OSError:
            listener.close()
            raise
        self._listener, self._mux, self.acceptor = listener, mux, mux.acceptor
        self._delayed = []
        mux.start()

    def _limits(self) -> Limits:
        return Limits(MAX_CONNECTIONS, self._timeout_s, {None: LaneLimit(HANDLERS, MAX_WAITING)},
                      recv_bytes=_RECV_BYTES, deadline_covers_handler=True)

    def _service(self) -> Service[_Exchange]:
        return Service(_Exchange, self._received, self._close,
                       due=lambda: min((c.send_at for c in self._delayed), default=None),
                       tick=self._release_delayed)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close the listener and every connection; a handler busy with a reply is not waited
        for (it is a daemon thread and holds no lock of the pipeline)."""
        mux = self._mux
        if mux is None:
            return
        mux.stop(timeout_s)
        self._mux = self._listener = None

    # -- the I/O thread ------------------------------------------------------------------------
    def _received(self, conn: _Exchange) -> None:
        """Parse the head once it is complete, and hand it to a handler."""
        mux = self._mux
        if mux is None or conn.eof:
            self._close(conn)
            return
        end = conn.buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(conn.buffer) > MAX_HEAD_BYTES:
                self._reply(conn, text_response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE).encode(False))
            return
        request = parse_head(bytes(conn.buffer[:end]), conn.peer)
        if isinstance(request, Response):
            self._reply(conn, request.encode(False))
        elif not mux.submit(conn, None, lambda: self._respond(conn, request)):
            self._reply(conn, text_response(HTTPStatus.SERVICE_UNAVAILABLE).encode(False))

    def _respond(self, conn: _Exchange, request: Request) -> Callable[[], None]:
        """Handler thread: build the reply; the I/O thread writes it (the completion returned)."""
        try:
            response = self._app(request)
        except Exception:  # noqa: BLE001 - one failed reply must not end the endpoint
            log.exception("HTTP %s %s failed", printable(request.method), printable(request.path[:200]))
            response = text_response(HTTPStatus.INTERNAL_SERVER_ERROR)
        data = response.encode(request.method == "HEAD")
        return lambda: self._replied(conn, data, response.delay_s)

    def _replied(self, conn: _Exchange, data: bytes, delay_s: float) -> None:
        if delay_s <= 0:
            self._reply(conn, data)
            return
        conn.phase, conn.held = Phase.DELAYED, data
        conn.send_at = self._clock() + delay_s
        conn.deadline = max(conn.deadline or 0.0, conn.send_at + self._timeout_s)  # time to write it then
        self._delayed.append(conn)

    def _release_delayed(self) -> None:
        """Write the held replies that are due; forget those whose connection is gone."""
        if not self._delayed:
            return
        now = self._clock()
        due = [c for c in self._delayed if c.closed or c.send_at <= now]
        if not due:
            return
        self._delayed = [c for c in self._delayed if not (c.closed or c.send_at <= now)]
        for conn in due:
            if not conn.closed:
                data, conn.held = conn.held, b""
                self._reply(conn, data)

    def _reply(self, conn: _Exchange, data: bytes) -> None:
        if self._mux is not None:
            self._mux.send(conn, data, close=True)  # no keep-alive

    def _close(self, conn: _Exchange) -> None:
        if self._mux is not None:
            self._mux.close(conn)


def parse_head(head: bytes, client: str = "") -> Request | Response:
    """The request line and headers, or the error reply for a head that is not HTTP/1.x (or
    names its Host twice: RFC 9112 says 400, and two could be read differently by a proxy)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return text_response(HTTPStatus.BAD_REQUEST)
    method, target, version = parts
    if len(lines) - 1 > MAX_HEADERS:
        return text_response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return text_response(HTTPStatus.BAD_REQUEST)
        if name.lower() == "host" and "host" in headers:
            return text_response(HTTPStatus.BAD_REQUEST, "two Host headers")
        headers[name.lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        return text_response(HTTPStatus.METHOD_NOT_ALLOWED, headers=(("Allow", "GET, HEAD"),))
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, version, client)


