"""The limits of `netio.multiplex`, once, against both servers built on it (the control socket and
the HTTP endpoint): the connection cap and its eviction, the slowloris deadline, the pause on
EMFILE, the wake-up socket, and writing a reply to a client that does not read it.

Deadlines run on an injected clock; nothing here asserts a rate or a wall-clock duration, only
what the server has done once it has done it (`wait_for` with a generous bound)."""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Callable

import pytest

from yoloedge.accept import PAUSE_MAX_S
from yoloedge.control import server as control_module
from yoloedge.control.server import ControlServer
from yoloedge.netio.connection import Phase
from yoloedge.web import server as http_module
from yoloedge.web.server import HttpServer, Request, Response, text_response

CAP = 4  # connections kept (patched into both servers: their own caps are 64 and 128)
BIG = 8 * 1024 * 1024  # a reply that no socket buffer holds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """One server under test, and how to speak to it."""
    kind: str
    server: ControlServer | HttpServer
    connect: Callable[[], socket.socket]
    request: Callable[[str], bytes]  # a complete request for a command / path
    partial: bytes  # the start of a request, never finished
    timeout_s: float
    clock: Clock
    gate: threading.Event  # "wait" requests block until it is set
    waiting: list[str] = field(default_factory=list)  # "wait" requests inside a handler

    @property
    def mux(self):
        return self.server._mux

    def answered(self, data: bytes) -> bool:
        if self.kind == "control":
            return json.loads(data.splitlines()[0]).get("ok") is True
        return data.startswith(b"HTTP/1.1 200 ")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def exchange(harness: Harness, what: str = "x") -> bytes:
    with harness.connect() as sock:
        sock.sendall(harness.request(what))
        if harness.kind == "control":
            sock.shutdown(socket.SHUT_WR)  # the last request: the server closes after its answer
        return read_all(sock)


def _control(sock_dir, clock: Clock, gate: threading.Event, waiting: list[str]) -> Harness:
    def handler(request: dict) -> dict:
        if request["cmd"] == "wait":
            waiting.append("wait")
            gate.wait(30)
        if request["cmd"] == "big":
            return {"ok": True, "data": "x" * BIG}
        return {"ok": True}

    server = ControlServer(str(sock_dir / "c.sock"), 0o600, handler, clock=clock)

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.path)
        return sock

    return Harness("control", server, connect, lambda cmd: json.dumps({"cmd": cmd}).encode() + b"\n",
                   b'{"cmd":', server.client_timeout_s, clock, gate, waiting)


def _http(clock: Clock, gate: threading.Event, waiting: list[str]) -> Harness:
    def app(request: Request) -> Response:
        if request.path == "/wait":
            waiting.append("wait")
            gate.wait(30)
        if request.path == "/big":
            return Response(HTTPStatus.OK, b"x" * BIG)
        return text_response(HTTPStatus.OK, "fine")

    server = HttpServer("127.0.0.1", 0, app, clock=clock)

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: TCP fixes it then
        sock.connect(server.address)
        return sock

    return Harness("http", server, connect,
                   lambda path: f"GET /{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
                   b"GET / HTTP/1.1\r\n", http_module.REQUEST_TIMEOUT_S, clock, gate, waiting)


@pytest.fixture(params=["control", "http"])
def harness(request, sock_dir, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge.netio")
    module = control_module if request.param == "control" else http_module
    monkeypatch.setattr(module, "MAX_CONNECTIONS", CAP)  # read by start()
    clock, gate, waiting = Clock(), threading.Event(), []
    built = _control(sock_dir, clock, gate, waiting) if request.param == "control" else _http(clock, gate, waiting)
    built.server.start()
    try:
        yield built
    finally:
        gate.set()
        built.server.stop()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def open_connections(harness: Harness, count: int) -> list[socket.socket]:
    before = len(harness.mux.connections)
    socks = [harness.connect() for _ in range(count)]
    wait_for(lambda: len(harness.mux.connections) == before + count)
    return socks


# --- the connection cap -------------------------------------------------------------------------


def test_a_new_connection_evicts_the_one_waiting_longest_for_its_request(harness):
    first = harness.connect()
    first.sendall(harness.partial)
    wait_for(lambda: [bytes(c.buffer) for c in harness.mux.connections] == [harness.partial])
    harness.clock.now += 0.5  # the others came later: the first has waited longest
    others = open_connections(harness, CAP - 1)
    try:
        assert harness.answered(exchange(harness)), "a newcomer at the cap is served"
        received = read_all(first)
        if harness.kind == "control":
            assert b"too many connections" in received
        else:
            assert received == b""
        # the evicted one leaves the list once the loop has flushed and closed it (after the client
        # read its EOF); the others stay
        wait_for(lambda: len(harness.mux.connections) == CAP - 1)
        assert all(not c.closed for c in harness.mux.connections), "the others are kept"
    finally:
        first.close()
        for sock in others:
            sock.close()


def test_at_the_cap_with_none_reading_the_oldest_makes_room(harness):
    """Both servers now: a crowd that keeps every connection busy cannot keep a newcomer out
    (the control socket used to refuse it "busy" for as long as the crowd stayed)."""
    busy = []
    for _ in range(CAP):
        busy += open_connections(harness, 1)
        busy[-1].sendall(harness.request("wait"))
        harness.clock.now += 0.1  # in order: the first is the oldest
        wait_for(lambda: harness.mux.connections[-1].phase in (Phase.QUEUED, Phase.HANDLING))
    try:
        with harness.connect() as late:
            assert read_all(busy[0]) == b"", "the oldest busy connection made room"
            wait_for(lambda: len(harness.mux.connections) == CAP)
            late.sendall(harness.request("x"))
            harness.gate.set()
            if harness.kind == "control":
                late.shutdown(socket.SHUT_WR)
            assert harness.answered(read_all(late))
    finally:
        for sock in busy:
            sock.close()


# --- the deadline -------------------------------------------------------------------------------


def test_a_request_dribbled_a_byte_at_a_time_ends_at_its_deadline(harness):
    with harness.connect() as sock:
        sock.sendall(harness.partial)
        wait_for(lambda: [bytes(c.buffer) for c in harness.mux.connections] == [harness.partial])
        conn = harness.mux.connections[0]
        harness.clock.now += harness.timeout_s - 0.1
        for sent in (b" ", b" "):  # each read succeeds; the second one's round follows the first's expiry
            size = len(conn.buffer)
            sock.sendall(sent)
            wait_for(lambda size=size: len(conn.buffer) > size)
        assert not conn.closed, "not cut off before its deadline, however many reads it took"
        harness.clock.now += 0.2
        harness.mux.poke()
        received = read_all(sock)
    assert conn.closed
    if harness.kind == "control":
        assert json.loads(received) == {"ok": False, "error": f"request not complete within {harness.timeout_s:g} s"}
    else:
        assert received == b""
    assert harness.answered(exchange(harness))


# --- out of file descriptors ----------------------------------------------------------------------


def test_out_of_descriptors_sheds_readers_keeps_busy_ones_and_pauses(harness, monkeypatch):
    reader = harness.connect()
    reader.sendall(harness.partial)
    busy = harness.connect()
    busy.sendall(harness.request("wait"))
    wait_for(lambda: harness.waiting == ["wait"] and len(harness.mux.connections) == 2)
    listener, real_accept, short = harness.mux._listener, socket.socket.accept, [True]

    def accept(sock: socket.socket):
        if short[0] and sock is listener:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(sock)

    monkeypatch.setattr(socket.socket, "accept", accept)
    try:
        with harness.connect() as late:
            wait_for(lambda: harness.mux.acceptor.wait_s() is not None)  # the listener rests
            assert harness.mux.acceptor.failures > 0
            assert read_all(reader) in (b"", b'{"ok": false, "error": "too many connections; dropped the one '
                                            b'waiting longest"}\n'), "the reader made room"
            assert [c.phase for c in harness.mux.connections] == [Phase.HANDLING], "the busy one is kept"
            short[0] = False
            harness.clock.now += PAUSE_MAX_S + 0.5
            harness.mux.poke()
            late.sendall(harness.request("x"))
            if harness.kind == "control":
                late.shutdown(socket.SHUT_WR)
            assert harness.answered(read_all(late)), "served once descriptors are free"
        harness.gate.set()
        if harness.kind == "control":
            busy.shutdown(socket.SHUT_WR)
        assert harness.answered(read_all(busy))
    finally:
        reader.close()
        busy.close()


# --- the wake-up socket ---------------------------------------------------------------------------


def test_pokes_never_block_and_one_after_stop_is_only_logged(harness, caplog):
    mux = harness.mux
    poker = threading.Thread(target=lambda: [mux.poke() for _ in range(100_000)], daemon=True)
    poker.start()
    poker.join(30)
    assert not poker.is_alive(), "a poke blocked on a full wake socket"
    assert harness.answered(exchange(harness))
    harness.server.stop()
    mux.poke()  # a handler finishing after stop: nobody to wake, nothing raised
    assert any("wake-up" in r.getMessage() for r in caplog.records if r.name == "yoloedge.netio.wake")


# --- writing ----------------------------------------------------------------------------------------


def test_a_client_that_never_reads_its_reply_pins_nothing_and_is_dropped_at_its_deadline(harness):
    with harness.connect() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(harness.request("big"))
        wait_for(lambda: any(c.phase is Phase.WRITING and c.outbox for c in list(harness.mux.connections)))
        stuck = next(c for c in harness.mux.connections if c.phase is Phase.WRITING)
        assert harness.answered(exchange(harness)), "others are served while the reply waits for room"
        harness.clock.now += harness.timeout_s + 0.1
        harness.mux.poke()
        wait_for(lambda: stuck.closed)
        assert len(read_all(sock)) < BIG, "the rest of the reply was dropped, not waited for"
    assert harness.answered(exchange(harness))
