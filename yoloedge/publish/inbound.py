"""What the broker may send to the daemon, and the guard that drops a connection carrying more.

The daemon only publishes and subscribes to nothing, so everything a broker that follows the
protocol sends it is a short control packet: CONNACK, PUBACK, PUBREC, PUBCOMP and PINGRESP (and,
with MQTT v5, DISCONNECT and AUTH), a few bytes each. Without a guard, a hostile broker (or a man
in the middle of a connection without TLS) could send

* a PUBLISH claiming 256 MB: paho asks the socket for the packet's whole remaining length in one
  `recv`, which allocates that much before a byte of it has arrived, and then buffers it all
  (measured: +725 MB peak RSS);
* a flood of QoS 2 PUBLISHes, which paho keeps until their PUBREL that never comes (+67 MB kept).

`InboundGuard` follows the MQTT framing of every byte read from the connection: the fixed
header's packet type and remaining length are checked before the body is read, so a PUBLISH (we
asked for none), a packet type a broker never sends to a client, or a packet larger than
`MAX_INBOUND_PACKET_BYTES` ends the connection after at most five header bytes. Reads never
cross a packet boundary and never ask for more than the current packet has left, so no `recv`
allocates more than the limit. The publisher reports the reason and reconnects as after any
lost connection.

Why not MQTT v5's Maximum Packet Size: the daemon speaks 3.1.1 (see publish/mqtt.py), and the
property only binds a broker that honours it; the guard also holds against one that does not.

How it hooks into paho: `GuardedClient` overrides `Client._sock_recv(bufsize)`, the one method
through which paho 2.x reads from its socket (TCP, TLS or WebSocket), and notices a new
connection by `Client._sock` being another object. These two private names are the only paho
internals used; `check_hook()` refuses a paho without them at start-up, and the hostile-broker
tests (tests/test_mqtt_hostile.py) prove that the hook is what paho reads through.
"""

from __future__ import annotations

import enum
from typing import Any

import paho.mqtt.client as mqtt

#: the largest packet body (remaining length) accepted from the broker. A 3.1.1 acknowledgement
#: has 2 bytes; with MQTT v5 properties (a reason string, user properties) a few hundred.
MAX_INBOUND_PACKET_BYTES = 4096
#: a remaining length takes at most 4 bytes in MQTT.
_MAX_LENGTH_BYTES = 4

#: MQTT control packet types (the fixed header's high nibble) a broker may send to a client that
#: only publishes, by name.
ALLOWED_TYPES = {2: "CONNACK", 4: "PUBACK", 5: "PUBREC", 7: "PUBCOMP", 13: "PINGRESP",
                 14: "DISCONNECT", 15: "AUTH"}
PUBLISH_TYPE = 3
#: every packet type's name, for the reason given when one is refused.
TYPE_NAMES = {0: "reserved (0)", 1: "CONNECT", 3: "PUBLISH", 6: "PUBREL", 8: "SUBSCRIBE",
              9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", **ALLOWED_TYPES}


class InboundRefused(ConnectionAbortedError):
    """The broker sent something this client never asked for. An OSError, so paho's reader
    treats it as a lost connection: it closes the socket, reports the disconnect and reconnects."""


class _Part(enum.Enum):
    TYPE = "type"  # the next byte starts a packet
    LENGTH = "length"  # reading the remaining length
    BODY = "body"  # reading the packet's body


class InboundGuard:
    """The framing state of one connection's incoming bytes (see the module docstring). One per
    connection; used only by paho's network thread."""

    def __init__(self, max_packet_bytes: int = MAX_INBOUND_PACKET_BYTES):
        self.max_packet_bytes = max_packet_bytes
        self._part = _Part.TYPE
        self._type = 0
        self._length = 0
        self._length_bytes = 0
        self._left = 0  # body bytes of the current packet not read yet

    def allowance(self, bufsize: int) -> int:
        """How many of the `bufsize` bytes paho asks for may be read now: the header one byte at
        a time (as paho reads it anyway), the body up to its end."""
        if self._part is _Part.BODY:
            return min(bufsize, self._left)
        return min(bufsize, 1)

    def feed(self, data: bytes) -> None:
        """Follow `data`, just read; raises InboundRefused at the first byte that shows a packet
        this client does not take."""
        view = memoryview(data)
        while view:
            if self._part is _Part.BODY:
                taken = min(len(view), self._left)
                self._left -= taken
                view = view[taken:]
                if not self._left:
                    self._part = _Part.TYPE
                continue
            self._header_byte(view[0])
            view = view[1:]

    def _header_byte(self, byte: int) -> None:
        if self._part is _Part.TYPE:
            self._type = byte >> 4
            if self._type == PUBLISH_TYPE:
                raise InboundRefused("sent an unsolicited PUBLISH (the daemon subscribes to nothing)")
            if self._type not in ALLOWED_TYPES:
                raise InboundRefused(f"sent a {TYPE_NAMES[self._type]} packet, which a broker never "
                                     f"sends to a client that only publishes")
            self._part, self._length, self._length_bytes = _Part.LENGTH, 0, 0
            return
        self._length |= (byte & 0x7F) << (7 * self._length_bytes)
        self._length_bytes += 1
        if byte & 0x80:
            if self._length_bytes >= _MAX_LENGTH_BYTES:
                raise InboundRefused("sent a packet whose length field is malformed")
            return
        if self._length > self.max_packet_bytes:
            raise InboundRefused(f"sent a {ALLOWED_TYPES[self._type]} packet of {self._length} "
                                 f"bytes (the limit is {self.max_packet_bytes}; acknowledgements "
                                 f"take a few)")
        self._left = self._length
        self._part = _Part.BODY if self._length else _Part.TYPE


class GuardedClient(mqtt.Client):
    """A paho client whose every read passes `InboundGuard` (see the module docstring). After a
    refusal, `take_refusal()` gives its reason once, for the disconnect callback."""

    def __init__(self, *args: Any, max_packet_bytes: int = MAX_INBOUND_PACKET_BYTES,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_packet_bytes = max_packet_bytes
        self._guard = InboundGuard(max_packet_bytes)
        self._guarded_sock: object | None = None
        self._refusal: str | None = None

    def _sock_recv(self, bufsize: int) -> bytes:
        sock = self._sock
        if sock is not self._guarded_sock:  # a new connection starts with a new packet
            self._guard = InboundGuard(self._max_packet_bytes)
            self._guarded_sock = sock
        data = super()._sock_recv(self._guard.allowance(bufsize))
        try:
            self._guard.feed(data)
        except InboundRefused as exc:
            self._refusal = str(exc)
            raise
        return data

    def take_refusal(self) -> str | None:
        """Why the guard dropped the connection last, once; None when it did not."""
        refusal, self._refusal = self._refusal, None
        return refusal


def check_hook() -> None:
    """Refuse a paho without the read hook the guard needs (a paho upgrade that renamed it would
    otherwise silently leave the connection unguarded)."""
    if not callable(getattr(mqtt.Client, "_sock_recv", None)):
        raise RuntimeError("this paho-mqtt has no Client._sock_recv: the inbound packet guard "
                           "cannot be installed (yoloedge supports paho-mqtt 2.x)")
