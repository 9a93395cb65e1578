"""Health plumbing against test-owned sockets: sd_notify, worker progress, journald logging."""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import threading
import uuid

import pytest

from yoloedge.config.schema import LoggingConfig
from yoloedge.health.logsetup import (JournaldHandler, RedactingFilter, StderrHandler, make_handler,
                                      redact_text, setup_logging)
from yoloedge.health.notify import SystemdNotifier, watchdog_interval_s
from yoloedge.health.progress import DeviceHealth, ProgressTracker
from yoloedge.redact import redact_url


def datagram_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2.0)
    return sock


@pytest.fixture
def notify_socket(sock_dir):
    path = os.path.join(sock_dir, "notify")
    with datagram_socket(path) as sock:
        yield path, sock


# --- sd_notify -------------------------------------------------------------------------------


def test_notify_sends_one_datagram_to_a_path(notify_socket):
    path, sock = notify_socket
    notifier = SystemdNotifier(path)
    assert notifier.enabled
    assert notifier.notify("READY=1", "STATUS=running") is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=running"


def test_notify_abstract_socket():
    name = f"yoloedge-test-{uuid.uuid4().hex}"
    with datagram_socket("\0" + name) as sock:
        notifier = SystemdNotifier("@" + name)
        assert notifier.ready("up") is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_convenience_messages(notify_socket):
    path, sock = notify_socket
    notifier = SystemdNotifier(path, monotonic_usec=lambda: 123456789)
    assert notifier.reloading("reloading config")
    assert sock.recv(4096) == b"RELOADING=1\nMONOTONIC_USEC=123456789\nSTATUS=reloading config"
    assert notifier.ready()
    assert sock.recv(4096) == b"READY=1"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("camera gate:\nstalled")
    assert sock.recv(4096) == b"STATUS=camera gate: stalled"
    assert notifier.stopping("shutting down")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=shutting down"


def test_default_monotonic_clock_is_used_for_reload(notify_socket):
    path, sock = notify_socket
    SystemdNotifier(path).reloading()
    lines = sock.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=") and int(lines[1].split("=")[1]) > 0


def test_without_socket_is_a_noop(caplog):
    for path in (None, ""):
        notifier = SystemdNotifier(path)
        assert not notifier.enabled
        assert notifier.notify("READY=1") is False
        assert notifier.watchdog() is False
    assert not caplog.records


def test_missing_socket_warns_once_and_returns_false(sock_dir, caplog):
    notifier = SystemdNotifier(os.path.join(sock_dir, "absent"))
    with caplog.at_level(logging.DEBUG, logger="yoloedge.health.notify"):
        assert notifier.ready("up") is False
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "absent" in warnings[0].getMessage()


def test_malformed_assignment_is_a_programming_error():
    with pytest.raises(ValueError):
        SystemdNotifier(None).notify("READY")
    with pytest.raises(ValueError):
        SystemdNotifier(None).notify("STATUS=a\nb")


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "10000000"}, 5.0),
    ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "4242"}, 1.5),
    ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "999"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "ten"}, None),
    ({"WATCHDOG_PID": "4242"}, None),
])
def test_watchdog_interval(environ, expected):
    assert watchdog_interval_s(environ, 4242) == expected


# --- progress --------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_past_deadline_is_a_problem():
    clock = FakeClock()
    tracker = ProgressTracker()
    health = DeviceHealth("onnxruntime0", clock)
    tracker.register(health)
    call = health.begin("inference", 10.0)
    clock.now = 105.0
    assert tracker.check() == []
    clock.now = 112.3
    assert [str(p) for p in tracker.check()] == ["onnxruntime0: inference running for 12.3 s (deadline 10 s)"]
    assert health.overdue() == "inference running for 12.3 s (deadline 10 s)"  # what the supervisor acts on
    health.end(call)
    assert tracker.check() == []


def test_idle_worker_is_healthy_forever():
    clock = FakeClock()
    tracker = ProgressTracker()
    health = DeviceHealth("npu0", clock)
    tracker.register(health)
    clock.now += 86400
    assert tracker.check() == []
    health.end(health.begin("inference", 1.0))
    clock.now += 86400
    assert tracker.check() == [] and tracker.making_progress()


def test_explicit_health_and_calls_without_a_deadline():
    clock = FakeClock()
    tracker = ProgressTracker()
    health = DeviceHealth("trt0", clock)
    tracker.register(health)
    health.begin("first opening of the device", None)  # start-up waits for it: never overdue
    clock.now += 86400
    assert tracker.check() == []
    health.unhealthy("device lost")
    assert [str(p) for p in tracker.check()] == ["trt0: device lost"]
    assert not tracker.making_progress()
    health.healthy()
    assert tracker.check() == []


def test_a_late_return_of_an_abandoned_call_does_not_clear_its_successor():
    clock = FakeClock()
    health = DeviceHealth("w", clock)
    hung = health.begin("inference", 1.0)
    clock.now += 2
    health.abandon(health.overdue() or "")
    health.healthy()
    health.begin("inference", 1.0)
    health.end(hung)  # the abandoned thread's call returns at last
    clock.now += 2
    assert health.overdue() == "inference running for 2.0 s (deadline 1 s)"


def test_unregistered_workers_and_bad_deadlines():
    clock = FakeClock()
    tracker = ProgressTracker()
    health = DeviceHealth("w", clock)
    tracker.register(health)
    health.begin("inference", 1.0)
    tracker.unregister("w")
    tracker.unregister("w")
    clock.now = 1e9
    assert tracker.check() == []
    with pytest.raises(ValueError):
        health.begin("inference", 0)


def test_tracker_is_thread_safe():
    tracker = ProgressTracker()
    records = [DeviceHealth(f"w{i}", FakeClock()) for i in range(4)]
    for health in records:
        tracker.register(health)
    errors = []

    def work(health):
        try:
            for _ in range(2000):
                health.end(health.begin("inference", 60.0))
        except Exception as exc:  # noqa: BLE001 -- surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(h,)) for h in records]
    for t in threads:
        t.start()
    for _ in range(200):
        assert tracker.check() == []
    for t in threads:
        t.join()
    assert errors == []
    assert tracker.check() == [] and tracker.making_progress()


# --- redaction and logging -------------------------------------------------------------------


@pytest.mark.parametrize("url, expected", [
    ("rtsp://admin:secret@10.0.0.5:554/stream", "rtsp://***@10.0.0.5:554/stream"),
    ("rtsp://admin:p@ss@10.0.0.5/x", "rtsp://***@10.0.0.5/x"),
    ("rtsp://viewer@10.0.0.5/x", "rtsp://***@10.0.0.5/x"),
    ("http://cam/x?ch=b%3Ac%40d&a=1", "http://cam/x?ch=b%3Ac%40d&a=***"),
    ("/dev/video0", "/dev/video0"),
])
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_redact_text_finds_urls_in_prose():
    text = "cannot open 'rtsp://u:pw@cam/1' (timeout); broker mqtts://bob:hunter2@broker:8883"
    assert redact_text(text) == ("cannot open 'rtsp://***@cam/1' (timeout); "
                                 "broker mqtts://***@broker:8883")


def parse_journal(datagram: bytes) -> dict[str, str]:
    """The native journal protocol, both the KEY=VALUE and the length-prefixed form."""
    fields, pos = {}, 0
    while pos < len(datagram):
        end = datagram.index(b"\n", pos)
        line = datagram[pos:end]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            pos = end + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", datagram[end + 1:end + 9])
            value = datagram[end + 9:end + 9 + size]
            assert datagram[end + 9 + size:end + 10 + size] == b"\n"
            pos = end + 10 + size
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def test_logger():
    """A logger of our own that does not propagate, so root handlers stay untouched."""
    logger = logging.getLogger(f"yoloedge.test.{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


@pytest.fixture
def journal(sock_dir):
    path = os.path.join(sock_dir, "journal")
    with datagram_socket(path) as sock:
        yield path, sock


def test_journald_fields(journal, test_logger):
    path, sock = journal
    test_logger.addHandler(make_handler("journald", {}, journal_socket=path))
    test_logger.warning("camera %s stalled", "gate", extra={"camera": "gate", "device": "npu0"})
    fields = parse_journal(sock.recv(65536))
    assert fields["MESSAGE"] == "camera gate stalled"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "yoloedge"
    assert fields["LOGGER"] == test_logger.name
    assert fields["CAMERA"] == "gate"
    assert fields["DEVICE"] == "npu0"
    assert fields["CODE_FILE"].endswith("test_health.py")
    assert int(fields["CODE_LINE"]) > 0
    test_logger.debug("no context")
    fields = parse_journal(sock.recv(65536))
    assert fields["PRIORITY"] == "7"
    assert "CAMERA" not in fields and "DEVICE" not in fields


def test_journald_multiline_and_redaction(journal, test_logger):
    path, sock = journal
    test_logger.addHandler(make_handler("journald", {}, journal_socket=path))
    test_logger.error("reconnect failed\nurl rtsp://admin:secret@10.0.0.5/s", extra={"camera": "dock"})
    datagram = sock.recv(65536)
    assert b"secret" not in datagram
    assert b"MESSAGE\n" in datagram  # the binary form
    fields = parse_journal(datagram)
    assert fields["MESSAGE"] == "reconnect failed\nurl rtsp://***@10.0.0.5/s"
    assert fields["PRIORITY"] == "3"
    assert fields["CAMERA"] == "dock"


def test_journald_traceback_is_one_redacted_entry(journal, test_logger):
    path, sock = journal
    test_logger.addHandler(make_handler("journald", {}, journal_socket=path))
    try:
        raise ConnectionError("cannot open rtsp://u:topsecret@cam/1")
    except ConnectionError:
        test_logger.exception("camera failed")
    fields = parse_journal(sock.recv(65536))
    assert fields["MESSAGE"].startswith("camera failed\nTraceback")
    assert "rtsp://***@cam/1" in fields["MESSAGE"]
    assert "topsecret" not in fields["MESSAGE"]


def test_journald_falls_back_to_stderr(sock_dir, test_logger):
    stream = io.StringIO()
    handler = make_handler("journald", {}, journal_socket=os.path.join(sock_dir, "gone"), stream=stream)
    assert isinstance(handler, JournaldHandler)
    test_logger.addHandler(handler)
    test_logger.info("first rtsp://a:b@c/", extra={"camera": "gate"})
    test_logger.info("second")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("WARNING yoloedge.health.logsetup: journald socket")
    assert lines[1] == f"INFO {test_logger.name}: [gate] first rtsp://***@c/"
    assert lines[2] == f"INFO {test_logger.name}: second"


def test_stderr_format_and_redaction(test_logger):
    stream = io.StringIO()
    handler = make_handler("stderr", {}, stream=stream)
    test_logger.addHandler(handler)
    test_logger.info("opening %s", "rtsp://admin:secret@cam/1", extra={"camera": "cam1"})
    test_logger.warning("slow", extra={"device": "onnxruntime0"})
    test_logger.error("both", extra={"camera": "cam1", "device": "npu0"})
    assert stream.getvalue().splitlines() == [
        f"INFO {test_logger.name}: [cam1] opening rtsp://***@cam/1",
        f"WARNING {test_logger.name}: [onnxruntime0] slow",
        f"ERROR {test_logger.name}: [cam1 npu0] both",
    ]


def test_redacting_filter_leaves_bad_format_for_handle_error():
    record = logging.makeLogRecord({"msg": "%d", "args": ("x",)})
    assert RedactingFilter().filter(record) is True
    assert record.msg == "%d"


@pytest.fixture
def root_logger():
    """setup_logging owns the root logger; give pytest's handlers back afterwards."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in saved_handlers:
        root.addHandler(handler)
    root.setLevel(saved_level)


@pytest.mark.parametrize("target, environ, journal_exists, expected", [
    ("auto", {"JOURNAL_STREAM": "8:1234"}, True, JournaldHandler),
    ("auto", {"JOURNAL_STREAM": "8:1234"}, False, StderrHandler),
    ("auto", {}, True, StderrHandler),
    ("journald", {}, False, JournaldHandler),
    ("stderr", {"JOURNAL_STREAM": "8:1234"}, True, StderrHandler),
])
def test_setup_logging_targets(root_logger, sock_dir, target, environ, journal_exists, expected):
    path = os.path.join(sock_dir, "journal")
    sock = datagram_socket(path) if journal_exists else None
    try:
        setup_logging(LoggingConfig(level="debug", target=target), environ, journal_socket=path)
        ours = [h for h in root_logger.handlers if isinstance(h, (JournaldHandler, StderrHandler))]
        assert len(root_logger.handlers) == 1 and len(ours) == 1
        assert type(ours[0]) is expected
        assert any(isinstance(f, RedactingFilter) for f in ours[0].filters)
        assert root_logger.level == logging.DEBUG
    finally:
        if sock is not None:
            sock.close()


def test_setup_logging_twice_replaces_handler(root_logger):
    stream = io.StringIO()
    setup_logging(LoggingConfig(level="info", target="stderr"), {}, stream=stream)
    setup_logging(LoggingConfig(level="warning", target="stderr"), {}, stream=stream)
    assert len(root_logger.handlers) == 1
    assert root_logger.level == logging.WARNING
    logging.getLogger("yoloedge.test").warning("once")
    assert stream.getvalue() == "WARNING yoloedge.test: once\n"


def test_setup_logging_rejects_bad_values(root_logger):
    with pytest.raises(ValueError, match="logging.level"):
        setup_logging(LoggingConfig(level="loud"), {})
    with pytest.raises(ValueError, match="logging.target"):
        setup_logging(LoggingConfig(target="syslog"), {})


def test_a_problem_marks_only_its_own_worker_unhealthy_in_status(tmp_path):
    """Problems carry the worker they belong to. Matching by name prefix made a problem of
    `cpu/10` mark `cpu/1` unhealthy too; here two real workers (devices 1 and 10) run the demo
    model, one is marked broken, and status must blame exactly that one."""
    from yoloedge import demo
    from yoloedge.config import AcceleratorConfig, ModelConfig
    from yoloedge.config.schema import Config, ControlConfig
    from yoloedge.daemon import Daemon

    config = Config(device_id="t", model=ModelConfig(path=str(demo.MODEL)),
                    accelerators=(AcceleratorConfig(name="cpu", devices=(1, 10)),),
                    control=ControlConfig(socket=str(tmp_path / "c.sock")))
    daemon = Daemon(config, str(tmp_path / "unused.yaml"), {})
    assert daemon._start_accelerators(config)
    try:
        daemon.groups["cpu"].workers[1].health.unhealthy("device lost")
        workers = {a["name"]: a for a in daemon.status()["accelerators"]}
        assert workers["cpu/10"]["healthy"] is False
        assert workers["cpu/1"]["healthy"] is True
        assert daemon.status()["daemon"]["problems"] == ["cpu/10: device lost"]
    finally:
        for group in daemon.groups.values():
            group.stop_preparers(5)
            group.stop_workers(5)
            group.stop_post(5)
