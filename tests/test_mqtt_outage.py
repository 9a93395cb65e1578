"""MqttPublisher when the far end is not a working broker, when messages are large, and with the
durable outbox (spool): real TCP servers that misbehave, real mosquitto, the real daemon."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
import time

import pytest

from broker import HOST, Mosquitto
from conftest_mqtt import require_programs
from daemon_harness import Daemon, NotifySocket, status, write_config
from yoloedge.config import MqttConfig
from yoloedge.publish import MqttPublisher, Topics
from yoloedge.publish.spool import Spool

DEVICE = "edge-07"
TOPICS = Topics("yoloedge", DEVICE)
HINT = "is it an MQTT broker?"


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


CONNACK = b"\x20\x02\x00\x00"


def _read_packet(conn: socket.socket) -> tuple[int, bytes] | None:
    """One MQTT packet (type nibble, body) from `conn`, or None at end of stream."""
    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    first = exactly(1)
    if first is None:
        return None
    length, shift = 0, 0
    while True:
        byte = exactly(1)
        if byte is None:
            return None
        length |= (byte[0] & 0x7F) << shift
        shift += 7
        if not byte[0] & 0x80:
            break
    body = exactly(length) if length else b""
    return None if body is None else (first[0] >> 4, body)


class FakeServer:
    """A real TCP listener that is not (quite) an MQTT broker. `behaviour`: "silent" (accepts,
    reads, never answers), "close" (closes at once), "http" (answers like a web server, then
    closes), "flap" (CONNACK, then closes), "noack" (CONNACK and PINGRESP, but swallows PUBLISH
    without PUBACK until `start_acking()`)."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.host, self.port = HOST, self.sock.getsockname()[1]
        self.accepted = 0
        self.publishes = 0
        self._acking = threading.Event()
        self._unacked: list[tuple[socket.socket, bytes]] = []
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.behaviour == "close":
                conn.close()
            elif self.behaviour == "http":
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            elif self.behaviour == "flap":
                conn.recv(4096)
                conn.sendall(CONNACK)
                time.sleep(0.05)
                conn.close()
            elif self.behaviour == "noack":
                self._conns.append(conn)
                threading.Thread(target=self._broker, args=(conn,), daemon=True).start()
            else:
                self._conns.append(conn)

    def _broker(self, conn: socket.socket) -> None:
        """Speak just enough MQTT 3.1.1 for a QoS 1 publisher that is never acknowledged."""
        try:
            while (packet := _read_packet(conn)) is not None:
                kind, body = packet
                if kind == 1:  # CONNECT
                    conn.sendall(CONNACK)
                elif kind == 12:  # PINGREQ
                    conn.sendall(b"\xd0\x00")
                elif kind == 3:  # PUBLISH (QoS 1: the packet id follows the topic)
                    topic_len = int.from_bytes(body[:2], "big")
                    packet_id = body[2 + topic_len:4 + topic_len]
                    self.publishes += 1
                    if self._acking.is_set():
                        conn.sendall(b"\x40\x02" + packet_id)
                    else:
                        self._unacked.append((conn, packet_id))
        except OSError:
            pass

    def start_acking(self) -> None:
        """Acknowledge what was swallowed, and everything from now on (a broker catching up)."""
        self._acking.set()
        for conn, packet_id in self._unacked:
            conn.sendall(b"\x40\x02" + packet_id)

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            conn.close()
        self._thread.join(5)


@pytest.fixture
def make_publisher():
    made: list[MqttPublisher] = []

    def make(host: str, port: int, spool_write=None, clock=time.monotonic,
             **options) -> MqttPublisher:
        """`spool_write`: the spool's os.write, to make its disk fail (see test_spool.py);
        `clock`: the publisher's clock for rate-limited logs and the acknowledgement check."""
        settings = {"host": host, "port": port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3,
                    "keepalive_s": 1, **options}
        pub = MqttPublisher(MqttConfig(**settings), DEVICE, "9.9.9", clock=clock)
        if spool_write is not None:
            spool = pub._spool
            pub._spool = Spool(spool.directory, spool.limit_bytes,
                               fsync_interval_s=spool.fsync_interval_s, write=spool_write)
        made.append(pub)
        pub.start()
        return pub

    yield make
    for pub in made:
        pub.stop(timeout_s=1.0, final_status=None)


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]


def test_silent_server_is_reported_once_then_a_real_broker_on_that_port_works(
        tmp_path, make_publisher, subscriber_factory, caplog):
    require_programs("mosquitto")
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    server = FakeServer("silent")
    pub = make_publisher(server.host, server.port)
    assert pub.publish_detections("cam1", {"seq": 1})  # queued while there is no broker
    assert _wait(lambda: pub.stats()["last_error"] is not None, 10)
    error = pub.stats()["last_error"]
    assert f"{server.host}:{server.port}" in error and "no MQTT CONNACK within 1 s" in error
    assert HINT in error
    assert _wait(lambda: server.accepted >= 3, 15)  # it went on retrying...
    assert len(_warnings(caplog, "no MQTT CONNACK")) == 1  # ...and said so once, not per retry
    assert pub.stats()["connected"] is False

    server.close()
    broker = Mosquitto(tmp_path / "mosquitto", port=server.port)
    try:
        broker.start()
        sub = subscriber_factory(broker, (TOPICS.detections("cam1"),))
        assert pub.wait_connected(10)
        assert _wait(lambda: pub.stats()["queued"] == 0, 10)
        assert pub.publish_detections("cam1", {"seq": 2})
        assert sub.wait_for(lambda ms: [m.json()["seq"] for m in ms][-1:] == [2], 10)
    finally:
        broker.stop()


@pytest.mark.parametrize("behaviour, expected", [
    ("close", "closed the connection without sending an MQTT CONNACK"),
    ("http", "MQTT"),
])
def test_servers_that_close_or_answer_garbage_are_reported(make_publisher, caplog, behaviour, expected):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    server = FakeServer(behaviour)
    try:
        pub = make_publisher(server.host, server.port)
        assert _wait(lambda: pub.stats()["last_error"] is not None and server.accepted >= 3, 15)
        error = pub.stats()["last_error"]
        assert expected in error and HINT in error and f":{server.port}" in error
        assert 1 <= len(_warnings(caplog, HINT)) <= 2  # once per kind of answer, not per retry
        assert pub.stats()["connected"] is False
    finally:
        server.close()


def test_tls_port_spoken_to_in_clear_is_reported(mosquitto_factory, make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    broker = mosquitto_factory(tls=True)
    pub = make_publisher(broker.host, broker.port)  # no tls: settings
    assert _wait(lambda: pub.stats()["last_error"] is not None, 10)
    error = pub.stats()["last_error"]
    assert "CONNACK" in error and "TLS port without tls:" in error
    assert _wait(lambda: _warnings(caplog, "CONNACK"), 5)  # logged just after it is recorded


def test_queue_limit_bytes_bounds_the_outbox_by_payload(mosquitto_factory, subscriber_factory,
                                                       make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    broker = mosquitto_factory()
    broker.stop()
    limit, size = 1000, 300
    pub = make_publisher(broker.host, broker.port, queue_limit_bytes=limit, queue_limit=100,
                         keepalive_s=5)
    fits = limit // size
    results = [pub.publish(TOPICS.detections("cam1"), bytes([65 + i]) * size) for i in range(fits + 2)]
    assert results == [True] * fits + [False] * 2
    stats = pub.stats()
    assert stats["queued"] == fits and stats["queued_bytes"] == fits * size and stats["dropped"] == 2
    assert pub.publish(TOPICS.stats, b"s" * (limit - fits * size))  # what is left still fits
    assert pub.publish(TOPICS.stats, b"s" * (limit + 1)) is False  # larger than the whole limit
    assert pub.set_status("online")  # the status is never dropped
    assert any("queue full" in m and "bytes" in m for m in _warnings(caplog, "dropped"))

    broker.start()
    sub = subscriber_factory(broker, ("yoloedge/#",))
    assert _wait(lambda: pub.stats()["queued"] == 0, 10)
    assert pub.stats()["queued_bytes"] == 0  # counted exactly: back to zero once acknowledged
    payload = b"z" * (limit // 2)
    for _ in range(6):  # connected: acknowledged messages free their bytes again
        assert pub.publish(TOPICS.detections("cam1"), payload)
        assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    assert sub.wait_for(lambda ms: sum(m.payload == payload for m in ms) == 6, 10)


def test_spool_keeps_messages_across_a_stop_during_an_outage(tmp_path, mosquitto_factory,
                                                            subscriber_factory, make_publisher):
    broker = mosquitto_factory(persistence=True)
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id="spool-sub", clean_session=False)
    spool_dir = tmp_path / "spool"
    first = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5)
    assert first.wait_connected(10)
    for seq in range(5):
        assert first.publish_detections("cam1", {"seq": seq})
    assert sub.wait_for(lambda ms: len(ms) == 5, 10)
    broker.stop()
    assert _wait(lambda: not first.stats()["connected"], 10)
    for seq in range(5, 400):
        assert first.publish_detections("cam1", {"seq": seq})
    assert first.stats()["spooled"] == 395
    first.stop(timeout_s=0.5)
    assert list(spool_dir.glob("*.seg"))

    second = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5,
                            queue_limit=50)  # the backlog goes out in steps of 50
    assert second.publish_detections("cam1", {"seq": 400})  # after the backlog, never before
    broker.start()
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(401)), 20)
    seqs = [m.json()["seq"] for m in sub.messages(topic)]
    first_seen = list(dict.fromkeys(seqs))
    assert first_seen == list(range(401))
    assert _wait(lambda: second.stats()["spooled"] == 0, 10)
    assert _wait(lambda: not list(spool_dir.glob("*.seg")), 5)  # acknowledged: deleted


def test_a_disk_that_fills_mid_record_loses_no_message(tmp_path, mosquitto_factory,
                                                    subscriber_factory, make_publisher):
    """The spool's disk fills in the middle of a record during an outage: that message and the
    next ones are kept in memory (and the error reported), the spool takes messages again once
    there is room, and every message arrives when the broker is back."""
    from test_spool import _DiskFills

    broker = mosquitto_factory(persistence=True)
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id="full-disk-sub", clean_session=False)
    broker.stop()
    disk = _DiskFills(full_after=5)
    pub = make_publisher(broker.host, broker.port, spool_dir=str(tmp_path / "spool"),
                         keepalive_s=5, spool_write=disk)
    for seq in range(10):  # 5 spooled; 5 cut short, 6-9 ENOSPC: in memory
        assert pub.publish_detections("cam1", {"seq": seq})
    stats = pub.stats()
    assert "cannot write to the spool" in stats["last_error"] and "No space" in stats["last_error"]
    assert stats["spooled"] == 5 and stats["queued"] == 10 and stats["dropped"] == 0
    disk.free()
    for seq in range(10, 15):
        assert pub.publish_detections("cam1", {"seq": seq})
    assert pub.stats()["spooled"] == 10
    broker.start()
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(15)), 20), \
        (pub.stats(), [m.json() for m in sub.messages(topic)])
    assert _wait(lambda: pub.stats()["queued"] == 0 and pub.stats()["spooled"] == 0, 10)


def test_a_damaged_spool_record_does_not_make_the_spool_thread_spin(tmp_path, mosquitto_factory,
                                                                   make_publisher):
    """A record the spool counts but cannot read back (damaged on disk): each fruitless drain is
    followed by a wait, not by the next drain at once (events counted, not CPU time)."""
    broker = mosquitto_factory()
    broker.stop()
    spool_dir = tmp_path / "spool"
    pub = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5)
    for seq in range(3):
        assert pub.publish_detections("cam1", {"seq": seq})
    [segment] = spool_dir.glob("*.seg")
    with open(segment, "r+b") as f:  # a byte of the first record's body: its CRC fails
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    spool = pub._spool
    events: list[str] = []
    real_read, real_wait = spool.read, pub._lock.wait

    def read(*args):
        out = real_read(*args)
        events.append(f"read {len(out)}")
        return out

    def wait(timeout=None):
        if threading.current_thread().name == "mqtt-drain":
            events.append("wait")
        return real_wait(timeout)

    spool.read, pub._lock.wait = read, wait
    broker.start()
    assert pub.wait_connected(10)
    assert _wait(lambda: events.count("read 0") >= 3, 15), events[-20:]
    spins = sum(1 for a, b in zip(events, events[1:]) if a == "read 0" and b.startswith("read"))
    assert spins == 0, (spins, len(events), events[:20])


def test_stop_never_raises_and_frees_the_spool_when_its_fsync_fails(tmp_path, mosquitto_factory,
                                                                   make_publisher, monkeypatch):
    broker = mosquitto_factory()
    broker.stop()
    spool_dir = tmp_path / "spool"
    pub = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5)
    assert pub.publish_detections("cam1", {"seq": 1})

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    pub.stop(timeout_s=0.5)  # must not raise: the daemon stops or replaces the client next
    monkeypatch.undo()
    assert "closing the spool" in pub.stats()["last_error"]
    again = Spool(str(spool_dir), limit_bytes=1 << 20)  # the directory lock was released
    assert again.open() == 1
    again.close()


# ---------------------------------------------------------------- the real daemon

@pytest.mark.shared
def test_daemon_restart_during_an_outage_loses_no_detection(tmp_path, models, media, mosquitto_factory,
                                                            subscriber_factory):
    """Broker down; the daemon publishes a whole clip (spooled); SIGTERM; started again (without
    the camera, so nothing new is made); broker up: every frame arrives, in order. Guarantee:
    at-least-once across a restart (acknowledgements are not persisted), no loss, first copies
    in order."""
    broker = mosquitto_factory(persistence=True)
    prefix, device, camera = "ys", "edge9", "door"
    topic = f"{prefix}/{device}/cameras/{camera}/detections"
    sub = subscriber_factory(broker, (topic,), client_id="spool-daemon-sub", clean_session=False)
    broker.stop()
    spool_dir = tmp_path / "spool"
    sock_path = str(tmp_path / "run" / "control.sock")
    config = {
        "device_id": device,
        "model": {"path": str(models / "yolov8n_coco_int8.onnx")},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": camera, "url": str(media / "indoor_people_480p_mpeg4.avi"),
                     "realtime": False}],
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": prefix,
                 "reconnect_min_s": 0.2, "reconnect_max_s": 1, "spool_dir": str(spool_dir)},
        "control": {"socket": sock_path},
        "shutdown_timeout_s": 2,
    }
    path = write_config(tmp_path / "yoloedge.yaml", config)
    notify = NotifySocket(tmp_path / "notify.sock")
    daemons: list[Daemon] = []
    try:
        daemons.append(Daemon(path, notify))
        notify.wait_for("READY", "1", timeout=60)
        frames = 84  # the clip's frame count (as in test_daemon.py)

        def clip_published() -> bool:
            [cam] = status(sock_path)["cameras"]
            return cam["state"] == "ended" and cam["published"] == cam["frames_in"] == frames

        assert _wait(clip_published, 90), daemons[0].log[-3000:]
        assert status(sock_path)["mqtt"]["spooled"] > frames  # detections and camera states
        assert daemons[0].stop() == 0, daemons[0].log[-3000:]
        assert list(spool_dir.glob("*.seg"))

        config["cameras"] = []
        write_config(path, config)
        daemons.append(Daemon(path, notify))
        notify.wait_for("READY", "1", timeout=60, count=2)
        broker.start()
        assert sub.wait_for(lambda ms: len({m.json()["frame"] for m in ms}) >= frames, 60), \
            (status(sock_path)["mqtt"], len(sub.messages()), daemons[1].log[-3000:])
        received = [m.json()["frame"] for m in sub.messages(topic)]
        assert list(dict.fromkeys(received)) == list(range(frames))
        assert _wait(lambda: status(sock_path)["mqtt"]["spooled"] == 0, 10)
        assert daemons[1].stop() == 0, daemons[1].log[-3000:]
        recovered = re.search(r"(\d+) message\(s\) from the previous run", daemons[1].log)
        assert recovered and int(recovered.group(1)) > frames, daemons[1].log[-3000:]
        print(f"\nspool across a restart: {len(received)} detection messages received for {frames} "
              f"frames ({len(received) - frames} duplicates); {recovered.group(1)} recovered")
    finally:
        for d in daemons:
            d.kill()
        notify.close()


def test_spool_outage_within_one_run_keeps_order(mosquitto_factory, subscriber_factory,
                                                  make_publisher, tmp_path):
    """Broker stopped (in-flight messages unacknowledged) and back while publishing: the spool is
    rewound to the oldest unacknowledged record; nothing lost; the backlog's first copies in
    order, and the messages published after the reconnect in order (they may overtake it)."""
    broker = mosquitto_factory(persistence=True)
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id="spool-run-sub", clean_session=False)
    pub = make_publisher(broker.host, broker.port, spool_dir=str(tmp_path / "spool"), keepalive_s=5)
    assert pub.wait_connected(10)
    seq = 0

    def publish_for(seconds: float) -> None:
        nonlocal seq
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert pub.publish_detections("cam1", {"seq": seq})
            seq += 1
            time.sleep(0.01)

    publish_for(1.0)
    broker.stop()
    publish_for(1.5)
    broker.start()
    assert pub.wait_connected(10)
    live = seq  # from here on published while connected: not held behind the backlog
    publish_for(1.0)
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(seq)), 20)
    received = [m.json()["seq"] for m in sub.messages(topic)]
    first_seen = list(dict.fromkeys(received))
    assert [s for s in first_seen if s < live] == list(range(live))
    assert [s for s in first_seen if s >= live] == list(range(live, seq))
    assert _wait(lambda: pub.stats()["spooled"] == 0 and pub.stats()["queued"] == 0, 10)
    assert pub.stats()["dropped"] == 0
    print(f"\nspool outage: {seq} published, {len(received)} received "
          f"({len(received) - seq} duplicates)")


# ---------------------------------------------------------------- configuration

def _load_mqtt(tmp_path, mqtt_lines: str):
    from yoloedge.config.loader import load_config
    model = tmp_path / "m.onnx"
    model.write_bytes(b"never opened by the loader")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: e1\nmodel:\n  path: {model}\nmqtt:\n{mqtt_lines}")
    return load_config(str(path), {}), path


def test_queue_bytes_and_spool_keys_load_and_default(tmp_path):
    config, _ = _load_mqtt(tmp_path, "  host: broker\n")
    assert (config.mqtt.queue_limit_bytes, config.mqtt.spool_dir, config.mqtt.spool_limit_bytes) == \
        (64 * 1024 * 1024, None, 256 * 1024 * 1024)  # the documented defaults (docs/configuration.md)
    config, path = _load_mqtt(tmp_path, "  queue_limit_bytes: 1048576\n  spool_dir: spool/mqtt\n"
                                        "  spool_limit_bytes: 2097152\n")
    assert config.mqtt.spool_dir == str(tmp_path / "spool" / "mqtt")  # relative to the file; creatable
    assert (config.mqtt.queue_limit_bytes, config.mqtt.spool_limit_bytes) == (1048576, 2097152)
    assert not (tmp_path / "spool").exists()  # checking does not create it


@pytest.mark.parametrize("lines, key, words", [
    ("  spool_dir: {file}\n", "mqtt.spool_dir", "not a directory"),
    ("  spool_dir: {file}/below\n", "mqtt.spool_dir", "cannot be created"),
    ("  queue_limit_bytes: 100\n", "mqtt.queue_limit_bytes", "65536"),
    ("  spool_limit_bytes: -1\n", "mqtt.spool_limit_bytes", "1048576"),
    ("  queue_limit_bytes: 64MiB\n", "mqtt.queue_limit_bytes", "whole number"),
])
def test_bad_queue_and_spool_settings_name_line_and_key(tmp_path, lines, key, words):
    from yoloedge.config.errors import ConfigError
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ConfigError) as info:
        _load_mqtt(tmp_path, lines.format(file=a_file))
    [issue] = info.value.issues
    assert issue.key_path == key and issue.line == 5 and words in issue.message + (issue.hint or "")


def test_a_spool_dir_that_is_not_the_spools_own_is_left_alone_and_publishing_goes_on(
        tmp_path, mosquitto, subscriber_factory, make_publisher):
    """A file that turned up in spool_dir after the config was checked: the publisher does not use
    the directory (nothing in it touched, no lock taken), says why, and publishes from memory."""
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(mosquitto, (topic,), client_id="foreign-sub")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    notes = spool_dir / "notes.txt"
    notes.write_text("the operator's")
    segment = spool_dir / f"{0:020d}.seg"
    segment.write_bytes(b"\xff" * 64)
    pub = make_publisher(mosquitto.host, mosquitto.port, spool_dir=str(spool_dir), keepalive_s=5)
    error = pub.stats()["last_error"]
    assert f"cannot open the spool {spool_dir}" in error and "('notes.txt')" in error, error
    assert "messages are kept in memory only" in error and pub.stats()["spooled"] is None
    assert pub.wait_connected(10) and pub.publish_detections("cam1", {"seq": 1})
    assert sub.wait_for(lambda ms: [m.json()["seq"] for m in ms] == [1], 10)
    assert sorted(p.name for p in spool_dir.iterdir()) == [segment.name, notes.name]
    assert segment.read_bytes() == b"\xff" * 64 and notes.read_text() == "the operator's"


def test_tls_handshake_that_never_completes_is_reported(make_publisher, caplog):
    """tls: set, and the server accepts but never speaks TLS: paho's handshake timeout (5 s)."""
    from yoloedge.config import TlsConfig
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    server = FakeServer("silent")
    try:
        pub = make_publisher(server.host, server.port, tls=TlsConfig())
        assert _wait(lambda: pub.stats()["last_error"] is not None, 15)
        error = pub.stats()["last_error"]
        assert f":{server.port}" in error and "timed out" in error, error
        assert _wait(lambda: server.accepted >= 2, 20)  # and retried
        assert len(_warnings(caplog, "timed out")) == 1
    finally:
        server.close()


class _Clock:
    """The publisher's clock, moved by the test (rate limits and ages without waiting)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _mutate_spool(variant: str, spool_dir, monkeypatch) -> None:
    """Change the spool's files under the running publisher, as an operator or a failing disk
    would."""
    import shutil

    import yoloedge.publish.spool as spool_module

    first = sorted(spool_dir.glob("*.seg"))[0]
    if variant == "directory deleted":
        shutil.rmtree(spool_dir)
    elif variant == "segment truncated":
        os.truncate(first, first.stat().st_size // 2)
    elif variant == "segment replaced by a directory":
        first.unlink()
        first.mkdir()
    elif variant == "read error":
        real = spool_module.read_segment

        def read_segment(path, start=0, **bounds):
            if os.path.basename(path) == first.name:
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            return real(path, start, **bounds)

        monkeypatch.setattr(spool_module, "read_segment", read_segment)


@pytest.mark.parametrize("variant", ["directory deleted", "segment truncated",
                                     "segment replaced by a directory", "read error"])
def test_spool_files_changed_under_it_drop_what_is_lost_and_go_on(
        tmp_path, mosquitto_factory, subscriber_factory, make_publisher, monkeypatch, caplog,
        variant):
    """What can no longer be read back is counted as dropped (and said, once), everything else
    arrives in order, the spool empties, and no traceback repeats."""
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    broker = mosquitto_factory(persistence=True)
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id=f"mutate-sub-{variant[:4]}",
                             clean_session=False)
    broker.stop()
    spool_dir = tmp_path / "spool"
    # about 65 bytes a record, segments of 1000 bytes: 30 records make two segments
    pub = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5,
                         spool_limit_bytes=4000)
    for seq in range(30):
        assert pub.publish_detections("cam1", {"seq": seq})
    assert len(list(spool_dir.glob("*.seg"))) >= 2
    _mutate_spool(variant, spool_dir, monkeypatch)
    for seq in range(30, 40):
        assert pub.publish_detections("cam1", {"seq": seq})
    broker.start()
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(30, 40)), 20), \
        pub.stats()
    assert _wait(lambda: pub.stats()["queued"] == 0 and pub.stats()["spooled"] == 0, 10), \
        pub.stats()
    first_seen = list(dict.fromkeys(m.json()["seq"] for m in sub.messages(topic)))
    assert first_seen == sorted(first_seen)
    missing = set(range(40)) - set(first_seen)
    if variant == "directory deleted":
        assert missing == set(range(30))
    else:  # one of two segments: some lost, none written after the change
        assert 0 < len(missing) < 30 and max(missing) < 30, missing
    stats = pub.stats()
    assert stats["dropped"] == len(missing) and stats["connected"]
    said = [m for m in _warnings(caplog, "could not be read back")]
    assert said and sum(int(re.search(r": (\d+) message", m).group(1)) for m in said) \
        == len(missing), said
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
    assert pub.publish_detections("cam1", {"seq": 40})  # and the spool goes on
    assert sub.wait_for(lambda ms: any(m.json()["seq"] == 40 for m in ms), 10)
    if variant == "directory deleted":
        assert spool_dir.is_dir() and (spool_dir.stat().st_mode & 0o777) == 0o700
    if variant == "segment replaced by a directory":
        assert any(p.is_dir() for p in spool_dir.glob("*.seg"))  # not ours to delete


def test_flapping_broker_warns_once_then_a_summary_per_minute(make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    clock = _Clock()
    server = FakeServer("flap")
    try:
        pub = make_publisher(server.host, server.port, clock=clock)
        assert _wait(lambda: pub.stats()["reconnects"] >= 5, 20), pub.stats()
        assert len(_warnings(caplog, "; reconnecting")) == 1
        assert not _warnings(caplog, "reconnected")
        connected_info = [r for r in caplog.records
                          if r.levelno == logging.INFO and "connected to" in r.getMessage()]
        # the first connect and the one after the warned loss; the flapping ones at debug level
        assert len(connected_info) == 2, [r.getMessage() for r in connected_info]
        before = pub.stats()["reconnects"]
        clock.now += 61
        assert _wait(lambda: _warnings(caplog, "reconnected"), 10)
        [summary] = _warnings(caplog, "reconnected")
        count = int(re.search(r"reconnected (\d+) time", summary).group(1))
        assert count >= before - 1 and "in the last 61 s" in summary and "last reason" in summary
        flaps = pub.stats()["reconnects"]
        assert _wait(lambda: pub.stats()["reconnects"] >= flaps + 5, 20)
        assert len(_warnings(caplog, "reconnected")) == 1  # the clock stands: no second summary
        assert len(_warnings(caplog, "; reconnecting")) == 1
    finally:
        server.close()


def test_broker_that_never_acknowledges_is_reported_and_cleared(make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    clock = _Clock()
    server = FakeServer("noack")
    try:
        pub = make_publisher(server.host, server.port, clock=clock)  # keepalive 1 s: 30 s limit
        assert pub.wait_connected(10)
        for seq in range(3):
            assert pub.publish_detections("cam1", {"seq": seq})
        assert _wait(lambda: server.publishes == 3, 10)
        clock.now += 29
        stats = pub.stats()
        assert not stats["ack_stalled"] and stats["last_error"] is None and stats["connected"]
        clock.now += 2
        stats = pub.stats()
        assert stats["ack_stalled"] and stats["connected"]
        assert "has not acknowledged 3 message(s) for 31 s" in stats["last_error"]
        pub.stats()
        assert len(_warnings(caplog, "has not acknowledged")) == 1
        server.start_acking()
        assert _wait(lambda: pub.stats()["delivered"] == 3, 10)
        stats = pub.stats()
        assert not stats["ack_stalled"] and stats["queued"] == 0
        assert "has not acknowledged" in stats["last_error"] and not stats["error_active"], stats
    finally:
        server.close()


def test_tls_to_a_plain_port_asks_whether_it_is_a_tls_port(mosquitto_factory, make_publisher):
    from yoloedge.config import TlsConfig
    broker = mosquitto_factory()  # no TLS on this port
    pub = make_publisher(broker.host, broker.port, tls=TlsConfig())
    assert _wait(lambda: pub.stats()["last_error"] is not None, 15)
    error = pub.stats()["last_error"]
    assert f"is port {broker.port} a TLS port?" in error, error


def test_spool_directory_replaced_by_a_file_falls_back_to_memory_then_spools_again(
        tmp_path, mosquitto_factory, subscriber_factory, make_publisher, caplog):
    import shutil
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    broker = mosquitto_factory(persistence=True)
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id="file-sub", clean_session=False)
    broker.stop()
    spool_dir = tmp_path / "spool"
    pub = make_publisher(broker.host, broker.port, spool_dir=str(spool_dir), keepalive_s=5,
                         spool_limit_bytes=4000)
    for seq in range(30):
        assert pub.publish_detections("cam1", {"seq": seq})
    shutil.rmtree(spool_dir)
    spool_dir.write_bytes(b"not a directory")
    for seq in range(30, 40):  # the spool cannot be written: memory, and said so
        assert pub.publish_detections("cam1", {"seq": seq})
    assert "cannot write to the spool" in pub.stats()["last_error"]
    assert _wait(lambda: pub.stats()["dropped"] == 30, 10), pub.stats()  # the deleted ones
    spool_dir.unlink()
    assert pub.publish_detections("cam1", {"seq": 40})  # the spool is tried again
    assert spool_dir.is_dir() and pub.stats()["spooled"] == 1
    broker.start()
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(30, 41)), 20), \
        pub.stats()
    assert _wait(lambda: pub.stats()["queued"] == 0 and pub.stats()["spooled"] == 0, 10)
    assert pub.stats()["dropped"] == 30
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


def test_two_clients_with_one_client_id_are_reported_as_unstable(mosquitto, make_publisher, caplog):
    """Two daemons with the same device_id: the broker hands the client id to whichever connected
    last and drops the other, again and again. It used to show as "problems: none"."""
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    clock = _Clock()  # stands still: every lost connection is short-lived until the test moves it
    first = make_publisher(mosquitto.host, mosquitto.port, clock=clock)
    assert first.wait_connected(10)
    twin = make_publisher(mosquitto.host, mosquitto.port, clock=clock)  # same device id: same client id
    assert _wait(lambda: first.stats()["unstable"], 30), first.stats()
    assert f"client id {first.client_id!r}" in first.stats()["last_error"]
    assert len(_warnings(caplog, "within 10 s of accepting it")) <= 2  # once per publisher
    twin.stop(timeout_s=1.0, final_status=None)
    assert first.wait_connected(10)
    assert first.stats()["unstable"], "a connection that has not lasted yet proves nothing"
    clock.now += 61  # the connection lasted: the report ends
    stats = first.stats()
    assert not stats["unstable"] and not stats["error_active"] and stats["connected"], stats
    assert "closed the connection 3 times" in stats["last_error"], "shown as past, not forgotten"


def _said(caplog, text: str) -> int:
    """How many records (any level) mention `text`."""
    return sum(text in r.getMessage() for r in caplog.records)


def test_two_errors_at_once_are_each_warned_once_then_summed(tmp_path, make_publisher, caplog):
    """The broker away and the spool's disk full at once, their reports alternating: each kind
    is one warning, then one per ERROR_REPEAT_LOG_S with the count, never a warning per retry."""
    from test_spool import _DiskFills

    from yoloedge.publish.diagnostics import ERROR_REPEAT_LOG_S
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    clock = _Clock()
    server = FakeServer("close")  # every attempt: closed without a CONNACK
    lost, full = "closed the connection without sending an MQTT CONNACK", "cannot write to the spool"
    try:
        pub = make_publisher(server.host, server.port, spool_dir=str(tmp_path / "spool"),
                             spool_write=_DiskFills(full_after=0), clock=clock)
        for seq in range(6):
            before = _said(caplog, lost)
            assert pub.publish_detections("cam1", {"seq": seq})  # the spool fails: in memory
            assert _wait(lambda before=before: _said(caplog, lost) > before, 10)
        assert _said(caplog, full) >= 6
        assert len(_warnings(caplog, lost)) == 1 and len(_warnings(caplog, full)) == 1
        clock.now += ERROR_REPEAT_LOG_S + 1  # both persist: each warned again, with its count
        assert pub.publish_detections("cam1", {"seq": 6})
        assert _wait(lambda: len(_warnings(caplog, lost)) == 2, 10)
        repeats = [m for m in _warnings(caplog, lost) + _warnings(caplog, full) if "more time" in m]
        assert len(repeats) == 2 and len(_warnings(caplog, full)) == 2, repeats
        assert all(re.search(r"\((\d+) more time\(s\) in the last 301 s\)", m) for m in repeats)
        assert int(re.search(r"\((\d+) more", _warnings(caplog, full)[1]).group(1)) == 5
    finally:
        server.close()


def test_after_a_recovery_the_old_error_is_shown_as_past_with_its_time(
        tmp_path, mosquitto_factory, make_publisher):
    from test_spool import _DiskFills
    ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
    broker = mosquitto_factory()
    broker.stop()
    disk = _DiskFills(full_after=0)
    pub = make_publisher(broker.host, broker.port, spool_dir=str(tmp_path / "spool"),
                         spool_write=disk, keepalive_s=5)
    assert _wait(lambda: "cannot connect" in (pub.stats()["last_error"] or ""), 10), pub.stats()
    stats = pub.stats()
    assert stats["error_active"] and ts.match(stats["last_error_at"]) and not stats["connected"]
    assert pub.publish_detections("cam1", {"seq": 1})
    stats = pub.stats()
    assert "cannot write to the spool" in stats["last_error"] and stats["error_active"]
    disk.free()
    assert pub.publish_detections("cam1", {"seq": 2})  # the spool is written again: that is over
    stats = pub.stats()
    assert "cannot connect" in stats["last_error"] and stats["error_active"], \
        "the error that still holds, not the latest one that is over"
    broker.start()
    assert pub.wait_connected(10)
    stats = pub.stats()
    assert stats["connected"] and not stats["error_active"], stats
    # both are over: the most recent of them is shown, as past
    assert re.search("cannot connect|cannot write to the spool", stats["last_error"]), stats
    assert ts.match(stats["last_error_at"])
