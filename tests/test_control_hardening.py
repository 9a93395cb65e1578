"""Hostile clients on the control socket: every malformed request answered, no thread traceback,
slow or silent clients unable to lock `yoloedge-ctl` out. Against the server directly (with an
injected clock where a deadline matters) and against the real daemon's socket."""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import REPO, Daemon, NotifySocket, write_config
from yoloedge import demo
from yoloedge.control import protocol
from yoloedge.control.client import ControlError, request
from yoloedge.control import server as server_module
from yoloedge.control.server import (MAX_CONNECTIONS, MAX_HANDLERS, MAX_MALFORMED_LINES, MAX_REQUEST_BYTES,
                                     ControlServer, Lane)
from yoloedge.netio.connection import Phase
from yoloedge.config.loader import load_config
from yoloedge.daemon import Daemon as YoloDaemon, DaemonState
from yoloedge.pipeline.groups import AcceleratorGroup
from yoloedge.pipeline.worker import DeviceWorker

#: (name, request bytes): each must get one `{"ok": false, "error": ...}` reply.
HOSTILE = [
    ("array 100k deep", b"[" * 100_000 + b"\n"),  # over the size limit
    ("array 60k deep", b"[" * 60_000 + b"\n"),  # under it: the depth limit answers
    ("object 10k deep", b'{"a":' * 10_000 + b"1" + b"}" * 10_000 + b"\n"),
    ("deep inside a valid request", b'{"cmd": "status", "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}\n"),
    ("just too deep", b'{"cmd": "status", "x": ' + b"[" * 8 + b"]" * 8 + b"}\n"),
    ("5000-digit integer", b'{"cmd": "status", "n": ' + b"7" * 5000 + b"}\n"),
    ("5000-digit negative integer", b'{"cmd": "status", "n": -' + b"9" * 5000 + b"}\n"),
    ("5000-digit fraction", b'{"cmd": "status", "n": 0.' + b"3" * 5000 + b"}\n"),
    ("overflowing float", b'{"cmd": "status", "n": 1e999}\n'),
    ("NaN", b'{"cmd": "status", "n": NaN}\n'),
    ("Infinity", b'{"cmd": "status", "n": -Infinity}\n'),
    ("invalid UTF-8", b'{"cmd": "st\xffatus"}\n'),
    ("UTF-16", '{"cmd": "status"}'.encode("utf-16") + b"\n"),
    ("overlong UTF-8 encoding", b'{"cmd": "\xc0\xafstatus"}\n'),
    ("not JSON", b"status please\n"),
    ("truncated JSON", b'{"cmd": "stat\n'),
    ("array", b'["status"]\n'),
    ("number", b"42\n"),
    ("cmd not a string", b'{"cmd": ["status"]}\n'),
    ("no cmd", b'{"command": "status"}\n'),
    ("NUL bytes", b'{"cmd": "status"}\x00\x00\n'),
    ("duplicate cmd: the last would win", b'{"cmd": "status", "cmd": "reload"}\n'),
    ("duplicate key inside", b'{"cmd": "status", "x": {"a": 1, "a": 2}}\n'),
]


class Handler:
    """Stands in for the daemon: status is small, `big` is a reply a client may never read."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.release = threading.Event()

    def __call__(self, req: dict) -> dict:
        self.requests.append(req)
        if req["cmd"] == "status":
            return {"ok": True, "state": "running"}
        if req["cmd"] == "big":
            return {"ok": True, "blob": "x" * (8 * 1024 * 1024)}
        if req["cmd"] == "nan":
            return {"ok": True, "rate": float("nan"), "rates": [1.5, float("inf")]}
        if req["cmd"] == "wait":
            self.release.wait(10)
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {req['cmd']!r}"}


class FakeClock:
    """Moved by the test; `hold` stops the I/O thread in its next read of the clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.go = threading.Event()
        self.go.set()
        self.held = threading.Event()  # the I/O thread waits in the clock

    def __call__(self) -> float:
        if not self.go.is_set():
            self.held.set()
            self.go.wait(30)
        return self.now


@pytest.fixture
def thread_crashes(monkeypatch):
    """Every exception that escapes a thread (what used to print a thread traceback)."""
    crashes: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    return crashes


@pytest.fixture
def handler():
    h = Handler()
    yield h
    h.release.set()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def server(sock_dir, handler, clock, thread_crashes, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge.control")
    srv = ControlServer(os.path.join(sock_dir, "control.sock"), 0o660, handler, client_timeout_s=5.0,
                        clock=clock)
    srv.start()
    yield srv
    srv.stop()
    assert not thread_crashes, [str(c.exc_value) for c in thread_crashes]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    """Connected, waiting for room in the accept queue (a Unix socket refuses at once when full)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def read_all(sock: socket.socket) -> bytes:
    """Until the server closes (or the socket's timeout, which then fails the test).

    A server that closes with our unread bytes in its queue resets the connection after the
    data it sent: that is its close too.
    """
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def replies(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines()]


def exchange(path: str, data: bytes) -> list[dict]:
    with connect(path) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return replies(read_all(sock))


def still_serving(path: str) -> bool:
    return request(path, {"cmd": "status"}, timeout=5.0) == {"ok": True, "state": "running"}


# --- malformed requests -----------------------------------------------------------------------


@pytest.mark.parametrize("data", [d for _, d in HOSTILE], ids=[n for n, _ in HOSTILE])
def test_every_malformed_request_gets_an_error_reply(server, handler, data):
    got = exchange(server.path, data)
    assert len(got) == 1 and got[0]["ok"] is False, got
    expected = "malformed request" if len(data) <= MAX_REQUEST_BYTES else "request longer than"
    assert got[0]["error"].startswith(expected), got
    assert handler.requests == []
    assert still_serving(server.path)


def test_a_malformed_request_is_answered_even_when_the_client_keeps_the_connection_open(server):
    with connect(server.path) as sock:
        sock.sendall(b"[" * 60_000 + b"\n")
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["ok"] is False and "nested" in reply["error"]


def test_huge_request_without_newline_is_answered_then_closed(server, handler):
    with connect(server.path) as sock:
        try:
            sock.sendall(b'{"cmd": "' + b"a" * (MAX_REQUEST_BYTES * 4))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may hang up while we are still sending; its reply is already queued
        got = replies(read_all(sock))
    assert got == [{"ok": False, "error": f"request longer than {MAX_REQUEST_BYTES} bytes"}]
    assert handler.requests == []
    assert still_serving(server.path)


def test_a_request_just_under_the_limit_is_served(server, handler):
    padding = MAX_REQUEST_BYTES - 40
    got = exchange(server.path, b'{"cmd": "status", "pad": "' + b"p" * padding + b'"}\n')
    assert got == [{"ok": True, "state": "running"}]


def test_brackets_inside_strings_do_not_count_as_nesting(server, handler):
    got = exchange(server.path, b'{"cmd": "status", "x": "' + b"[{" * 5000 + b'\\"]]"}\n')
    assert got == [{"ok": True, "state": "running"}]


def test_lone_surrogate_in_cmd_is_answered_in_valid_json(server):
    got = exchange(server.path, b'{"cmd": "\\ud800"}\n')
    assert got[0]["ok"] is False and "unknown command" in got[0]["error"]


def test_non_finite_numbers_in_a_reply_go_out_as_null(server):
    """JSON has no NaN: `yoloedge-ctl` must still get a status whose rate is momentarily undefined."""
    assert request(server.path, {"cmd": "nan"}) == {"ok": True, "rate": None, "rates": [1.5, None]}


def test_good_lines_after_a_bad_one_on_the_same_connection_are_served(server):
    got = exchange(server.path, b'{"cmd": NaN}\n{"cmd": "status"}\n{"cmd": "status"}')
    assert [r["ok"] for r in got] == [False, True, True]


def test_a_flood_of_malformed_lines_is_cut_short_and_hurts_no_other_client(server):
    """Each malformed line used to be answered five stack frames deeper: 400 of them in one send
    raised RecursionError in the I/O thread, which then dropped every connection."""
    with connect(server.path) as other:
        with connect(server.path) as flooder:
            try:
                flooder.sendall(b"x\n" * 5000)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed after the last malformed line it answers
            got = replies(read_all(flooder))
        assert len(got) == MAX_MALFORMED_LINES and not any(r["ok"] for r in got), got
        assert "closing the connection" in got[-1]["error"]
        other.sendall(b'{"cmd": "status"}\n')
        assert json.loads(other.makefile("rb").readline()) == {"ok": True, "state": "running"}


def test_thousands_of_pipelined_lines_are_served_by_a_loop_not_recursion(server, monkeypatch):
    monkeypatch.setattr(server_module, "MAX_MALFORMED_LINES", 10**6)
    got = exchange(server.path, b"x\n" * 5000 + b'{"cmd": "status"}\n')
    assert len(got) == 5001 and got[-1] == {"ok": True, "state": "running"}


# --- deadlines (injected clock) -----------------------------------------------------------------


def test_the_deadline_covers_the_whole_request_not_each_read(server, clock):
    with connect(server.path) as sock:
        sock.sendall(b'{"cmd":')
        for _ in range(10):  # a byte at a time: each read succeeds, the request never completes
            sock.sendall(b" ")
            time.sleep(0.02)
        # accepted and read (at clock 1000) before the clock moves, however slow the I/O thread
        wait_for(lambda: [bytes(c.buffer) for c in list(server._mux.connections)] == [b'{"cmd":' + b" " * 10])
        clock.now += 4.9
        sock.sendall(b" ")
        sock.settimeout(0.6)  # > the I/O thread's longest sleep: it has looked at the clock
        with pytest.raises(socket.timeout):
            sock.recv(1)  # not cut off before the deadline
        clock.now += 0.2
        sock.settimeout(5.0)
        sock.sendall(b" ")
        got = replies(read_all(sock))
    assert got == [{"ok": False, "error": "request not complete within 5 s"}]
    assert still_serving(server.path)


def test_a_client_that_connects_and_never_sends_is_closed_without_a_reply(server, clock):
    with connect(server.path) as sock:
        sock.settimeout(0.5)
        for _ in range(10):  # until the server has accepted it: its deadline runs from then
            clock.now += 5.1
            try:
                assert sock.recv(1) == b""
                return
            except socket.timeout:
                continue
    pytest.fail("a silent client was never disconnected")


def test_the_deadline_restarts_for_each_request_on_a_connection(server, clock):
    with connect(server.path) as sock:
        reader = sock.makefile("rb")
        for _ in range(3):
            clock.now += 4.0
            sock.sendall(b'{"cmd": "status"}\n')
            assert json.loads(reader.readline())["ok"] is True


def test_a_client_that_never_reads_its_reply_is_dropped_and_pins_nothing(server, clock):
    with connect(server.path) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b'{"cmd": "big"}\n')
        wait_for(lambda: any(c.phase is Phase.WRITING and c.outbox for c in list(server._mux.connections)))
        stuck = next(c for c in list(server._mux.connections) if c.phase is Phase.WRITING)
        assert still_serving(server.path)  # while the 8 MB reply is stuck
        clock.now += 5.1
        wait_for(lambda: stuck.closed)  # before reading: a reader would drain the reply in time
        sock.settimeout(5.0)
        received = read_all(sock)
    assert len(received) < 8 * 1024 * 1024, "the server gave up on the reply"
    assert still_serving(server.path)


# --- many and slow clients ------------------------------------------------------------------------


def test_many_slow_clients_cannot_lock_ctl_out(server):
    slow = [connect(server.path) for _ in range(MAX_CONNECTIONS + 16)]
    try:
        for round_ in range(3):
            for sock in slow:
                try:
                    sock.send(b'{"cmd": "status"'[round_:round_ + 1])
                except OSError:
                    pass  # dropped to make room: expected for the oldest ones
            result = subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", server.path,
                                     "--timeout", "5", "status", "--json"],
                                    cwd=REPO, capture_output=True, text=True, timeout=30)
            assert result.returncode in (0, 1), result.stderr  # answered (1: the canned status has no daemon)
            assert json.loads(result.stdout)["state"] == "running"
    finally:
        for sock in slow:
            sock.close()


def test_a_flood_of_connections_cannot_lock_ctl_out(server):
    stop = threading.Event()
    opened: list[socket.socket] = []

    def flood() -> None:
        while not stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(server.path)
            except OSError:
                sock.close()
                continue
            opened.append(sock)
            if len(opened) > 4 * MAX_CONNECTIONS:
                opened.pop(0).close()
            time.sleep(0.0005)  # still thousands a second, without starving every other thread of the GIL

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        for _ in range(5):  # a generous timeout: CI machines are loaded; the point is "answered at all"
            assert request(server.path, {"cmd": "status"}, timeout=15.0) == {"ok": True, "state": "running"}
    finally:
        stop.set()
        flooder.join(5)
        for sock in opened:
            sock.close()


def test_the_oldest_waiting_connection_is_dropped_first(server):
    first = connect(server.path)
    first.sendall(b"{")
    time.sleep(0.1)
    others = [connect(server.path) for _ in range(MAX_CONNECTIONS)]
    try:
        first.settimeout(5.0)
        got = replies(read_all(first))
        assert got and got[0]["ok"] is False and "too many connections" in got[0]["error"]
        assert still_serving(server.path)
    finally:
        first.close()
        for sock in others:
            sock.close()


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_handlers_are_bounded_requests_wait_their_turn_until_their_deadline(server, handler, clock):
    waiting = [connect(server.path) for _ in range(MAX_HANDLERS)]
    try:
        for sock in waiting:
            sock.sendall(b'{"cmd": "wait"}\n')
        wait_for(lambda: len(handler.requests) == MAX_HANDLERS)
        with connect(server.path) as late:
            late.sendall(b'{"cmd": "status"}\n')
            wait_for(lambda: server._mux.lanes.waiting(Lane.QUICK) == 1)
            assert len(handler.requests) == MAX_HANDLERS, "no fifth handler"
            clock.now += 5.1
            assert json.loads(late.makefile("rb").readline()) == {"ok": False, "error": "server busy, try again"}
        with connect(server.path) as later:
            later.sendall(b'{"cmd": "status"}\n')  # queued, then served as soon as a handler is free
            wait_for(lambda: server._mux.lanes.waiting(Lane.QUICK) == 1)
            handler.release.set()
            assert json.loads(later.makefile("rb").readline()) == {"ok": True, "state": "running"}
        for sock in waiting:
            assert json.loads(sock.makefile("rb").readline()) == {"ok": True}
        assert still_serving(server.path)
    finally:
        for sock in waiting:
            sock.close()


def test_slow_commands_never_make_status_wait(sock_dir, handler, thread_crashes):
    """Four reloads used to take every handler slot for up to 30 s each: status answered "busy"."""
    path = os.path.join(sock_dir, "control.sock")
    with ControlServer(path, 0o660, handler, slow=frozenset({"wait"})) as srv:
        waiting = [connect(path) for _ in range(MAX_HANDLERS + 2)]
        try:
            for sock in waiting:
                sock.sendall(b'{"cmd": "wait"}\n')
            wait_for(lambda: srv._mux.lanes.waiting(Lane.SLOW) == 2 and len(handler.requests) == MAX_HANDLERS)
            assert request(path, {"cmd": "status"}, timeout=5.0) == {"ok": True, "state": "running"}
            assert len(handler.requests) == MAX_HANDLERS + 1, "slow ones beyond their slots wait"
            handler.release.set()
            for sock in waiting:
                assert json.loads(sock.makefile("rb").readline()) == {"ok": True}
        finally:
            for sock in waiting:
                sock.close()
    assert not thread_crashes


def test_waking_a_stalled_io_thread_never_blocks(server, clock):
    """Handler threads and stop() poke the I/O thread; a full wake socket must not block them."""
    clock.go.clear()
    server._mux.poke()  # the I/O thread wakes, reads the clock, and is held
    assert clock.held.wait(5)
    poker = threading.Thread(target=lambda: [server._mux.poke() for _ in range(100_000)],
                             daemon=True)
    poker.start()
    poker.join(10)
    stalled = poker.is_alive()
    clock.go.set()
    poker.join(30)
    assert not stalled, "a poke blocked on the full wake socket"
    assert still_serving(server.path)


OUT_OF_FDS = """
import os, resource, socket, sys, tempfile, time
from yoloedge.control.server import ControlServer
from yoloedge.control.client import request
server = ControlServer(os.path.join(sys.argv[1], "c.sock"), 0o660, lambda r: {"ok": True}, client_timeout_s=1.0)
server.start()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
clients = []
while True:
    try:
        sock = socket.socket(socket.AF_UNIX)
    except OSError:
        break
    sock.setblocking(False)
    try:
        sock.connect(server.path)
        clients.append(sock)
    except OSError:
        sock.close()
        break
for sock in clients[:3]:  # room for the server's accept() to fail rather than this process
    sock.close()
time.sleep(0.5)
started = time.process_time()
time.sleep(1.0)
print("cpu", time.process_time() - started)
for sock in clients[3:]:
    sock.close()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print("reply", request(server.path, {"cmd": "status"})["ok"])
server.stop()
"""


def test_out_of_file_descriptors_neither_spins_nor_kills_the_server(sock_dir):
    result = subprocess.run([sys.executable, "-c", OUT_OF_FDS, sock_dir], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert float(lines["cpu"]) < 0.5, "the I/O thread spun on a failing accept()"
    assert lines["reply"] == "True"
    assert result.stderr.count("Too many open files") <= 1, "warned once, not per attempt"


# --- half-closed and vanished clients --------------------------------------------------------------


def test_request_without_newline_then_half_close_is_answered(server):
    assert exchange(server.path, b'{"cmd": "status"}') == [{"ok": True, "state": "running"}]


def test_half_close_without_a_request_is_just_closed(server):
    assert exchange(server.path, b"") == []
    assert exchange(server.path, b"  \n\n") == []


def test_a_client_that_vanishes_before_its_reply_does_not_hurt(server, handler):
    for _ in range(20):
        with connect(server.path) as sock:
            sock.sendall(b'{"cmd": "status"}\n')
    with connect(server.path) as sock:
        sock.sendall(b'{"cmd": "status"}\n')
        sock.shutdown(socket.SHUT_RD)
    assert still_serving(server.path)


# --- the client side -------------------------------------------------------------------------------


def dribbling_server(path: str, reply: bytes, every_s: float, stop: threading.Event) -> threading.Thread:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                for byte in reply:
                    if stop.wait(every_s):
                        return
                    try:
                        conn.send(bytes([byte]))
                    except OSError:
                        return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_client_deadline_covers_the_whole_reply(sock_dir):
    """A daemon answering a byte every 50 ms would keep a per-read timeout waiting forever."""
    stop = threading.Event()
    path = os.path.join(sock_dir, "slow.sock")
    reply = json.dumps({"ok": True, "pad": " " * 200}).encode() + b"\n"  # 10 s at this pace
    thread = dribbling_server(path, reply, 0.05, stop)
    try:
        with pytest.raises(ControlError, match="did not answer"):
            request(path, {"cmd": "status"}, timeout=0.5)
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.parametrize("reply", [b"[" * 100_000 + b"\n", b'{"n": ' + b"1" * 5000 + b"}\n",
                                   b'{"n": NaN}\n', b"\xff\xfe\n", b"[1]\n"])
def test_client_rejects_a_hostile_reply_with_a_control_error(sock_dir, reply):
    path = os.path.join(sock_dir, "evil.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(reply)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(ControlError, match="malformed reply"):
            request(path, {"cmd": "status"}, timeout=5)
        thread.join(5)


def test_nesting_depth_scan():
    assert protocol.nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert protocol.nesting_depth('{"a": "[[[[{{{{\\"]]]"}') == 1
    assert protocol.nesting_depth("]]]][[") == 2
    started = time.perf_counter()
    for hostile in ('"' * MAX_REQUEST_BYTES, '"\\' * (MAX_REQUEST_BYTES // 2), '"a\\' * 20000 + "\\",
                    '["\\"' * 20000):
        protocol.nesting_depth(hostile)
    assert time.perf_counter() - started < 2.0, "the scan is linear, not backtracking"  # 20 s if quadratic


def oldest_supported_python() -> str | None:
    """An interpreter of the oldest Python that pyproject allows, if this machine has one."""
    text = (REPO / "pyproject.toml").read_text()
    version = text.split('requires-python = ">=', 1)[1].split('"', 1)[0]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", "python")))]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(map(int, version.split(".")))):
            return candidate
    return None


CHECK_ON_OLDEST = """
import pathlib
for path in sorted(pathlib.Path("yoloedge").rglob("*.py")):
    compile(path.read_text(), str(path), "exec")  # syntax of every module
from yoloedge.control import client, server  # no third-party imports: these run as they are
from yoloedge.control.protocol import nesting_depth
assert nesting_depth('{"a": "[[\\\\"]]"}') == 1
print("ok")
"""


def test_the_control_socket_code_runs_on_the_oldest_supported_python():
    """Possessive quantifiers (Python 3.11) made the daemon and ctl fail to import on 3.10."""
    python = oldest_supported_python()
    if python is None:
        pytest.skip("no interpreter of the oldest supported Python on this machine")
    result = subprocess.run([python, "-B", "-c", CHECK_ON_OLDEST], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# --- the real daemon ---------------------------------------------------------------------------------


@pytest.fixture
def real_daemon(tmp_path, mosquitto, sock_dir):
    notify = NotifySocket(tmp_path / "notify.sock")
    config = {
        "device_id": "hard1",
        "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": "yt"},
        "control": {"socket": str(sock_dir / "control.sock")},
        "shutdown_timeout_s": 5,
    }
    daemon = Daemon(write_config(tmp_path / "yoloedge.yaml", config), notify)
    try:
        notify.wait_for("READY", "1", timeout=60)
        yield daemon, config["control"]["socket"]
    finally:
        daemon.kill()
        notify.close()


def in_process_daemon(tmp_path: Path) -> tuple[YoloDaemon, Path]:
    """A daemon object that is never run: the test plays its main loop."""
    path = write_config(tmp_path / "yoloedge.yaml", {
        "device_id": "inproc", "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [], "mqtt": {"host": "127.0.0.1", "port": 1883},
        "control": {"socket": str(tmp_path / "control.sock")}})
    daemon = YoloDaemon(load_config(str(path), {}), str(path), {})
    daemon._transition(DaemonState.RUNNING)  # as `run` does once started: reloads come after that
    return daemon, path


def test_a_reload_answers_with_an_attempt_that_read_the_file_after_it_was_asked(tmp_path, monkeypatch):
    """A reload asked for while another runs used to wake on that one's end and report its result,
    though that one had read the file before the request (and before the edit it was for)."""
    daemon, path = in_process_daemon(tmp_path)
    file_read, finish = threading.Event(), threading.Event()
    check = daemon.reloader.check_reloadable

    def held_after_reading(new):  # the attempt has read the file; hold it there
        file_read.set()
        finish.wait(10)
        check(new)

    monkeypatch.setattr(daemon.reloader, "check_reloadable", held_after_reading)
    answers: dict[str, dict] = {}

    def ask(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.setdefault(name, daemon._handle_control({"cmd": "reload"})))
        thread.start()
        wait_for(daemon.reloader.requested.is_set)
        daemon.reloader.requested.clear()  # as the main loop does before each attempt
        return thread

    first = ask("first")
    attempt = threading.Thread(target=daemon.reloader.reload)
    attempt.start()
    assert file_read.wait(10)
    path.write_text("cameras: [not closed\n")  # the edit the second request is for
    second = ask("second")
    finish.set()
    attempt.join(10)
    first.join(10)
    assert answers["first"] == {"ok": True, "generation": 2, "reloaded": True, "config_error": None}
    second.join(1.0)
    assert "second" not in answers, f"answered from the attempt before it: {answers.get('second')}"
    daemon.reloader.reload()
    second.join(10)
    assert answers["second"]["ok"] is False and answers["second"]["reloaded"] is False
    assert str(path) in answers["second"]["config_error"] and answers["second"]["generation"] == 2


def test_reloads_asked_for_together_share_one_attempt(tmp_path):
    daemon, _ = in_process_daemon(tmp_path)
    answers: list[dict] = []
    askers = [threading.Thread(target=lambda: answers.append(daemon._handle_control({"cmd": "reload"})))
              for _ in range(6)]
    for thread in askers:
        thread.start()
    wait_for(lambda: len(daemon.reloader.done._waiters) == 6)  # every asker waits for the attempt
    daemon.reloader.requested.clear()
    daemon.reloader.reload()
    for thread in askers:
        thread.join(10)
    assert answers == [{"ok": True, "generation": 2, "reloaded": True, "config_error": None}] * 6
    assert daemon.reloader.generation == 2


def test_status_while_the_accelerators_are_being_set_up(tmp_path, monkeypatch):
    """The socket answers during start-up: a status that iterated the accelerator groups while
    start-up added the next one failed with "dictionary changed size during iteration"."""
    daemon, path = in_process_daemon(tmp_path)
    config = load_config(str(path), {})
    accelerator = config.accelerators[0]
    daemon.config = config = dataclasses.replace(config, accelerators=(
        dataclasses.replace(accelerator, name="a"), dataclasses.replace(accelerator, name="b")))
    in_worker_status, go_on = threading.Event(), threading.Event()
    worker_status, group_start = DeviceWorker.status, AcceleratorGroup.start
    failures: list[BaseException] = []

    def paused_status(worker):  # the first call holds the status thread mid-iteration
        if not in_worker_status.is_set():
            in_worker_status.set()
            go_on.wait(10)
        return worker_status(worker)

    def ask_status() -> None:
        try:
            daemon.status()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            failures.append(exc)

    asker = threading.Thread(target=ask_status)

    def start(group):  # status is asked after the first group started, answered after the second
        group_start(group)
        if group.name == "a":
            asker.start()
            assert in_worker_status.wait(10)
        else:
            go_on.set()
            asker.join(10)

    monkeypatch.setattr(DeviceWorker, "status", paused_status)
    monkeypatch.setattr(AcceleratorGroup, "start", start)
    try:
        assert daemon._start_accelerators(config)
    finally:
        go_on.set()
        daemon._shutdown()
    assert not asker.is_alive() and failures == []


def ctl_status(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", path, "status", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


def test_real_daemon_answers_every_hostile_request_and_survives(real_daemon):
    daemon, path = real_daemon
    for name, data in HOSTILE:
        got = exchange(path, data)
        assert len(got) == 1 and got[0]["ok"] is False, (name, got)
    got = exchange(path, b'{"cmd": "reload", "config": "/etc/passwd"}\n')
    assert len(got) == 1 and got[0]["ok"] is False and "'config'" in got[0]["error"], got
    with connect(path) as sock:
        try:
            sock.sendall(b"x" * (MAX_REQUEST_BYTES * 2))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert "longer than" in replies(read_all(sock))[0]["error"]
    silent = connect(path)
    half = connect(path)
    half.shutdown(socket.SHUT_WR)
    slow = [connect(path) for _ in range(24)]
    try:
        for round_ in range(3):
            for sock in slow:
                try:
                    sock.send(b"{"[:1] if round_ == 0 else b" ")
                except OSError:
                    pass
            result = ctl_status(path)
            assert result.returncode in (0, 1), result.stdout + result.stderr
            assert json.loads(result.stdout)["daemon"]["state"] == "running"
            time.sleep(1.0)
    finally:
        for sock in [silent, half, *slow]:
            sock.close()
    assert daemon.proc.poll() is None, daemon.log
    assert daemon.stop(timeout=30) == 0, daemon.log
    assert "Traceback" not in daemon.log and "Exception in thread" not in daemon.log, daemon.log


def test_a_duplicate_key_is_refused_naming_it_and_never_reaches_the_handler(server, handler):
    got = exchange(server.path, b'{"cmd": "status", "cmd": "reload"}\n')
    assert got == [{"ok": False, "error": "malformed request: key 'cmd' given twice"}]
    assert handler.requests == []


@pytest.mark.parametrize("request_, named", [
    ({"cmd": "reload", "config": "/etc/passwd"}, "'config'"),
    ({"cmd": "reload", "args": ["-c", "other.yaml"]}, "'args'"),
    ({"cmd": "status", "verbose": True, "x" * 500: 1}, "'verbose'"),
])
def test_the_daemon_refuses_fields_a_command_does_not_take_and_does_nothing(tmp_path, request_, named):
    """`{"cmd": "reload", "config": ...}` answered "reloaded" after reloading the configured file."""
    daemon, _ = in_process_daemon(tmp_path)
    reply = daemon._handle_control(request_)
    assert reply["ok"] is False and named in reply["error"], reply
    assert f"command {request_['cmd']!r} does not take" in reply["error"], reply
    assert len(reply["error"]) < 300, reply  # a 500-character field name is cut short
    assert not daemon.reloader.requested.is_set() and daemon.reloader.generation == 1
