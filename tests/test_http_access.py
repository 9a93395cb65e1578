"""Who the HTTP endpoint answers: Host names (DNS rebinding) and the delay after wrong passwords.
Real sockets against the real server; its clock is injected where a delay is asserted."""

from __future__ import annotations

import base64
import dataclasses
import socket
import threading
import time
from http import HTTPStatus
from pathlib import Path

import pytest

from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import HttpConfig
from yoloedge.web import server as server_module
from yoloedge.web.access import (AUTH_DELAY_FIRST_S, AUTH_DELAY_MAX_S, AUTH_FORGET_AFTER_S, AUTH_MAX_CLIENTS,
                                 AuthThrottle, HostPolicy)
from yoloedge.web.endpoint import HttpEndpoint
from yoloedge.web.server import BasicAuth, HttpServer, Router, text_response

SECRET = "right-pass-7Qx"


class FakeClock:
    """Moved by the test; counts its reads, so a test can wait until the I/O thread has looked."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._cond = threading.Condition()

    def __call__(self) -> float:
        with self._cond:
            self.reads += 1
            self._cond.notify_all()
            return self.now

    def advance(self, seconds: float) -> None:
        with self._cond:
            self.now += seconds

    def wait_reads(self, more: int, timeout: float = 10.0) -> None:
        with self._cond:
            target = self.reads + more
            assert self._cond.wait_for(lambda: self.reads >= target, timeout), "the I/O thread stopped turning"


def raw(port: int, data: bytes, source: str = "127.0.0.1", timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def get(path: str, host: str | None = None, auth: str | None = None, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {path} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    if auth is not None:
        lines.append("Authorization: Basic " + base64.b64encode(f"prom:{auth}".encode()).decode())
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def endpoint_server(http: HttpConfig) -> tuple[HttpEndpoint, HttpServer]:
    """The daemon's endpoint (its routes, Host policy and auth, from the config) on a free port."""
    endpoint = HttpEndpoint(lambda: {"ok": True, "cameras": []}, lambda: None)
    endpoint.router.add("/", lambda request: text_response(HTTPStatus.OK, "page"))
    assert http.listen is not None
    endpoint.start(dataclasses.replace(http, listen=(http.listen[0], 0)))
    assert endpoint.server is not None
    return endpoint, endpoint.server


# -- Host: DNS rebinding -------------------------------------------------------------------------

LOOPBACK_NAMES = ["127.0.0.1", "127.0.0.1:{port}", "localhost", "localhost:{port}", "LocalHost.", "app.localhost:9",
                  "127.8.9.10", "[::1]", "[::1]:{port}", "[::ffff:127.0.0.1]:{port}", "localhost:"]
FOREIGN_NAMES = ["rebind.example:{port}", "rebind.example", "127.0.0.1.rebind.example", "localhost.rebind.example",
                 "evillocalhost", "192.0.2.7:{port}", "[2001:db8::1]", "0x7f000001", "2130706433:{port}"]
MALFORMED = ["", "a b", "[::1", "x:y:z", "user@127.0.0.1", "127.0.0.1:99999999", "[nothex]:1", "a..b"]


@pytest.fixture()
def loopback():
    endpoint, server = endpoint_server(HttpConfig(listen=("127.0.0.1", 8480)))
    yield server.address[1]
    endpoint.stop()


def test_loopback_names_are_answered_any_other_name_gets_421(loopback):
    port = loopback
    for name in LOOPBACK_NAMES:
        reply = raw(port, get("/api/status", name.format(port=port)))
        assert status_of(reply) == 200, (name, reply[:200])
    for name in FOREIGN_NAMES:
        reply = raw(port, get("/api/status", name.format(port=port)))
        assert status_of(reply) == 421, (name, reply[:200])
        assert b'"cameras"' not in reply and b"Misdirected" in reply
    for name in MALFORMED:
        assert status_of(raw(port, get("/api/status", name))) == 400, name


def test_http11_without_host_or_with_two_is_400_http10_may_omit_it(loopback):
    port = loopback
    assert status_of(raw(port, get("/api/status"))) == 400
    assert status_of(raw(port, get("/api/status", version="HTTP/1.0"))) == 200
    assert status_of(raw(port, get("/api/status", "rebind.example", version="HTTP/1.0"))) == 421
    two = b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nhost: rebind.example\r\n\r\n"
    assert status_of(raw(port, two)) == 400


def test_a_rebinding_name_gets_421_before_any_password_prompt():
    endpoint, server = endpoint_server(HttpConfig(listen=("127.0.0.1", 8480), username="prom", password=SECRET))
    try:
        port = server.address[1]
        reply = raw(port, get("/", "rebind.example", auth=SECRET))
        assert status_of(reply) == 421 and b"WWW-Authenticate" not in reply
        assert status_of(raw(port, get("/", f"localhost:{port}", auth=SECRET))) == 200
    finally:
        endpoint.stop()


def test_remote_with_allowed_hosts_answers_those_loopback_and_the_listen_address_only():
    http = HttpConfig(listen=("127.0.0.1", 8480), allow_remote=True, allowed_hosts=("edge1.lan", "192.0.2.7", "2001:db8::5"))
    endpoint, server = endpoint_server(http)
    try:
        port = server.address[1]
        for name in ("edge1.lan", "EDGE1.lan.:8480", "192.0.2.7:9100", "[2001:db8::5]", "[2001:DB8:0::5]:1",
                     "localhost", "127.0.0.1"):
            assert status_of(raw(port, get("/api/status", name))) == 200, name
        for name in ("edge2.lan", "sub.edge1.lan", "192.0.2.8", "rebind.example"):
            assert status_of(raw(port, get("/api/status", name))) == 421, name
        # A reload that changes only the names applies them on the running server.
        endpoint.apply(dataclasses.replace(endpoint.config, allowed_hosts=("edge2.lan",)))
        assert endpoint.server is server
        assert status_of(raw(port, get("/api/status", "edge2.lan"))) == 200
        assert status_of(raw(port, get("/api/status", "edge1.lan"))) == 421
        # Without a list, a remote endpoint answers any name, as before.
        endpoint.apply(dataclasses.replace(endpoint.config, allowed_hosts=()))
        assert status_of(raw(port, get("/api/status", "rebind.example"))) == 200
        assert status_of(raw(port, get("/api/status"))) == 400  # HTTP/1.1 without Host, still
    finally:
        endpoint.stop()


def test_the_listen_address_is_answered_with_or_without_its_port():
    """A remote listener on one address answers its literal (a scraper that knows the box by it)."""
    for listen, literal in (("192.0.2.7", "192.0.2.7"), ("2001:db8::7", "[2001:db8:0::7]")):
        policy = HostPolicy(listen, ("edge1.lan",))
        assert policy.refusal("HTTP/1.1", literal) is None
        assert policy.refusal("HTTP/1.1", f"{literal}:8480") is None
        assert policy.refusal("HTTP/1.1", "192.0.2.8:8480") is HTTPStatus.MISDIRECTED_REQUEST
    # 0.0.0.0 and :: are no names anyone is reached by
    for unspecified in ("0.0.0.0", "::"):
        policy = HostPolicy(unspecified, ("edge1.lan",))
        assert policy.refusal("HTTP/1.1", unspecified if unspecified[0] == "0" else "[::]") is HTTPStatus.MISDIRECTED_REQUEST


# -- config ---------------------------------------------------------------------------------------

def load_http(tmp_path: Path, section: str) -> HttpConfig:
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    path = tmp_path / "c.yaml"
    path.write_text(f"device_id: e\nmodel:\n  path: m.onnx\nhttp:\n{section}")
    return load_config(str(path), {}).http


def test_allowed_hosts_are_read_in_the_form_they_are_compared_in(tmp_path):
    assert load_http(tmp_path, "  listen: 127.0.0.1:8480\n").allowed_hosts == ()
    config = load_http(tmp_path, "  listen: 0.0.0.0:8480\n  allow_remote: true\n"
                                 "  allowed_hosts: [Edge1.LAN., 192.0.2.7, '[2001:DB8::5]', '::1', edge1.lan]\n")
    assert config.allowed_hosts == ("edge1.lan", "192.0.2.7", "2001:db8::5", "::1")
    assert load_http(tmp_path, "  allowed_hosts: null\n").allowed_hosts == ()
    assert load_http(tmp_path, "  allowed_hosts: []\n").allowed_hosts == ()


@pytest.mark.parametrize("entries, line, words", [
    ("[edge1.lan:8480]", 5, "leave out the port"),
    ("['[::1]:8480']", 5, "leave out the port"),
    ("[edge 1]", 5, "host name or an IP address"),
    ("[http://edge1.lan/]", 5, "host name or an IP address"),
    ("edge1.lan", 5, "list of host names"),
    ("[8480]", 5, "string"),
    ("[" + ", ".join(f"h{i}.lan" for i in range(65)) + "]", 5, "at most 64"),
])
def test_bad_allowed_hosts_name_file_line_key_and_fix(tmp_path, entries, line, words):
    with pytest.raises(ConfigError) as caught:
        load_http(tmp_path, f"  allowed_hosts: {entries}\n")
    text = str(caught.value)
    assert f"c.yaml:{line}:" in text and "http.allowed_hosts" in text and words in text, text


# -- the delay after wrong passwords ------------------------------------------------------------

@pytest.fixture()
def guarded():
    """A server with basic auth on a clock the test moves."""
    clock = FakeClock()
    router = Router(clock)
    router.auth = BasicAuth("prom", SECRET)
    router.add("/x", lambda request: text_response(HTTPStatus.OK, "fine"))
    server = HttpServer("127.0.0.1", 0, router, clock=clock)
    server.start()
    yield server, router, clock
    server.stop()


def open_request(port: int, password: str, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(get("/x", "127.0.0.1", auth=password))
    return sock


def unanswered(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # a reply, or the end of the connection
        return False
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)
        sock.settimeout(10)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_wrong_password_is_answered_after_a_delay_that_doubles(guarded):
    server, router, clock = guarded
    port = server.address[1]
    assert status_of(raw(port, get("/x", "127.0.0.1", auth=SECRET))) == 200  # at once, clock standing still
    assert status_of(raw(port, get("/x", "127.0.0.1"))) == 401  # no credentials: no guess, no delay
    for failures in range(7):
        delay = min(AUTH_DELAY_MAX_S, AUTH_DELAY_FIRST_S * 2 ** failures)
        sock = open_request(port, "wrong")
        with sock:
            wait_until(lambda: server.held_replies == 1)
            clock.advance(delay * 0.99)
            clock.wait_reads(20)  # the I/O thread has looked at the clock since, a few times
            assert unanswered(sock), f"failure {failures + 1}: answered before its {delay} s"
            clock.advance(delay * 0.02)
            reply = read_all(sock)
        assert status_of(reply) == 401 and b"WWW-Authenticate: Basic" in reply


def test_credentials_sent_during_the_delay_are_not_checked(guarded):
    """Guesses sent in parallel get one check per delay: even the right password waits and is
    refused while the client's delay runs; sent after it, it is let in and the slate is clean."""
    server, router, clock = guarded
    port = server.address[1]
    first = open_request(port, "wrong")
    wait_until(lambda: server.held_replies == 1)
    parallel = [open_request(port, password) for password in ("wrong2", "wrong3", SECRET)]
    wait_until(lambda: server.held_replies == 4)
    clock.wait_reads(20)
    assert all(unanswered(s) for s in [first, *parallel])
    clock.advance(AUTH_DELAY_FIRST_S)
    assert [status_of(read_all(s)) for s in [first, *parallel]] == [401, 401, 401, 401]
    for sock in [first, *parallel]:
        sock.close()
    assert status_of(raw(port, get("/x", "127.0.0.1", auth=SECRET))) == 200
    assert len(router.throttle) == 0
    with open_request(port, "wrong") as again:  # the first delay again, not a longer one
        wait_until(lambda: server.held_replies == 1)
        assert router.throttle.wait_s("127.0.0.1") == pytest.approx(AUTH_DELAY_FIRST_S)
        clock.advance(AUTH_DELAY_FIRST_S)
        assert status_of(read_all(again)) == 401


def test_waiting_replies_hold_no_thread_and_other_clients_are_not_delayed(guarded):
    server, router, clock = guarded
    port = server.address[1]
    waiting = [open_request(port, f"wrong{i}") for i in range(3 * server_module.HANDLERS)]
    wait_until(lambda: server.held_replies == len(waiting))
    clock.wait_reads(20)
    # clock standing still: another client is served at once, right or wrong password
    assert status_of(raw(port, get("/x", "127.0.0.1", auth=SECRET), source="127.0.0.2")) == 200
    with open_request(port, "wrong", source="127.0.0.3") as other:
        wait_until(lambda: router.throttle.wait_s("127.0.0.3") > 0)
        assert router.throttle.wait_s("127.0.0.3") == pytest.approx(AUTH_DELAY_FIRST_S)
    assert all(unanswered(s) for s in waiting)
    clock.advance(AUTH_DELAY_MAX_S)
    assert [status_of(read_all(s)) for s in waiting] == [401] * len(waiting)
    for sock in waiting:
        sock.close()


def test_the_table_of_clients_is_bounded_and_forgets():
    clock = FakeClock()
    throttle = AuthThrottle(clock)
    for i in range(3 * AUTH_MAX_CLIENTS):
        throttle.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
    assert len(throttle) == AUTH_MAX_CLIENTS
    assert throttle.wait_s("10.0.0.0") == 0  # the least recent was forgotten first
    assert throttle.wait_s(f"10.0.{(3 * AUTH_MAX_CLIENTS - 1) >> 8 & 255}.{(3 * AUTH_MAX_CLIENTS - 1) & 255}") > 0
    # One IPv6 /64 is one client, whatever its addresses; a v4-mapped address is its IPv4 address.
    first = throttle.failed("2001:db8:1:2::1")
    assert throttle.failed("2001:db8:1:2:ffff::9") == 2 * first
    assert throttle.wait_s("2001:db8:1:3::1") == 0
    assert throttle.failed("::ffff:10.9.9.9") == first and throttle.wait_s("10.9.9.9") > 0
    clock.advance(AUTH_FORGET_AFTER_S)
    throttle.failed("192.0.2.1")
    assert len(throttle) == 1
