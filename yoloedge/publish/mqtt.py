"""Publishes detections, camera states, stats and the device status to an MQTT broker.

Design (the why behind the code below; docs/integrations/mqtt.md has the topics and payloads):

* Protocol MQTT 3.1.1 with a clean session. Every broker speaks it (mosquitto, EMQX, HiveMQ,
  cloud IoT brokers, the pure-Python amqtt used as a test fallback), and nothing here needs a
  v5 feature: we only publish, and the broker-side session would hold nothing for us.
* Nothing touches the network before `start()`; `start()` never blocks: paho's network thread
  (`connect_async` + `loop_start`) connects and keeps retrying, so a broker that is down at boot
  is not fatal. The waits between attempts are the cameras' rule (backoff.py): from
  `reconnect_min_s`, doubling up to `reconnect_max_s`, spread by RECONNECT_JITTER either way (a
  fleet of devices behind one broker must not reconnect in step after it restarts), and back to
  the start after a connection that lasted SHORT_LIVED_S. paho's own back-off has no jitter, so
  each failure callback sets the next wait with `reconnect_delay_set(d, d)` (its public API)
  before paho waits it.
* Ordering and "never twice". While we are not connected, QoS >= 1 messages wait in our own
  bounded outbox (or the spool), never in paho: they are the backlog. On every successful CONNACK
  (in `on_connect`, which paho calls *before* it re-sends its own unacknowledged messages) we take
  paho's unacknowledged messages back with `drop_out_messages()` to the front of the backlog.
  Each message is therefore in exactly one place, and on the wire once per connection. (A message
  the broker received just before the connection died but whose PUBACK we never saw goes out
  again: that is QoS 1's at-least-once, the same thing paho's DUP re-send does.) Letting paho
  replay by itself would send them ahead of older ones, and all at once.
* Reconnect without a flood (publish/pacing.py). What users expect after an outage: the current
  state at once, and the history without drowning the subscribers. So on a reconnect the status
  and, for every retained topic (camera state, Home Assistant discovery and counts), only its
  newest copy go out at once; older copies of a retained topic still waiting are skipped (the
  broker would keep only the newest anyway), counted in `superseded`. The rest of the backlog
  goes out in the order it was published, at most `drain_rate` messages a second (a token bucket
  of one second's worth), handed over by the `mqtt-drain` thread. Messages published after the
  reconnect go out at once, ahead of the backlog: a subscriber may get a new detection before
  older ones from the outage (their `ts` and `frame` tell them apart), but never an old retained
  state after a newer one. With `drain_rate` 0 the backlog goes as fast as the broker takes it;
  during stop() without a spool too, since what is not sent by then is lost.
* Bounded: messages in the outbox plus messages handed to paho and not yet acknowledged never
  exceed `queue_limit` messages nor `queue_limit_bytes` of payload (both counted under `_lock`);
  past that, `publish()` returns False and the drop is counted and logged (rate-limited): while
  disconnected the newest message is the one dropped, so what is queued stays a gap-free
  prefix; while an in-memory backlog drains, the oldest waiting ones make room for a new one
  (the newest data is worth more than the oldest, and new messages must not wait behind a paced
  backlog). Status messages are exempt: they are few, and the daemon's last word.
  QoS 0 messages are never queued: while disconnected they are dropped (and counted).
* Durable outbox (`spool_dir`, publish/spool.py): every QoS >= 1 message except the status is
  appended to the spool first and handed to paho from there; the spool is the outbox. One ordered
  log for everything (rather than spooling only what overflows memory, or only what is unsent at
  a stop) keeps order across outages, overflow and restarts without merging two queues, and
  survives kill -9. While connected a message goes straight to paho when the memory limits
  allow (ahead of a spooled backlog, if one is draining: `SentAhead` remembers it, so the drain
  skips it); otherwise the `mqtt-drain` thread hands records over in order as acknowledgements
  free room. After a lost connection the spool is rewound to the oldest unacknowledged record
  (acknowledged ones are skipped). Records are deleted once the broker acknowledged them all
  (QoS 1 PUBACK); the spool's byte limit drops the oldest segments, counted as dropped.
* No CONNACK: paho closes a connection whose CONNACK has not come `keepalive_s` after CONNECT
  (its keep-alive check), and a server that is not an MQTT broker (HTTP, a TLS port spoken to
  in clear) closes it or sends what paho rejects. paho reports all of these only as a disconnect
  without a connect, so its disconnect callback (callbacks.py) turns them into `last_error` and
  one warning per outage.
* Nothing but acknowledgements comes in (publish/inbound.py): we subscribe to nothing, so a
  PUBLISH from the broker, a packet type a broker never sends to a publisher, or a packet larger
  than MAX_INBOUND_PACKET_BYTES drops the connection before its body is read (a hostile broker or
  a man in the middle could otherwise make paho allocate 256 MB, or keep a flood of QoS 2
  messages); `last_error` says why, and the client reconnects as after any lost connection.
* A TLS connection to a port that does not speak TLS fails in the handshake (an SSL error or a
  reset): `last_error` then asks whether the port is a TLS port.
* Flapping (CONNACK, then the connection drops, again and again): the first lost connection is a
  warning; later ones within FLAP_WINDOW_S are summed into one warning per FLAP_WINDOW_S
  ("reconnected N times ..."), so a flapping broker cannot flood the journal.
* A broker that takes PUBLISH but never acknowledges it looks connected. When messages have
  waited ACK_STALL_MIN_S (or two keep-alive intervals, if longer) with no acknowledgement at all,
  `stats()` says so in `last_error` and `ack_stalled` (a daemon problem); an acknowledgement
  clears it. The clock is injectable, so this is tested without waiting.
* Delivery is tracked with `on_publish` (mid -> delivered), not `wait_for_publish()`, which
  raises for messages published while disconnected.
* Status: retained, QoS 1, on `{prefix}/{device_id}/status`; the Last Will says "offline". The
  current status is re-published after every reconnect unless it is still waiting to go out,
  because the broker may have published our Last Will (or lost its retained messages on a
  restart) while we were away. `stop()` disconnects cleanly, so the broker discards the Will.
* Home Assistant discovery (publish/homeassistant.py, when `mqtt.homeassistant` is set): every
  (re)connect publishes every retained config right after the replay, under the same
  `_send_lock`, so nothing can slip between. Configs published while not connected are not
  queued (the next connect publishes the current set); removals are, in order, so a camera
  removed during an outage is still removed. They bypass the spool and the queue limits like the
  status: they are few, and rebuilt from the registry on every connect.

Who does what: this module keeps the client's lifecycle (start, stop) and its public publishing
API; paho's callbacks (callbacks.py: CONNACK, failed attempts, lost connections, acknowledgements,
each turned into events of the parts below), the outbox (outbox.py: ordering, limits, replay),
the drain (drain.py: the paced hand-over and the spool as the outbox), the link's health
(link_health.py: back-off, flaps, short-lived connections, ack stalls, no-CONNACK diagnoses, a
typed `LinkHealth`), the diagnostics (diagnostics.py: the error book and the drop count) and
building and stopping the paho client (paho_client.py) each do one of the jobs above. Home
Assistant's objects-in-view counting is the Home Assistant sink's
(routing/sinks/homeassistant.py): the client only hands discovery messages over
(`publish_discovery`).

Locks: `_send_lock` (re-entrant) serialises everything that hands messages to paho, including
the replay in `on_connect` and the drain. `_lock` (a Condition, shared with the outbox, the drain
and the link monitor) guards counters and queues (and the pacing state: the token bucket,
SentAhead, the retained registry); it is a leaf lock: it is never held while calling into paho,
because paho holds its own locks while calling our callbacks. The locks of the diagnostics, the
error book, the spool and the Home Assistant registry are leaves too, taken with or without
`_send_lock` and `_lock`.
"""

from __future__ import annotations

import enum
import json
import logging
import random
import threading
import time
from typing import Any, Callable

import paho.mqtt.client as mqtt

from ..config.schema import MqttConfig
from ..timeutil import utc_timestamp
from .callbacks import PahoCallbacks
from .diagnostics import Diagnostics
from .drain import SPOOL_SYNC_INTERVAL_S, Drain
from .homeassistant import DISCOVERY_QOS, Discovery, Message, Renderer
from .link_health import LinkHealth, LinkMonitor
from .outbox import Outbox, Outgoing
from .paho_client import new_client, shutdown
from .spool import Spool
from .topics import Topics

logger = logging.getLogger(__name__)

STATUS_QOS = 1
#: events and line/zone counts: at least once, whatever `mqtt.qos` says (through the spool when on)
EVENT_QOS = 1
#: the longest part of a stop() timeout kept for the clean disconnect after waiting for delivery.
DISCONNECT_RESERVE_S = 1.0
#: paho numbers unacknowledged messages with 16-bit MQTT packet ids (at most 65535 at once); the
#: margin leaves room for status messages, which bypass the limit.
MAX_QUEUE_LIMIT = 65000
_MAX_TOPIC_BYTES = 65535
_MAX_PAYLOAD_BYTES = 268435455


class DeviceStatus(str, enum.Enum):
    """The retained device status (`{prefix}/{device_id}/status`); Home Assistant reads anything
    but ONLINE as unavailable. `set_status` takes these (or their strings)."""

    ONLINE = "online"
    OFFLINE = "offline"  # the Last Will
    STOPPED = "stopped"  # a clean stop

    def __str__(self) -> str:
        return self.value


def _json_default(obj: Any) -> Any:
    """Let numpy scalars and arrays (the pipeline's natural types) serialise as plain JSON."""
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def encode_payload(payload: Any) -> bytes:
    """bytes as is, str as UTF-8, None as empty, anything else as compact UTF-8 JSON.

    NaN and infinity are refused (ValueError): they are not JSON, and many consumers'
    parsers (JavaScript's JSON.parse) reject the whole message.
    """
    if payload is None:
        return b""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=_json_default)
    return text.encode("utf-8")


def _check_topic(topic: str) -> None:
    """Refuse a topic paho would refuse, here, before it can sit in the outbox."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"invalid MQTT topic {topic!r}: must be a non-empty string")
    if "+" in topic or "#" in topic:
        raise ValueError(f"invalid MQTT topic {topic!r}: wildcards cannot be published to")
    if len(topic.encode("utf-8")) > _MAX_TOPIC_BYTES:
        raise ValueError(f"MQTT topic longer than {_MAX_TOPIC_BYTES} bytes")


class MqttPublisher:
    """One MQTT connection for the whole daemon; thread-safe (any thread may publish)."""

    def __init__(self, config: MqttConfig, device_id: str, version: str,
                 clock: Callable[[], float] = time.monotonic, discovery: Discovery | None = None,
                 rng: random.Random | None = None):
        _check_config(config)
        self._config = config
        self._device_id = device_id
        self._version = version
        self.topics = Topics(config.topic_prefix, device_id)
        self.client_id = config.client_id or f"yoloedge-{device_id}"
        self.broker = f"{config.host}:{config.port}"
        self._client: mqtt.Client | None = None
        self._send_lock = threading.RLock()
        self._lock = threading.Condition(threading.Lock())
        # the clock: for rate-limited logs, the acknowledgement check and the drain's pace
        self._diag = Diagnostics(self.broker, clock)
        self._link = LinkMonitor(config, self.broker, self.client_id, self._lock, self._diag,
                                 clock, rng)
        self._out = Outbox(config, self.topics, self._lock, self._link, self._diag, clock,
                           self._status_message)
        self._drain = Drain(config, self._send_lock, self._lock, self._out, self._link,
                            self._diag, clock)
        self._spool: Spool | None = None  # handed to the outbox and the drain by start()
        if config.spool_dir is not None:
            self._spool = Spool(config.spool_dir, config.spool_limit_bytes,
                                fsync_interval_s=SPOOL_SYNC_INTERVAL_S)
        #: Home Assistant discovery. The registry is the daemon's, shared by successive clients
        #: and kept up to date while discovery is off, so a reload can turn it on.
        self._discovery = discovery or Discovery(device_id, version, "")
        self._ha: Renderer | None = None
        if config.homeassistant is not None:
            self._ha = Renderer(config.homeassistant, self.topics, self._discovery)
        self._callbacks = PahoCallbacks(self.broker, self._send_lock, self._lock, self._out,
                                        self._drain, self._link, self._diag, self._ha,
                                        self.publish_discovery)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start connecting in the background and return at once; retries until stop()."""
        with self._send_lock:
            if self._client is not None or self._drain.stopping:
                raise RuntimeError("MqttPublisher.start() may be called once, before stop()")
            self._client = self._out.client = self._make_client()
            self._spool = self._drain.start(self._spool)  # None when it cannot be opened
        cfg = self._config
        logger.info("MQTT: connecting to %s as %r (user=%s, password=%s, tls=%s, qos=%d, "
                    "queue_limit=%d, queue_limit_bytes=%d, spool=%s)", self.broker, self.client_id,
                    cfg.username, "***" if cfg.password else None, cfg.tls is not None, cfg.qos,
                    cfg.queue_limit, cfg.queue_limit_bytes, self._spool is not None)
        self._client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        self._client.loop_start()

    def _make_client(self) -> mqtt.Client:
        """The paho client (paho_client.py) with our callbacks."""
        client = new_client(self._config, self.client_id, self.topics.status,
                            self._status_payload(DeviceStatus.OFFLINE), STATUS_QOS)
        self._callbacks.attach(client)
        return client

    def stop(self, timeout_s: float, final_status: DeviceStatus | str | None = DeviceStatus.STOPPED
             ) -> None:
        """Publish `final_status`, wait (at most `timeout_s` in all) until everything queued is
        acknowledged, then disconnect cleanly so the broker does NOT publish the Last Will.
        Safe to call more than once, and before start(). Never raises: the daemon stops or
        replaces the client next, and a failure here (a spool whose final fsync fails) must not
        keep it from that; the failure is logged and kept in stats()["last_error"]."""
        try:
            self._stop(timeout_s, final_status)
        except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
            self._diag.internal(f"stopping the client failed: {exc}")

    def _stop(self, timeout_s: float, final_status: DeviceStatus | str | None) -> None:
        with self._send_lock:
            if self._drain.stopping:
                return
            with self._lock:
                self._drain.stopping = True
        deadline = time.monotonic() + max(0.0, timeout_s)
        if final_status is not None:
            self.set_status(final_status)
        with self._lock:
            self._lock.notify_all()  # without a spool the drain goes unpaced now
        if self._client is None:
            self._close_outbox()
            return
        self._out.wait_drained(deadline - min(DISCONNECT_RESERVE_S, max(0.0, timeout_s) / 4))
        self._close_outbox()
        shutdown(self._client, deadline)
        self._drain.close(deadline)
        self._log_stop_summary()

    def _close_outbox(self) -> None:
        with self._send_lock:
            with self._lock:
                self._out.closed = True

    def _log_stop_summary(self) -> None:
        """Say what was lost, so a shutdown with the broker away is never silent."""
        with self._lock:
            unsent = self._out.queued_locked()
        unlogged, dropped = self._diag.take_unlogged()
        spooled = self._spool.unacked if self._spool is not None else 0
        if unsent:
            logger.warning("MQTT: stopped with %d message(s) not acknowledged by %s%s", unsent,
                           self.broker, f" ({spooled} kept in the spool for the next start)"
                           if spooled else "")
        if unlogged:
            logger.warning("MQTT: %d more message(s) dropped since the last report "
                           "(%d dropped in total)", unlogged, dropped)
        logger.info("MQTT: stopped (%s)", self.stats())

    def wait_connected(self, timeout_s: float) -> bool:
        """True once connected (the status and retained state handed over; the backlog follows
        at the drain's pace), False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._link.ready_locked:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    # ------------------------------------------------------------------ publishing API

    def set_status(self, state: DeviceStatus | str) -> bool:
        """Publish the device status (retained, QoS 1) and remember it for reconnects."""
        status = str(state)
        with self._send_lock:
            with self._lock:
                self._out.status = status
            return self._submit(self._status_message(status), bypass_limit=True)

    def publish_detections(self, camera: str, message: dict) -> bool:
        """One frame's detections of `camera` (the pipeline builds the message)."""
        return self.publish(self.topics.detections(camera), message)

    def publish_camera_state(self, camera: str, state: dict) -> bool:
        """Retained state of `camera`, so a new subscriber sees it at once."""
        return self.publish(self.topics.camera_state(camera), state, retain=True)

    def publish_event(self, camera: str, message: dict) -> bool:
        """One event of `camera` (new, update, end): QoS 1 whatever `mqtt.qos` says, through the
        spool when there is one, so an event is not lost to an outage."""
        return self.publish(self.topics.events(camera), message, qos=EVENT_QOS)

    def publish_counts(self, camera: str, kind: str, name: str, payload: dict) -> bool:
        """The retained counts of one line (`kind` "line") or zone ("zone") of `camera`."""
        return self.publish(self.topics.counts(camera, kind, name), payload, retain=True, qos=EVENT_QOS)

    def clear_counts(self, camera: str, kind: str, name: str) -> bool:
        """Delete a removed line's or zone's retained counts (an empty retained message)."""
        return self.publish(self.topics.counts(camera, kind, name), b"", retain=True, qos=EVENT_QOS)

    @property
    def discovery(self) -> Discovery:
        """The Home Assistant registry (the daemon's, shared by successive clients)."""
        return self._discovery

    @property
    def homeassistant(self) -> Renderer | None:
        """The Home Assistant discovery renderer of this client's settings; None when off."""
        return self._ha

    def clear_camera(self, camera: str) -> bool:
        """Delete the retained state of a removed camera (an empty retained message; its Home
        Assistant entities are the Home Assistant sink's)."""
        return self.publish(self.topics.camera_state(camera), b"", retain=True)

    def publish_discovery(self, messages: list[Message], removal: bool = False) -> None:
        """Hand discovery messages to paho while connected (see the module docstring); while
        not, keep only removals: the next connect publishes the current configs and counts."""
        with self._send_lock:
            with self._lock:
                skip = self._out.closed or (not self._link.ready_locked and not removal)
            if skip:
                return
            for m in messages:
                self._submit(Outgoing(m.topic, m.payload, DISCOVERY_QOS, True), bypass_limit=True)

    def publish_stats(self, stats: dict) -> bool:
        """Periodic device counters."""
        return self.publish(self.topics.stats, stats)

    def publish(self, topic: str, payload: Any, retain: bool = False, qos: int | None = None) -> bool:
        """Queue or send one message; False when it was dropped (counted in stats()).

        `payload`: dict/list (compact JSON), str (UTF-8), bytes, or None (empty).
        Raises ValueError for an invalid topic, QoS or payload (a programming error).
        """
        qos = self._config.qos if qos is None else qos
        if qos not in (0, 1, 2):
            raise ValueError(f"invalid QoS {qos!r}: must be 0, 1 or 2")
        _check_topic(topic)
        data = encode_payload(payload)
        if len(data) > _MAX_PAYLOAD_BYTES:
            raise ValueError(f"MQTT payload of {len(data)} bytes is over the protocol limit")
        return self._submit(Outgoing(topic, data, qos, retain))

    def _submit(self, msg: Outgoing, bypass_limit: bool = False) -> bool:
        """Send now when connected, else keep in the outbox (QoS >= 1), within the queue limits;
        with a spool, QoS >= 1 messages go through it (see the module docstring)."""
        limited = msg.qos > 0 and not bypass_limit
        with self._send_lock:
            if self._out.closed:
                self._diag.note_drop("the publisher is stopped")
                return False
            if limited and self._drain.spooling and self._drain.spool_submit(msg):
                return True
            return self._out.submit(msg, limited)

    def _status_payload(self, state: DeviceStatus | str) -> bytes:
        return encode_payload({"state": str(state), "device_id": self._device_id,
                               "version": self._version, "ts": utc_timestamp()})

    def _status_message(self, state: str) -> Outgoing:
        return Outgoing(self.topics.status, self._status_payload(state), STATUS_QOS, True)

    # ------------------------------------------------------------------ stats

    def ack_stall_s(self) -> float:
        """How long sent messages may wait for their first acknowledgement (link_health.py)."""
        return self._link.ack_stall_s()

    def link_health(self) -> LinkHealth:
        """The connection's state and problems, typed (`stats()` has the same, flattened)."""
        self._link.check_acks(self._out.oldest_pending_locked)
        self._link.check_stable()
        return self._link.health()

    def stats(self) -> dict:
        """Counters for the daemon's status: queued = waiting or not yet acknowledged (in memory
        or in the spool); queued_bytes = payload bytes of those held in memory; ack_stalled =
        connected, but the broker does not acknowledge (see link_health.py)."""
        link = self.link_health()
        dropped = self._diag.dropped
        with self._lock:
            out = self._out
            return {
                "connected": link.connected,
                "queued": out.queued_locked(),
                "queued_bytes": out.queued_bytes,
                "spooled": out.spool.unacked if out.spool is not None else None,
                "delivered": out.delivered,
                "dropped": dropped,
                "published": out.published,
                "reconnects": link.reconnects,
                "reconnect_delay_s": link.reconnect_delay_s,
                "backlog": out.backlog_locked(),
                "drained": self._drain.drained,
                "superseded": out.superseded,
                "drain_rate": self._config.drain_rate,
                **self._diag.errors.status(),
                "ack_stalled": link.ack_stalled,
                "unstable": link.unstable,
                "broker": self.broker,
            }


def _check_config(config: MqttConfig) -> None:
    """Refuse settings paho would reject later in its network thread, where nobody sees it."""
    if config.qos not in (0, 1, 2):
        raise ValueError(f"mqtt.qos must be 0, 1 or 2, not {config.qos!r}")
    if config.queue_limit_bytes < 1 or config.spool_limit_bytes < 1:
        raise ValueError("mqtt.queue_limit_bytes and mqtt.spool_limit_bytes must be >= 1")
    if not 1 <= config.queue_limit <= MAX_QUEUE_LIMIT:
        raise ValueError(f"mqtt.queue_limit must be between 1 and {MAX_QUEUE_LIMIT} (MQTT packet "
                         f"ids are 16-bit), not {config.queue_limit!r}")
    if config.password is not None and config.username is None:
        raise ValueError("mqtt.password is set but mqtt.username is not (MQTT needs both)")
    if not 0 < config.reconnect_min_s <= config.reconnect_max_s:
        raise ValueError("mqtt.reconnect_min_s must be > 0 and <= mqtt.reconnect_max_s")
    if not config.drain_rate >= 0:
        raise ValueError(f"mqtt.drain_rate must be >= 0 (0: unpaced), not {config.drain_rate!r}")
