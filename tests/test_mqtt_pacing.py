"""Reconnecting without a flood, against a real mosquitto: the backlog of an outage goes out in
order at `mqtt.drain_rate` (counted on the publisher's clock, which the test moves: no wall-clock
rates), new messages and the newest retained state go out at once, stale retained copies not at
all; and reconnects wait the shared jittered back-off."""

from __future__ import annotations

import logging
import random
import re
import socket
import threading
import time

import pytest

from broker import HOST
from yoloedge.config import MqttConfig
from yoloedge.publish import MqttPublisher, Topics

DEVICE = "edge-42"
TOPICS = Topics("yoloedge", DEVICE)
CONNACK = b"\x20\x02\x00\x00"


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class _Clock:
    """The publisher's clock (the drain's pace, the backoff's notion of a lasting connection),
    moved by the test."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_publisher():
    made: list[MqttPublisher] = []

    def make(host: str, port: int, clock=time.monotonic, rng=None, **options) -> MqttPublisher:
        settings = {"host": host, "port": port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3,
                    "keepalive_s": 5, **options}
        pub = MqttPublisher(MqttConfig(**settings), DEVICE, "9.9.9", clock=clock, rng=rng)
        made.append(pub)
        pub.start()
        return pub

    yield make
    for pub in made:
        pub.stop(timeout_s=1.0, final_status=None)


def _seqs(sub) -> list[int]:
    return [m.json()["seq"] for m in sub.messages(TOPICS.detections("cam1"))]


@pytest.mark.parametrize("spooled", [False, True], ids=["memory", "spool"])
def test_an_outage_backlog_drains_in_order_at_the_rate_and_state_goes_first(
        tmp_path, mosquitto_factory, subscriber_factory, make_publisher, spooled):
    broker = mosquitto_factory(persistence=True)
    sub = subscriber_factory(broker, ("yoloedge/#",), client_id=f"pace-sub-{spooled}",
                             clean_session=False)
    clock = _Clock()
    options = {"spool_dir": str(tmp_path / "spool")} if spooled else {}
    pub = make_publisher(broker.host, broker.port, clock=clock, drain_rate=10, **options)
    assert pub.wait_connected(10)
    assert pub.set_status("online")
    assert sub.wait_for(lambda ms: any(m.topic == TOPICS.status for m in ms), 10)
    broker.stop()
    assert _wait(lambda: not pub.stats()["connected"], 10)
    state_topic = TOPICS.camera_state("cam1")
    assert pub.set_status("online")  # a copy of the status waits too
    for seq in range(35):  # the outage: 35 detections and three camera states
        assert pub.publish_detections("cam1", {"seq": seq})
        if seq in (5, 15, 25):
            assert pub.publish_camera_state("cam1", {"camera": "cam1", "state": f"s{seq}"})
    assert pub.stats()["backlog"] >= 35 + 3
    sub.clear()

    broker.start()
    assert pub.wait_connected(10)
    assert _wait(lambda: pub.stats()["drained"] == 10, 10), pub.stats()
    assert pub.publish_detections("cam1", {"seq": 100})  # published after the reconnect
    assert sub.wait_for(lambda ms: 100 in [m.json().get("seq") for m in ms if
                                           m.topic == TOPICS.detections("cam1")], 10)
    # the clock stands still: one burst (one second's worth) of the backlog, the new one, and
    # paho sends in the order it was handed them, so nothing later can be on its way before 100
    assert _seqs(sub) == [*range(10), 100], _seqs(sub)
    states = sub.payloads(state_topic)
    assert [s["state"] for s in states] == ["s25"], "the newest state once, at once"
    statuses = [m.json()["state"] for m in sub.messages(TOPICS.status)]
    assert "offline" in statuses, statuses  # the broker published the Last Will meanwhile
    after_will = statuses[len(statuses) - statuses[::-1].index("offline"):]
    assert after_will == ["online"], statuses  # the status once, not once per queued copy
    stats = pub.stats()
    # the spool skips a stale copy when the drain reaches it: one (state s15) still counts
    assert stats["drained"] == 10 and stats["backlog"] == 25 + spooled, stats
    assert stats["drain_rate"] == 10

    clock.now += 1.0  # one second: ten more
    assert sub.wait_for(lambda ms: len(_seqs(sub)) == 21, 10), _seqs(sub)
    clock.now += 3600.0  # an hour: still one burst, no more
    assert sub.wait_for(lambda ms: len(_seqs(sub)) == 31, 10), _seqs(sub)
    assert _wait(lambda: pub.stats()["backlog"] == 5, 10), pub.stats()  # s15 skipped by now
    assert pub.stats()["drained"] == 30
    clock.now += 1.0
    assert sub.wait_for(lambda ms: len(_seqs(sub)) == 36, 10), _seqs(sub)
    assert _seqs(sub) == [*range(10), 100, *range(10, 35)]
    assert _wait(lambda: pub.stats()["queued"] == 0 and pub.stats()["backlog"] == 0, 10)
    assert [s["state"] for s in sub.payloads(state_topic)] == ["s25"]
    stats = pub.stats()
    # superseded: the two older camera states, and the status copies that waited (the current
    # status is sent instead): the one queued in the outage, and the one before it if its
    # acknowledgement was lost with the broker
    assert stats["dropped"] == 0 and stats["drained"] == 35 and 3 <= stats["superseded"] <= 4


def test_a_retained_state_replaced_after_the_reconnect_is_never_sent_stale(
        tmp_path, mosquitto_factory, subscriber_factory, make_publisher):
    """A camera state queued during the outage, then a newer one published right after the
    reconnect: the old one must not arrive after the new one (it would stick on the broker)."""
    broker = mosquitto_factory()
    clock = _Clock()
    pub = make_publisher(broker.host, broker.port, clock=clock, drain_rate=1,
                         spool_dir=str(tmp_path / "spool"))
    assert pub.wait_connected(10)
    broker.stop()
    assert _wait(lambda: not pub.stats()["connected"], 10)
    for seq in range(3):
        assert pub.publish_detections("cam1", {"seq": seq})
    assert pub.publish_camera_state("cam1", {"camera": "cam1", "state": "stalled"})
    broker.start()
    assert pub.wait_connected(10)
    assert pub.publish_camera_state("cam1", {"camera": "cam1", "state": "streaming"})
    for drained in range(1, 4):  # one a second: the clock moves a second at a time
        clock.now += 1
        assert _wait(lambda drained=drained: pub.stats()["drained"] == drained, 10), pub.stats()
    assert _wait(lambda: pub.stats()["backlog"] == 0 and pub.stats()["queued"] == 0, 10), \
        pub.stats()
    assert pub.stats()["superseded"] == 0  # the stale copy went ahead at the reconnect
    late = subscriber_factory(broker, (TOPICS.camera_state("cam1"),))
    assert late.wait_for(lambda ms: len(ms) == 1, 10)
    assert late.payloads(TOPICS.camera_state("cam1"))[0]["state"] == "streaming"


def test_an_unpaced_drain_sends_the_whole_backlog_at_once(mosquitto_factory, subscriber_factory,
                                                         make_publisher):
    broker = mosquitto_factory(persistence=True)
    sub = subscriber_factory(broker, (TOPICS.detections("cam1"),), client_id="unpaced-sub",
                             clean_session=False)
    clock = _Clock()  # stands still: only an unpaced drain can send more than one burst
    pub = make_publisher(broker.host, broker.port, clock=clock, drain_rate=0)
    assert pub.wait_connected(10)
    broker.stop()
    assert _wait(lambda: not pub.stats()["connected"], 10)
    for seq in range(300):
        assert pub.publish_detections("cam1", {"seq": seq})
    broker.start()
    assert sub.wait_for(lambda ms: len(ms) >= 300, 20), len(sub.messages())
    assert list(dict.fromkeys(_seqs(sub))) == list(range(300))


class _HoldingBroker:
    """Answers CONNECT with CONNACK and then holds the connection until `drop()`; or, with
    `refuse=True`, accepts and closes at once. Counts the attempts."""

    def __init__(self, refuse: bool):
        self.refuse = refuse
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.host, self.port = HOST, self.sock.getsockname()[1]
        self.attempts = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.attempts += 1
            if self.refuse:
                conn.close()
                continue
            # held before the CONNACK goes out: once the client is connected, drop() reaches it
            # (appended after, a drop() right after the client saw its CONNACK found nothing to
            # close, and the client only noticed at its keepalive)
            with self._lock:
                self._conns.append(conn)
            try:
                conn.recv(4096)
                conn.sendall(CONNACK)
            except OSError:
                continue

    def drop(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.drop()
        self._thread.join(5)


def _delays(caplog, server: "_HoldingBroker") -> list[float]:
    """The reconnect waits the publisher chose for `server`, as its debug lines say."""
    pattern = re.compile(rf"next connection attempt to {re.escape(f'{server.host}:{server.port}')} "
                         rf"in ([\d.]+) s")
    return [float(m.group(1)) for r in caplog.records if (m := pattern.search(r.getMessage()))]


def test_reconnects_back_off_exponentially_with_jitter_and_start_over_after_a_lasting_one(
        make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    clock = _Clock()
    server = _HoldingBroker(refuse=True)
    try:
        pub = make_publisher(server.host, server.port, clock=clock, rng=random.Random(3),
                             reconnect_min_s=0.05, reconnect_max_s=0.4)
        assert _wait(lambda: len(_delays(caplog, server)) >= 8, 30), _delays(caplog, server)
        delays = _delays(caplog, server)[:8]
        bases = [min(0.4, 0.05 * 2 ** i) for i in range(8)]  # the documented doubling and cap
        assert all(0.8 * b - 0.005 <= d <= 1.2 * b + 0.005 for d, b in zip(delays, bases)), delays
        assert any(abs(d - b) > 0.01 for d, b in zip(delays, bases)), "jittered, not exact"
        assert server.attempts >= 8
        assert pub.stats()["reconnect_delay_s"] is not None and not pub.stats()["connected"]
        pub.stop(timeout_s=1.0, final_status=None)
    finally:
        server.close()

    server = _HoldingBroker(refuse=False)
    try:
        pub = make_publisher(server.host, server.port, clock=clock, rng=random.Random(4),
                             reconnect_min_s=0.05, reconnect_max_s=0.4)
        assert pub.wait_connected(10)
        assert pub.stats()["reconnect_delay_s"] is None
        server.drop()  # a connection that lasted no time on the clock: the delays grow
        assert _wait(lambda: len(_delays(caplog, server)) == 1 and pub.stats()["connected"], 10)
        clock.now += 11  # this connection lasts past SHORT_LIVED_S
        server.drop()
        assert _wait(lambda: len(_delays(caplog, server)) == 2 and pub.stats()["connected"], 10)
        first, after_lasting = _delays(caplog, server)
        assert 0.04 <= first <= 0.06 and 0.04 <= after_lasting <= 0.06, _delays(caplog, server)
        server.drop()  # short-lived again: doubled
        assert _wait(lambda: len(_delays(caplog, server)) == 3, 10)
        assert 0.08 <= _delays(caplog, server)[2] <= 0.12, _delays(caplog, server)
    finally:
        server.close()


def test_two_publishers_with_other_seeds_do_not_reconnect_in_step(make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    server = _HoldingBroker(refuse=True)
    try:
        make_publisher(server.host, server.port, rng=random.Random(1), reconnect_min_s=0.05,
                       reconnect_max_s=0.05)
        assert _wait(lambda: len(_delays(caplog, server)) >= 6, 20)
        spread = _delays(caplog, server)
        assert max(spread) - min(spread) > 0.005 and all(0.039 <= d <= 0.061 for d in spread)
    finally:
        server.close()


def test_while_a_memory_backlog_drains_a_new_message_replaces_the_oldest_waiting(make_publisher):
    """The queue is full of an outage's backlog, draining one a second: a new message must not be
    refused (it would wait behind the paced backlog, or be lost): the oldest waiting one makes
    room. The broker here never acknowledges, so what was handed over stays counted."""
    clock = _Clock()
    server = _HoldingBroker(refuse=True)
    try:
        pub = make_publisher(server.host, server.port, clock=clock, drain_rate=1, queue_limit=10)
        for seq in range(10):
            assert pub.publish_detections("cam1", {"seq": seq})
        assert not pub.publish_detections("cam1", {"seq": 10}), "disconnected: the newest is dropped"
        assert pub.stats()["dropped"] == 1
        server.refuse = False  # it takes connections now, and acknowledges nothing
        assert pub.wait_connected(10)
        assert _wait(lambda: pub.stats()["drained"] == 1, 10), pub.stats()
        assert pub.publish_detections("cam1", {"seq": 11}), "connected: the new one goes out"
        stats = pub.stats()
        assert stats["dropped"] == 2 and stats["backlog"] == 8 and stats["queued"] == 10, stats
    finally:
        server.close()
