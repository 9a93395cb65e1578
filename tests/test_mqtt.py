"""MqttPublisher against a real mosquitto (fixtures from conftest_mqtt.py).

Every test starts its own broker on a free port; reconnect back-off is shortened to 0.1-0.5 s
so outages are short. The outage test prints its measurements (run with -s to see them).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from yoloedge.config import MqttConfig, TlsConfig
from yoloedge.publish import MqttPublisher, Topics, encode_payload, utc_timestamp
from yoloedge.publish.topics import camera_state_topic, detections_topic, stats_topic, status_topic

REPO = Path(__file__).resolve().parent.parent
DEVICE = "edge-01"
VERSION = "1.2.3"
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
TOPICS = Topics("yoloedge", DEVICE)


@pytest.fixture
def make_publisher():
    """Build (and at the end stop) publishers for a broker, with fast reconnects."""
    made: list[MqttPublisher] = []

    def make(broker, start: bool = True, device_id: str = DEVICE, **options) -> MqttPublisher:
        settings = {"host": broker.host, "port": broker.port, "reconnect_min_s": 0.1,
                    "reconnect_max_s": 0.5, "keepalive_s": 5, **options}
        if broker.tls and "tls" not in settings:
            settings["tls"] = TlsConfig(ca_certs=str(broker.ca_cert))
        pub = MqttPublisher(MqttConfig(**settings), device_id, VERSION)
        made.append(pub)
        if start:
            pub.start()
        return pub

    yield make
    for pub in made:
        pub.stop(timeout_s=1.0, final_status=None)


def _detections(frame: int) -> dict:
    return {"v": 1, "camera": "cam1", "frame": frame, "ts": utc_timestamp(), "width": 1920,
            "height": 1080, "model": "yolov8n", "latency_ms": 12.5,
            "detections": [{"label": "person", "class_id": 0, "score": 0.91,
                            "box": [10.0, 20.5, 110.0, 220.0]}]}


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------- no broker needed

def test_topics_layout_and_validation():
    assert status_topic("yoloedge", "d1") == "yoloedge/d1/status"
    assert detections_topic("site/yoloedge", "d1", "cam1") == "site/yoloedge/d1/cameras/cam1/detections"
    assert camera_state_topic("yoloedge", "d1", "cam1") == "yoloedge/d1/cameras/cam1/state"
    assert stats_topic("yoloedge", "d1") == "yoloedge/d1/stats"
    for bad_camera in ("", "a/b", "cam+", "cam#"):
        with pytest.raises(ValueError):
            TOPICS.detections(bad_camera)
    for bad_prefix in ("", "/x", "x/", "x/+"):
        with pytest.raises(ValueError):
            Topics(bad_prefix, "d1")


def test_payload_encoding_and_timestamp():
    assert encode_payload({"a": 1, "b": [1, 2], "s": "é"}) == '{"a":1,"b":[1,2],"s":"é"}'.encode()
    assert encode_payload(None) == b"" and encode_payload("x") == b"x" and encode_payload(b"y") == b"y"
    with pytest.raises(ValueError):
        encode_payload({"score": float("nan")})
    assert TS_RE.match(utc_timestamp())
    assert utc_timestamp(0.5) == "1970-01-01T00:00:00.500Z"


def test_config_checks_and_no_network_in_init():
    with pytest.raises(ValueError):
        MqttPublisher(MqttConfig(password="x"), DEVICE, VERSION)
    with pytest.raises(ValueError):
        MqttPublisher(MqttConfig(queue_limit=0), DEVICE, VERSION)
    pub = MqttPublisher(MqttConfig(host="192.0.2.1"), DEVICE, VERSION)  # TEST-NET: never dialled
    assert pub.stats()["connected"] is False and pub.client_id == f"yoloedge-{DEVICE}"
    pub.stop(timeout_s=0.1)  # before start(): a no-op
    assert pub.publish("x/y", {}) is False


# ---------------------------------------------------------------- with mosquitto

def test_detections_state_and_stats_round_trip(mosquitto, subscriber, make_publisher, subscriber_factory):
    pub = make_publisher(mosquitto)
    assert pub.wait_connected(5)
    message = _detections(7)
    assert pub.publish_detections("cam1", message)
    assert pub.publish_camera_state("cam1", {"camera": "cam1", "state": "running", "reason": None,
                                             "ts": utc_timestamp()})
    assert pub.publish_stats({"uptime_s": 1.5, "mqtt": pub.stats()})
    topic = TOPICS.detections("cam1")
    assert subscriber.wait_for(lambda ms: len(ms) == 1, 5, topic=topic)
    got = subscriber.messages(topic)[0]
    assert got.json() == message and got.qos == 1 and not got.retain
    assert b" " not in got.payload  # compact JSON
    assert subscriber.wait_for(lambda ms: len(ms) == 1, 5, topic=TOPICS.stats)
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    stats = pub.stats()
    assert stats["delivered"] == stats["published"] == 3 and stats["dropped"] == 0
    assert stats["broker"] == f"127.0.0.1:{mosquitto.port}"

    late = subscriber_factory(mosquitto, ("yoloedge/#",))
    state_topic = TOPICS.camera_state("cam1")
    assert late.wait_for(lambda ms: len(ms) == 1, 5, topic=state_topic)
    assert late.messages(state_topic)[0].retain and late.payloads(state_topic)[0]["state"] == "running"

    assert pub.clear_camera("cam1")  # removed camera: retained state deleted
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    later = subscriber_factory(mosquitto, (state_topic,))
    time.sleep(0.3)
    assert later.messages(state_topic) == []


def test_status_online_retained_and_republished_after_broker_restart(
        mosquitto, make_publisher, subscriber_factory):
    pub = make_publisher(mosquitto)
    assert pub.set_status("online")
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)  # on the broker before anyone subscribes
    late = subscriber_factory(mosquitto, (TOPICS.status,))
    assert late.wait_for(lambda ms: len(ms) >= 1, 5)
    first = late.messages()[0]
    assert first.retain and first.qos == 1
    status = first.json()
    assert status["state"] == "online" and status["device_id"] == DEVICE
    assert status["version"] == VERSION and TS_RE.match(status["ts"])

    # persistence is off: the restarted broker has forgotten the retained status
    mosquitto.restart()
    assert _wait(lambda: pub.stats()["reconnects"] == 1, 10)
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    again = subscriber_factory(mosquitto, (TOPICS.status,))
    assert again.wait_for(lambda ms: len(ms) >= 1, 5)
    assert again.payloads(TOPICS.status)[-1]["state"] == "online"


PUBLISHER_PROCESS = textwrap.dedent("""
    import sys, time
    from yoloedge.config import MqttConfig
    from yoloedge.publish import MqttPublisher
    pub = MqttPublisher(MqttConfig(host="127.0.0.1", port=int(sys.argv[1])), sys.argv[2], "9.9.9")
    pub.start()
    if not pub.wait_connected(10):
        sys.exit(3)
    pub.set_status("online")
    print("ready", flush=True)
    time.sleep(60)
""")


def test_last_will_offline_when_publisher_process_is_killed(mosquitto, subscriber):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER_PROCESS, str(mosquitto.port), "victim"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        topic = Topics("yoloedge", "victim").status
        assert subscriber.wait_for(lambda ms: [m.json()["state"] for m in ms] == ["online"], 5, topic=topic)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        assert subscriber.wait_for(lambda ms: len(ms) == 2, 5, topic=topic)
        will = subscriber.messages(topic)[1]
        assert will.json()["state"] == "offline" and will.json()["device_id"] == "victim"
        assert will.qos == 1
    finally:
        proc.kill()
        proc.wait(5)


def test_stop_publishes_stopped_and_no_last_will(mosquitto, subscriber, make_publisher, subscriber_factory):
    pub = make_publisher(mosquitto)
    pub.set_status("online")
    assert subscriber.wait_for(lambda ms: len(ms) == 1, 5, topic=TOPICS.status)
    t0 = time.monotonic()
    pub.stop(timeout_s=5)
    assert time.monotonic() - t0 < 1.0  # nothing to wait for once "stopped" is acknowledged
    pub.stop(timeout_s=5)  # idempotent
    assert pub.publish_stats({"late": True}) is False
    time.sleep(0.3)  # a Will would arrive right after the socket closed
    assert [p["state"] for p in subscriber.payloads(TOPICS.status)] == ["online", "stopped"]
    late = subscriber_factory(mosquitto, (TOPICS.status,))
    assert late.wait_for(lambda ms: len(ms) == 1, 5)
    assert late.messages()[0].retain and late.payloads(TOPICS.status)[0]["state"] == "stopped"
    assert pub.stats()["connected"] is False


def test_outage_messages_arrive_exactly_once_in_order(mosquitto_factory, subscriber_factory,
                                                      make_publisher):
    broker = mosquitto_factory(persistence=True)  # keeps the subscriber's session across restart
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,), client_id="outage-sub", clean_session=False)
    pub = make_publisher(broker)
    assert pub.wait_connected(5)
    sent: list[tuple[int, bool, str]] = []  # (seq, accepted, phase)
    seq = 0

    def publish_for(seconds: float, phase: str) -> None:
        nonlocal seq
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent.append((seq, pub.publish_detections("cam1", {"seq": seq}), phase))
            seq += 1
            time.sleep(0.05)  # ~20 msg/s

    publish_for(1.0, "before")
    broker.stop()
    publish_for(3.0, "outage")
    broker.start()
    publish_for(1.0, "after")
    accepted = [s for s, ok, _ in sent if ok]
    assert len(accepted) == len(sent)
    assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(accepted), 15)
    received = [m.json()["seq"] for m in sub.messages(topic)]
    outage = [s for s, _, phase in sent if phase == "outage"]
    assert all(received.count(s) == 1 for s in outage)
    first_seen = list(dict.fromkeys(received))
    assert first_seen == sorted(first_seen)
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    stats = pub.stats()
    assert stats["reconnects"] == 1 and stats["dropped"] == 0
    print(f"\noutage: {len(sent)} published ({len(outage)} during a 3 s outage), "
          f"{len(received)} received, {len(received) - len(set(received))} duplicates, "
          f"in order: {first_seen == sorted(first_seen)}; stats {stats}")


def test_queue_overflow_is_counted_and_start_never_blocks(mosquitto_factory, subscriber_factory,
                                                          make_publisher, caplog):
    caplog.set_level(logging.DEBUG, logger="yoloedge")
    broker = mosquitto_factory()
    broker.stop()  # the broker is down when the daemon starts
    t0 = time.monotonic()
    pub = make_publisher(broker, queue_limit=5)
    assert time.monotonic() - t0 < 0.5
    results = [pub.publish_detections("cam1", {"seq": i}) for i in range(8)]
    assert results == [True] * 5 + [False] * 3
    assert pub.publish_detections("cam1", {"seq": 99}) is False
    assert pub.publish("yoloedge/x", "qos0", qos=0) is False  # QoS 0 is never queued
    assert _wait(lambda: pub.stats()["last_error"] is not None, 5)
    stats = pub.stats()
    assert stats["dropped"] == 5 and stats["queued"] == 5 and stats["connected"] is False
    assert "Connection refused" in stats["last_error"]
    assert any("dropped" in r.getMessage() and "queue full" in r.getMessage() for r in caplog.records)

    broker.start()
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(broker, (topic,))
    # the publisher may connect before the subscriber: wait until everything is acknowledged
    assert _wait(lambda: pub.stats()["queued"] == 0, 10)
    stats = pub.stats()
    assert stats["connected"] and stats["delivered"] == 5 and stats["published"] == 5
    assert pub.publish_detections("cam1", {"seq": 100})
    assert sub.wait_for(lambda ms: any(m.json()["seq"] == 100 for m in ms), 5)
    seqs = [m.json()["seq"] for m in sub.messages(topic)]
    assert seqs == sorted(seqs) and set(seqs) <= {0, 1, 2, 3, 4, 100}  # in order, nothing dropped sent


def test_password_auth_and_wrong_password_reported(mosquitto_factory, make_publisher,
                                                   subscriber_factory, caplog):
    caplog.set_level(logging.DEBUG)
    broker = mosquitto_factory(users={"edge": "Pa55-good-secret"})
    sub = subscriber_factory(broker, ("yoloedge/#",))
    good = make_publisher(broker, username="edge", password="Pa55-good-secret")
    assert good.wait_connected(5)
    assert good.publish_stats({"ok": 1})
    assert sub.wait_for(lambda ms: len(ms) == 1, 5)

    bad = make_publisher(broker, device_id="edge-02", username="edge", password="Wr0ng-secret")
    assert _wait(lambda: bad.stats()["last_error"] is not None, 5)
    time.sleep(0.5)  # it keeps retrying, with back-off, without crashing
    stats = bad.stats()
    assert stats["connected"] is False
    assert "refused" in stats["last_error"] and "Not authorized" in stats["last_error"]
    assert bad.publish_stats({"queued": True})  # queued for when the password is fixed
    t0 = time.monotonic()
    bad.stop(timeout_s=1.0)
    assert time.monotonic() - t0 < 1.4
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Not authorized" in logged
    for secret in ("Pa55-good-secret", "Wr0ng-secret"):
        assert secret not in logged and secret not in caplog.text and secret not in str(stats)


def test_tls_with_self_signed_ca(mosquitto_factory, make_publisher, subscriber_factory):
    broker = mosquitto_factory(tls=True)
    sub = subscriber_factory(broker, ("yoloedge/#",))
    pub = make_publisher(broker)  # TlsConfig(ca_certs=broker.ca_cert)
    assert pub.wait_connected(5)
    assert pub.publish_detections("cam1", _detections(1))
    assert sub.wait_for(lambda ms: len(ms) == 1, 5)

    untrusted = make_publisher(broker, device_id="edge-03", tls=TlsConfig())  # system CAs only
    assert _wait(lambda: untrusted.stats()["last_error"] is not None, 5)
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stats()["last_error"]


def test_stop_with_broker_down_returns_within_timeout(mosquitto, make_publisher):
    pub = make_publisher(mosquitto)
    pub.set_status("online")
    assert _wait(lambda: pub.stats()["queued"] == 0, 5)
    mosquitto.kill()
    assert _wait(lambda: not pub.stats()["connected"], 5)
    for i in range(10):
        assert pub.publish_detections("cam1", {"seq": i})
    t0 = time.monotonic()
    pub.stop(timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 1.4  # waited for the broker, not (much: scheduling) past the timeout
    assert pub.stats()["queued"] == 11  # 10 detections + "stopped", never delivered


def test_the_link_state_moves_only_along_its_transitions():
    """down -> connected (CONNACK) -> ready (replay handed over) -> down; a typed LinkHealth."""
    import threading

    from yoloedge.publish.diagnostics import Diagnostics
    from yoloedge.publish.link_health import LinkMonitor, LinkState

    lock = threading.Condition(threading.Lock())
    link = LinkMonitor(MqttConfig(), "b:1883", "c", lock, Diagnostics("b:1883", time.monotonic),
                       time.monotonic, None)
    assert link.health().state is LinkState.DOWN and not link.health().connected
    link.connected()
    with lock:
        with pytest.raises(RuntimeError):
            link._move_locked(LinkState.CONNECTED)  # a second CONNACK without a disconnect
        link.mark_ready_locked()
    health = link.health()
    assert health.state is LinkState.READY and health.connected and health.reconnect_delay_s is None
    with lock:
        assert link.disconnected_locked()[0]  # it was connected
    assert link.health().state is LinkState.DOWN
