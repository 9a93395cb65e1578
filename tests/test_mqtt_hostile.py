"""The MQTT link against a hostile broker or a man in the middle: real TCP servers written here
that speak just enough MQTT 3.1.1 to be accepted, then send what the daemon never asked for, and
a real mosquitto behind a proxy for "and afterwards everything is delivered"."""

from __future__ import annotations

import select
import socket
import threading
import time
import tracemalloc

import pytest

from broker import HOST
from yoloedge.config import MqttConfig
from yoloedge.publish import MqttPublisher, Topics
from yoloedge.publish.inbound import InboundGuard, InboundRefused

DEVICE = "edge-66"
TOPICS = Topics("yoloedge", DEVICE)
CONNACK = b"\x20\x02\x00\x00"
#: the largest remaining length MQTT can express: 256 MB
HUGE = 268435455


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _length(n: int) -> bytes:
    """An MQTT remaining-length field."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 1) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic.encode()
    if qos:
        body += packet_id.to_bytes(2, "big")
    body += payload
    return bytes([0x30 | (qos << 1)]) + _length(len(body)) + body


def _read_packet(conn: socket.socket) -> tuple[int, bytes] | None:
    """One MQTT packet (type nibble, body) from `conn`, or None at the end of the stream."""
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


class HostileBroker:
    """Accepts every connection, answers CONNECT with CONNACK, then runs `attack(conn)`, and
    records per connection how many bytes the attack got onto the wire and which packets the
    client sent back."""

    def __init__(self, attack):
        self.attack = attack
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.host, self.port = HOST, self.sock.getsockname()[1]
        self.accepted = 0
        self.closed_by_client = 0  # connections the client ended while the attack was sending
        self.replies: list[int] = []  # packet types the client sent after its CONNECT
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
            self._conns.append(conn)
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        try:
            packet = _read_packet(conn)
            if packet is None or packet[0] != 1:
                return
            conn.sendall(CONNACK)
            threading.Thread(target=self._read_replies, args=(conn,), daemon=True).start()
            self.attack(conn)
        except OSError:  # the client hung up in the middle of the attack
            self.closed_by_client += 1

    def _read_replies(self, conn: socket.socket) -> None:
        try:
            while (packet := _read_packet(conn)) is not None:
                self.replies.append(packet[0])
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        self._thread.join(5)


def _stream_huge(first_byte: int):
    """An attack: a packet header claiming 256 MB, then its body, 64 KiB at a time."""
    def attack(conn: socket.socket) -> None:
        conn.sendall(bytes([first_byte]) + _length(HUGE))
        chunk = b"\0" * 65536
        for _ in range(HUGE // len(chunk)):
            conn.sendall(chunk)
    return attack


def _qos2_flood(conn: socket.socket) -> None:
    """An attack: unsolicited QoS 2 PUBLISHes, which paho would keep until their PUBREL."""
    for packet_id in range(1, 20001):
        conn.sendall(_publish("evil/topic", b"x" * 1024, qos=2, packet_id=packet_id))


@pytest.fixture
def make_publisher():
    made: list[MqttPublisher] = []

    def make(host: str, port: int, **options) -> MqttPublisher:
        settings = {"host": host, "port": port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3,
                    "keepalive_s": 5, **options}
        pub = MqttPublisher(MqttConfig(**settings), DEVICE, "9.9.9")
        made.append(pub)
        pub.start()
        return pub

    yield make
    for pub in made:
        pub.stop(timeout_s=1.0, final_status=None)


@pytest.mark.parametrize("first_byte, reason", [
    (0x30, "sent an unsolicited PUBLISH"),  # QoS 0 PUBLISH of 256 MB
    (0x40, "sent a PUBACK packet of 268435455 bytes"),  # an acknowledgement of 256 MB
])
def test_a_256_mb_packet_is_refused_before_its_body_is_read(make_publisher, first_byte, reason):
    server = HostileBroker(_stream_huge(first_byte))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        pub = make_publisher(server.host, server.port)
        assert _wait(lambda: server.closed_by_client >= 1, 20), pub.stats()
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB while refusing it"
        assert _wait(lambda: reason in (pub.stats()["last_error"] or ""), 10), pub.stats()
        error = pub.stats()["last_error"]
        assert f"{server.host}:{server.port}" in error and "disconnected" in error
        assert _wait(lambda: server.accepted >= 2, 10), "it reconnects as after any lost connection"
    finally:
        tracemalloc.stop()
        server.close()


def test_a_flood_of_unsolicited_qos2_publishes_is_refused_at_the_first(make_publisher):
    server = HostileBroker(_qos2_flood)
    try:
        pub = make_publisher(server.host, server.port)
        assert _wait(lambda: server.closed_by_client >= 2, 20), pub.stats()
        assert 5 not in server.replies, "no PUBREC: the client kept none of them"
        error = pub.stats()["last_error"]
        assert "sent an unsolicited PUBLISH" in error, error
        assert not pub.stats()["connected"] or server.accepted >= 2
    finally:
        server.close()


class _Proxy:
    """A man in the middle in front of a real broker: the first connection gets a PUBLISH
    injected right after the broker's CONNACK; later ones are passed through untouched."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.host, self.port = HOST, self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            inject = self.accepted == 1
            threading.Thread(target=self._pump, args=(conn, inject), daemon=True).start()

    def _pump(self, client: socket.socket, inject: bool) -> None:
        broker = socket.create_connection(self.upstream)
        pending = _publish("yoloedge/evil", b"gotcha", qos=2) if inject else b""
        try:
            while True:
                ready, _, _ = select.select([client, broker], [], [], 10)
                if not ready:
                    return
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    if src is broker:
                        client.sendall(data + pending)  # after the CONNACK, the first reply
                        pending = b""
                    else:
                        broker.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            broker.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


def test_after_a_man_in_the_middle_is_refused_everything_is_delivered(
        mosquitto, subscriber_factory, make_publisher):
    topic = TOPICS.detections("cam1")
    sub = subscriber_factory(mosquitto, (topic,))
    proxy = _Proxy((mosquitto.host, mosquitto.port))
    try:
        pub = make_publisher(proxy.host, proxy.port)
        for seq in range(20):
            assert pub.publish_detections("cam1", {"seq": seq})
        assert _wait(lambda: proxy.accepted >= 2 and pub.stats()["connected"], 15), pub.stats()
        for seq in range(20, 40):
            assert pub.publish_detections("cam1", {"seq": seq})
        assert sub.wait_for(lambda ms: {m.json()["seq"] for m in ms} >= set(range(40)), 15), \
            pub.stats()
        first_seen = list(dict.fromkeys(m.json()["seq"] for m in sub.messages(topic)))
        # the backlog queued while the link was refused, and the messages sent after it came back,
        # each in order; new messages may go ahead of a backlog still draining (publish.pacing)
        assert [s for s in first_seen if s < 20] == list(range(20))
        assert [s for s in first_seen if s >= 20] == list(range(20, 40))
        stats = pub.stats()
        assert "sent an unsolicited PUBLISH" in stats["last_error"] and stats["connected"]
        assert _wait(lambda: pub.stats()["queued"] == 0, 10)
    finally:
        proxy.close()


# ---------------------------------------------------------------- the guard on its own

def test_the_guard_reads_headers_a_byte_at_a_time_and_bodies_up_to_their_end():
    guard = InboundGuard(max_packet_bytes=8)
    stream = CONNACK + b"\x40\x02\x00\x01" + b"\xd0\x00" + b"\x20\x08" + b"12345678"
    taken = []
    while stream:
        n = guard.allowance(65536)
        chunk, stream = stream[:n], stream[n:]
        guard.feed(chunk)
        taken.append(len(chunk))
    assert taken == [1, 1, 2, 1, 1, 2, 1, 1, 1, 1, 8]  # never across a packet's end
    guard.feed(b"\x20")
    with pytest.raises(InboundRefused, match="CONNACK packet of 9 bytes"):
        guard.feed(b"\x09")


@pytest.mark.parametrize("data, words", [
    (b"\x32", "unsolicited PUBLISH"),
    (b"\x90", "SUBACK packet, which a broker never sends"),
    (b"\x10", "CONNECT packet"),
    (b"\x40\xff\xff\xff\xff", "length field is malformed"),
])
def test_the_guard_refuses_what_a_publisher_never_asked_for(data, words):
    with pytest.raises(InboundRefused, match=words):
        InboundGuard().feed(data)
