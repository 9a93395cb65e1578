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
  without a connect, so `_on_disconnect` turns them into `last_error` and one warning per outage.
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

Locks: `_send_lock` (re-entrant) serialises everything that hands messages to paho, including
the replay in `on_connect` and the drain. `_lock` guards counters and queues (and the pacing
state: the token bucket, SentAhead, the retained registry); it is a leaf lock: it is never held
while calling into paho, because paho holds its own locks while calling our callbacks. The locks
of the error book, the spool and the Home Assistant registry are leaves too, taken with or
without `_send_lock` and `_lock`.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import json
import logging
import random
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from ..backoff import Backoff
from ..config.schema import MqttConfig
from ..config.tls import client_context
from ..health.errorbook import ErrorBook
from ..sources.state import CameraState
from ..timeutil import utc_timestamp
from .homeassistant import DISCOVERY_QOS, Discovery, Message, Renderer
from .inbound import GuardedClient, check_hook
from .pacing import UNLIMITED, SentAhead, TokenBucket
from .spool import Record, Spool
from .topics import Topics

logger = logging.getLogger(__name__)

#: protocol version used for every connection (see the module docstring for why).
PROTOCOL = mqtt.MQTTv311
STATUS_QOS = 1
#: events and line/zone counts: at least once, whatever `mqtt.qos` says (through the spool when on)
EVENT_QOS = 1
#: at most one "dropped messages" warning per this many seconds; the rest are summed into it.
DROP_LOG_INTERVAL_S = 10.0
#: an error of one kind that persists is logged as a warning again after this many seconds.
ERROR_REPEAT_LOG_S = 300.0
#: the longest part of a stop() timeout kept for the clean disconnect after waiting for delivery.
DISCONNECT_RESERVE_S = 1.0
#: paho numbers unacknowledged messages with 16-bit MQTT packet ids (at most 65535 at once); the
#: margin leaves room for status messages, which bypass the limit.
MAX_QUEUE_LIMIT = 65000
#: how often the spool thread fsyncs and deletes acknowledged segments (see publish/spool.py).
SPOOL_SYNC_INTERVAL_S = 1.0
#: lost connections after the first are summed into one warning per this many seconds.
FLAP_WINDOW_S = 60.0
#: messages unacknowledged this long (or two keep-alive intervals, if longer) are a problem.
ACK_STALL_MIN_S = 30.0
#: a connection the broker closes within this many seconds of accepting it counts as short-lived;
#: SHORT_LIVED_LIMIT of them within FLAP_WINDOW_S make the connection "unstable" (a daemon
#: problem): typically another client with the same client id, which the broker lets take over.
SHORT_LIVED_S = 10.0
SHORT_LIVED_LIMIT = 3
#: reconnect delays vary by this fraction either way (as cameras' do: sources/reader.py), so a
#: fleet behind one broker does not reconnect in step; a connection that lasted SHORT_LIVED_S
#: starts the delays over from reconnect_min_s.
RECONNECT_JITTER = 0.2
_MAX_TOPIC_BYTES = 65535
_MAX_PAYLOAD_BYTES = 268435455


class ErrorKind(enum.Enum):
    """The kinds of error the log de-duplicates separately (health/errorbook.py), and what ends
    each one."""

    CONNECTION = "connection"  # cannot connect, refused, no CONNACK, lost: until a CONNACK
    REFUSED = "refused"  # the inbound guard dropped a connection: until one lasts FLAP_WINDOW_S
    UNSTABLE = "unstable"  # fresh connections closed again and again: the same
    ACK_STALL = "ack_stall"  # connected, but nothing acknowledged: until an acknowledgement
    SPOOL_WRITE = "spool_write"  # a message could not be appended: until one can
    DRAIN = "drain"  # the drain thread failed (spool read, fsync, delete): until a round works
    SPOOL_CLOSE = "spool_close"  # the final fsync at stop failed: holds (nothing follows)
    SPOOL_LOST = "spool_lost"  # messages found unreadable in the spool: an event
    INTERNAL = "internal"  # a bug caught in a callback or in stop(): an event


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


@dataclass(frozen=True)
class _Outgoing:
    topic: str
    payload: bytes | bytearray  # paho hands unacknowledged messages back as it stored them
    qos: int
    retain: bool
    seq: int | None = None  # its record in the spool, when there is one


def _callback(method: Callable[..., None]) -> Callable[..., None]:
    """Wrap a paho callback: an exception escaping one ends paho's network thread, after which
    the daemon would never publish again. It is logged with its traceback and kept in
    stats()["last_error"] instead."""

    @functools.wraps(method)
    def wrapper(self: "MqttPublisher", *args: Any) -> None:
        try:
            method(self, *args)
        except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
            self._internal_error(f"internal error in {method.__name__}: {exc!r}")

    return wrapper


class MqttPublisher:
    """One MQTT connection for the whole daemon; thread-safe (any thread may publish)."""

    def __init__(self, config: MqttConfig, device_id: str, version: str,
                 clock: Callable[[], float] = time.monotonic, discovery: Discovery | None = None,
                 rng: random.Random | None = None):
        _check_config(config)
        self._config = config
        # for rate-limited logs, the acknowledgement check and the drain's pace, not deadlines:
        self._clock = clock
        self._device_id = device_id
        self._version = version
        self.topics = Topics(config.topic_prefix, device_id)
        self.client_id = config.client_id or f"yoloedge-{device_id}"
        self.broker = f"{config.host}:{config.port}"
        self._client: mqtt.Client | None = None
        self._send_lock = threading.RLock()
        self._lock = threading.Condition(threading.Lock())
        # guarded by _lock:
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._pending: dict[int, _Outgoing] = {}  # by mid: handed to paho, not yet acknowledged
        self._queued_bytes = 0  # payload bytes in _outbox and _pending
        self._early_acks: set[int] = set()
        self._in_publish_call = False
        self._ready = False  # connected and replay done: new messages may go straight to paho
        self._connected = False
        self._connack_seen = False  # since the last disconnect: tells "no CONNACK" from "refused"
        self._connects = 0
        self._reconnects = 0
        self._published = 0
        self._delivered = 0
        self._dropped = 0
        self._drops_unlogged = 0
        self._last_drop_log: float | None = None
        self._errors = ErrorBook(ERROR_REPEAT_LOG_S, clock)  # last_error; one warning per kind
        self._lost_logged_at: float | None = None  # when a lost connection was last warned about
        self._flaps = 0  # lost connections since then, not yet reported
        self._flap_reason = ""
        self._connected_at: float | None = None
        self._short_lived: list[float] = []  # when the recent short-lived connections were lost
        self._unstable: str | None = None  # the last_error that reports them (see SHORT_LIVED_S)
        self._connect_quiet = False  # the last loss was not logged: neither is the reconnect
        self._last_ack_at = 0.0
        self._pending_since: dict[int, float] = {}  # mid -> when it was handed to paho
        self._ack_stall: str | None = None  # the last_error that reports missing acks
        self._retained: dict[str, _Outgoing] = {}  # newest retained message per topic (not status)
        self._retained_acked: set[str] = set()  # topics whose newest copy the broker acknowledged
        self._sent_ahead = SentAhead()  # spool records handed over before the drain reached them
        self._pacer = TokenBucket(config.drain_rate, max(1.0, config.drain_rate), clock)
        self._drained = 0  # backlog messages handed over by the drain
        self._superseded = 0  # retained copies skipped: a newer one on the topic went out
        self._backoff = Backoff(config.reconnect_min_s, config.reconnect_max_s,
                                reset_after_s=SHORT_LIVED_S, jitter=RECONNECT_JITTER, rng=rng)
        self._reconnect_delay: float | None = None  # the wait before the current attempt
        self._status: str | None = None
        self._stop_requested = False
        self._closed = False
        self._spool: Spool | None = None
        if config.spool_dir is not None:
            self._spool = Spool(config.spool_dir, config.spool_limit_bytes,
                                fsync_interval_s=SPOOL_SYNC_INTERVAL_S)
        self._drain_thread: threading.Thread | None = None
        self._spool_dropped = 0  # spool drops already counted in _dropped
        self._spool_unreadable = 0  # unreadable spool records already counted in _dropped
        #: Home Assistant discovery. The registry is the daemon's, shared by successive clients
        #: and kept up to date while discovery is off, so a reload can turn it on.
        self._discovery = discovery or Discovery(device_id, version, "")
        self._ha: Renderer | None = None
        if config.homeassistant is not None:
            self._ha = Renderer(config.homeassistant, self.topics, self._discovery)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start connecting in the background and return at once; retries until stop()."""
        with self._send_lock:
            if self._client is not None or self._stop_requested:
                raise RuntimeError("MqttPublisher.start() may be called once, before stop()")
            self._client = self._make_client()
            self._open_spool()
            self._drain_thread = threading.Thread(target=self._drain_loop, name="mqtt-drain",
                                                  daemon=True)
            self._drain_thread.start()
        cfg = self._config
        logger.info("MQTT: connecting to %s as %r (user=%s, password=%s, tls=%s, qos=%d, "
                    "queue_limit=%d, queue_limit_bytes=%d, spool=%s)", self.broker, self.client_id,
                    cfg.username, "***" if cfg.password else None, cfg.tls is not None, cfg.qos,
                    cfg.queue_limit, cfg.queue_limit_bytes, self._spool is not None)
        self._client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        self._client.loop_start()

    def _open_spool(self) -> None:
        """Recover the spool. A spool that cannot be opened (the disk
        failed since the config was checked) must not keep the daemon from publishing: the
        publisher goes on with the in-memory outbox and says so. Caller holds _send_lock."""
        spool = self._spool
        if spool is None:
            return
        try:
            recovered = spool.open()
        except OSError as exc:
            self._spool = None
            self._record_error(ErrorKind.SPOOL_WRITE,
                               f"cannot open the spool {spool.directory}: {exc}; messages are "
                               f"kept in memory only")
            return
        if recovered or spool.discarded_bytes:
            logger.log(logging.WARNING if spool.discarded_bytes else logging.INFO,
                       "MQTT: spool %s: %d message(s) from the previous run to send%s",
                       spool.directory, recovered,
                       f"; {spool.discarded_bytes} byte(s) of torn or corrupt records moved aside"
                       if spool.discarded_bytes else "")

    def _make_client(self) -> mqtt.Client:
        """Build the paho client: credentials, TLS, Last Will, back-off and our callbacks."""
        cfg = self._config
        check_hook()
        client = GuardedClient(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                               clean_session=True, protocol=PROTOCOL)
        if cfg.username is not None:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls is not None:
            client.tls_set_context(client_context(cfg.tls))  # the context `yoloedge check` loaded
        client.will_set(self.topics.status, self._status_payload("offline"), qos=STATUS_QOS,
                        retain=True)
        # the first wait; each failure sets the next one (_schedule_reconnect)
        client.reconnect_delay_set(cfg.reconnect_min_s, cfg.reconnect_max_s)  # type: ignore[arg-type]
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        return client

    def stop(self, timeout_s: float, final_status: str | None = "stopped") -> None:
        """Publish `final_status`, wait (at most `timeout_s` in all) until everything queued is
        acknowledged, then disconnect cleanly so the broker does NOT publish the Last Will.
        Safe to call more than once, and before start(). Never raises: the daemon stops or
        replaces the client next, and a failure here (a spool whose final fsync fails) must not
        keep it from that; the failure is logged and kept in stats()["last_error"]."""
        try:
            self._stop(timeout_s, final_status)
        except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
            self._internal_error(f"stopping the client failed: {exc}")

    def _stop(self, timeout_s: float, final_status: str | None) -> None:
        with self._send_lock:
            if self._stop_requested:
                return
            self._stop_requested = True
        deadline = time.monotonic() + max(0.0, timeout_s)
        if final_status is not None:
            self.set_status(final_status)
        with self._lock:
            self._lock.notify_all()  # without a spool the drain goes unpaced now
        if self._client is None:
            with self._send_lock:
                self._closed = True
            return
        self._wait_drained(deadline - min(DISCONNECT_RESERVE_S, max(0.0, timeout_s) / 4))
        with self._send_lock:
            self._closed = True
        self._shutdown_client(self._client, deadline)
        self._close_drain(deadline)
        self._log_stop_summary()

    def _close_drain(self, deadline: float) -> None:
        """Stop the drain thread (it sees _closed) and fsync what is left for the next start."""
        with self._lock:
            self._lock.notify_all()
        if self._drain_thread is not None:
            self._drain_thread.join(max(0.0, deadline - time.monotonic()))
        spool = self._spool
        if spool is not None:
            try:
                spool.close()  # releases its files and directory lock even when this raises
            except OSError as exc:
                self._record_error(ErrorKind.SPOOL_CLOSE,
                                   f"closing the spool {spool.directory} failed: {exc}; the "
                                   f"messages spooled last may not survive a power cut")

    def _wait_drained(self, deadline: float) -> bool:
        """Block until nothing is queued or unacknowledged, or until `deadline` (monotonic)."""
        with self._lock:
            while self._outbox or self._pending or (self._spool is not None and self._spool.unacked):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def _shutdown_client(self, client: mqtt.Client, deadline: float) -> None:
        """Disconnect and stop paho's thread without overrunning `deadline`.

        paho's loop_stop() joins its thread with no timeout, and that thread sleeps up to 1 s at a
        time between reconnect attempts, so it is joined from a helper thread with what is left.
        """
        client.disconnect()
        stopper = threading.Thread(target=client.loop_stop, name="mqtt-loop-stop", daemon=True)
        stopper.start()
        stopper.join(max(0.0, deadline - time.monotonic()))
        if stopper.is_alive():
            # Not connected: the thread only has a back-off sleep to finish, nothing to lose.
            level = logging.WARNING if client.is_connected() else logging.DEBUG
            logger.log(level, "MQTT: network thread still stopping after the stop timeout")
            return
        if client.is_connected():
            # a reconnect raced with disconnect(): say goodbye properly so no Will is sent
            client.disconnect()

    def _log_stop_summary(self) -> None:
        """Say what was lost, so a shutdown with the broker away is never silent."""
        with self._lock:
            unsent = self._queued_locked()
            unlogged, self._drops_unlogged = self._drops_unlogged, 0
            dropped = self._dropped
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
            while not self._ready:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    # ------------------------------------------------------------------ publishing API

    def set_status(self, state: str) -> bool:
        """Publish the device status (retained, QoS 1) and remember it for reconnects."""
        with self._send_lock:
            self._status = state
            return self._submit(self._status_message(state), bypass_limit=True)

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

    def count_objects(self, camera: str, labels: Sequence[str]) -> None:
        """Home Assistant: the labels of one frame's detections as published (the pipeline's
        Home Assistant sink calls it for every frame whose detections message goes out)."""
        if self._ha is not None:
            self._count_objects(self._ha, camera, labels)

    def objects_state(self, camera: str, state: CameraState) -> None:
        """Home Assistant: `camera` changed state; one that stops streaming sees nothing now."""
        if state is CameraState.STREAMING:
            self._discovery.resume_counts(camera)
        elif self._ha is not None:
            zeros = self._ha.discovery.clear_counts(camera, self._clock())  # nothing in view now
            if zeros is not None:
                self._publish_discovery([self._ha.objects(camera, zeros)])

    def clear_camera(self, camera: str) -> bool:
        """Delete the retained state of a removed camera (an empty retained message), and its
        Home Assistant entities (empty retained configs)."""
        counters = self._discovery.counters(camera)
        labels = self._discovery.remove_camera(camera)
        if self._ha is not None and labels is not None:
            self._publish_discovery(self._ha.removals(camera, labels, whole_camera=True, counters=counters),
                                    removal=True)
        return self.publish(self.topics.camera_state(camera), b"", retain=True)

    def announce_camera(self, camera: str, classes: Sequence[str] | None,
                        zones: Sequence[str] = (), lines: Sequence[str] = ()) -> None:
        """Register `camera` for Home Assistant discovery (again, after its settings changed):
        its configs, and removals for the label sensors its new `classes` no longer list and for
        the zones and lines it no longer has."""
        gone = self._discovery.set_camera(camera, classes)
        gone_zones, gone_lines = self._discovery.set_counters(camera, zones, lines)
        if self._ha is None:
            return
        if gone:
            self._publish_discovery(self._ha.removals(camera, gone, whole_camera=False),
                                    removal=True)
        if gone_zones or gone_lines:
            self._publish_discovery(self._ha.counter_removals(camera, gone_zones, gone_lines), removal=True)
        self._publish_discovery(self._ha.configs(camera, self._ha.discovery.labels(camera) or []))

    def _count_objects(self, ha: Renderer, camera: str, labels: Sequence[str]) -> None:
        """The objects-in-view counts from the message as published; a label seen for the first
        time (a camera without `classes`) gets its sensor first."""
        new, counts = ha.discovery.count(camera, labels, self._clock())
        out = ha.label_configs(camera, new) if new else []
        if counts is not None:
            out.append(ha.objects(camera, counts))
        if out:
            self._publish_discovery(out)

    def _publish_discovery(self, messages: list[Message], removal: bool = False) -> None:
        """Hand discovery messages to paho while connected (see the module docstring); while
        not, keep only removals: the next connect publishes the current configs and counts."""
        with self._send_lock:
            with self._lock:
                skip = self._closed or (not self._ready and not removal)
            if skip:
                return
            for m in messages:
                self._submit(_Outgoing(m.topic, m.payload, DISCOVERY_QOS, True), bypass_limit=True)

    def _announce_all(self, messages: list[Message]) -> None:
        """Every discovery config and the last counts (`Renderer.everything()`), after a
        (re)connect. Caller holds _send_lock, after the replay."""
        if messages:
            self._publish_discovery(messages)

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
        return self._submit(_Outgoing(topic, data, qos, retain))

    def _submit(self, msg: _Outgoing, bypass_limit: bool = False) -> bool:
        """Send now when connected, else keep in the outbox (QoS >= 1), within the queue limits;
        with a spool, QoS >= 1 messages go through it (see the module docstring)."""
        with self._send_lock:
            if self._closed:
                self._note_drop("the publisher is stopped")
                return False
            if (msg.qos > 0 and not bypass_limit and self._spool is not None
                    and self._drain_thread is not None):
                if self._spool_submit(msg):
                    return True
            limited = msg.qos > 0 and not bypass_limit
            with self._lock:
                ready = self._ready
                made_room = self._make_room_locked(len(msg.payload)) if ready and limited else 0
                full = self._full_reason_locked(len(msg.payload))
                if (full is None or not limited) and (ready or msg.qos > 0):
                    self._note_retained_locked(msg)
            if made_room:
                self._note_drop("queue full while the backlog drains: the oldest waiting "
                                "message(s) made room for a new one", count=made_room)
            if full is not None and limited:
                self._note_drop(full)
                return False
            if not ready:
                return self._keep(msg)
            if not self._send(msg):
                return False
            with self._lock:
                self._published += 1
            return True

    def _make_room_locked(self, size: int) -> int:
        """While connected, a new message that does not fit takes the place of the oldest ones
        waiting in the outbox (see "Bounded" in the module docstring); returns how many were
        dropped. Caller holds _send_lock and _lock."""
        dropped = 0
        if size > self._config.queue_limit_bytes:
            return 0  # it would not fit in an empty queue either
        while self._outbox and self._full_reason_locked(size) is not None:
            old = self._outbox.popleft()
            self._queued_bytes -= len(old.payload)
            dropped += 1
        return dropped

    def _note_retained_locked(self, msg: _Outgoing) -> None:
        """Remember the newest retained message of each topic: older copies still waiting are
        skipped, and at a reconnect this one goes out at once (see the module docstring). The
        status is not among them: it is re-published from `_status` instead."""
        if msg.retain and msg.topic != self.topics.status:
            self._retained[msg.topic] = msg
            self._retained_acked.discard(msg.topic)

    def _is_newest_locked(self, msg: _Outgoing) -> bool:
        """`msg` is the newest retained message of its topic (the same object in memory, or the
        same spool record)."""
        newest = self._retained.get(msg.topic)
        return newest is not None and (newest is msg or (newest.seq is not None
                                                         and newest.seq == msg.seq))

    def _superseded_locked(self, topic: str, retain: bool, seq: int | None,
                           msg: _Outgoing | None = None) -> bool:
        """A retained message waiting in the backlog that a newer one on its topic replaced."""
        if not retain or topic not in self._retained:
            return False
        if msg is not None:
            return not self._is_newest_locked(msg)
        return self._retained[topic].seq != seq

    def _full_reason_locked(self, size: int) -> str | None:
        """Why one more message of `size` payload bytes does not fit in memory, or None."""
        cfg = self._config
        if len(self._outbox) + len(self._pending) >= cfg.queue_limit:
            return f"queue full ({cfg.queue_limit} messages waiting)"
        if size > cfg.queue_limit_bytes:
            return f"a {size}-byte message is larger than queue_limit_bytes ({cfg.queue_limit_bytes})"
        if self._queued_bytes + size > cfg.queue_limit_bytes:
            return f"queue full ({self._queued_bytes} of {cfg.queue_limit_bytes} bytes waiting)"
        return None

    def _keep(self, msg: _Outgoing) -> bool:
        """Hold a message for the next connection; QoS 0 means "don't bother", so it is dropped."""
        if msg.qos == 0:
            self._note_drop("not connected (QoS 0 messages are not queued)")
            return False
        with self._lock:
            self._outbox.append(msg)
            self._queued_bytes += len(msg.payload)
            self._published += 1
        return True

    def _spool_submit(self, msg: _Outgoing) -> bool:
        """Append to the spool, and while connected hand over at once when memory allows (ahead
        of an older backlog, if one drains); else the drain thread hands it over later, in
        order. False (caller falls back to memory) when the spool cannot be written. Caller holds
        _send_lock."""
        spool = self._spool
        if spool is None:
            return False
        try:
            seq = spool.append(Record(msg.topic, bytes(msg.payload), msg.qos, msg.retain))
        except OSError as exc:
            self._record_error(ErrorKind.SPOOL_WRITE,
                               f"cannot write to the spool {spool.directory}: {exc}; "
                               f"messages are kept in memory meanwhile")
            return False
        if self._errors.resolve(ErrorKind.SPOOL_WRITE):
            logger.info("MQTT: the spool %s takes messages again", spool.directory)
        msg = dataclasses.replace(msg, seq=seq)
        with self._lock:
            self._published += 1
            self._note_retained_locked(msg)
            direct = self._ready and self._full_reason_locked(len(msg.payload)) is None
        self._count_spool_drops(spool)
        if direct:
            if not spool.take(seq):  # an older backlog is draining: this one goes ahead of it
                with self._lock:
                    self._sent_ahead.add(seq)
            self._send(msg)
        else:
            with self._lock:
                self._lock.notify_all()  # the drain thread hands it over when it can
        return True

    def _count_spool_drops(self, spool: Spool) -> None:
        dropped, unreadable = spool.dropped, spool.unreadable
        with self._lock:
            new, self._spool_dropped = dropped - self._spool_dropped, dropped
            lost, self._spool_unreadable = unreadable - self._spool_unreadable, unreadable
        if new:
            self._note_drop(f"spool full ({self._config.spool_limit_bytes} bytes); its oldest "
                            f"messages were deleted", count=new)
        if lost:
            self._record_error(ErrorKind.SPOOL_LOST,
                               f"spool {spool.directory}: {lost} message(s) could not be read "
                               f"back (its files were deleted, truncated or unreadable) and are "
                               f"dropped; the spool goes on", active=False)
            self._note_drop("unreadable in the spool", count=lost)

    def _send(self, msg: _Outgoing, from_outbox: bool = False) -> bool:
        """Hand one message to paho (caller holds _send_lock) and start tracking its mid.

        An acknowledgement can arrive (in paho's thread) before client.publish() returns here;
        such early acks are collected while the call runs (and until the mid is recorded, in the
        same critical section), so the mid is not tracked forever.
        """
        client = self._client
        if client is None:
            raise RuntimeError("_send before start()")
        with self._lock:
            self._in_publish_call = True
            self._early_acks.clear()
        try:
            info = client.publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain)
        except BaseException:
            with self._lock:
                self._in_publish_call = False
            raise
        rc = info.rc
        accepted = rc == MQTTErrorCode.MQTT_ERR_SUCCESS or (
            rc == MQTTErrorCode.MQTT_ERR_NO_CONN and msg.qos > 0)  # paho keeps it for reconnect
        with self._lock:
            self._in_publish_call = False
            if from_outbox:
                self._outbox.popleft()
                self._queued_bytes -= len(msg.payload)
            done = not accepted or info.mid in self._early_acks
            if msg.qos > 0 and not done:
                self._pending[info.mid] = msg
                self._pending_since[info.mid] = self._clock()
                self._queued_bytes += len(msg.payload)
            if done and msg.seq is not None and self._spool is not None:
                self._spool.ack(msg.seq)  # acknowledged already, or refused (counted as dropped)
            if done and accepted and msg.retain and self._is_newest_locked(msg):
                self._retained_acked.add(msg.topic)
            self._early_acks.clear()
            self._lock.notify_all()
        if not accepted:
            self._note_drop(f"the MQTT client refused it ({mqtt.error_string(rc)})")
        return accepted

    def _note_drop(self, reason: str, count: int = 1) -> None:
        """Count dropped messages; warn at most once per DROP_LOG_INTERVAL_S with the sum."""
        now = self._clock()
        with self._lock:
            self._dropped += count
            self._drops_unlogged += count
            if self._last_drop_log is not None and now - self._last_drop_log < DROP_LOG_INTERVAL_S:
                return
            self._last_drop_log = now
            count, self._drops_unlogged = self._drops_unlogged, 0
            total = self._dropped
        logger.warning("MQTT: dropped %d message(s): %s (%d dropped in total; broker %s)",
                       count, reason, total, self.broker)

    def _status_payload(self, state: str) -> bytes:
        return encode_payload({"state": state, "device_id": self._device_id,
                               "version": self._version, "ts": utc_timestamp()})

    def _status_message(self, state: str) -> _Outgoing:
        return _Outgoing(self.topics.status, self._status_payload(state), STATUS_QOS, True)

    # ------------------------------------------------------------------ stats

    def _queued_locked(self) -> int:
        """Messages waiting or not yet acknowledged; spooled ones counted once (caller holds _lock)."""
        if self._spool is None:
            return len(self._outbox) + len(self._pending)
        unspooled = sum(1 for m in self._pending.values() if m.seq is None)
        return len(self._outbox) + unspooled + self._spool.unacked

    def _backlog_locked(self) -> int:
        """Messages waiting to be handed to the broker: queued, less those in flight while
        connected (caller holds _lock)."""
        queued = self._queued_locked()
        return max(0, queued - len(self._pending)) if self._connected else queued

    def ack_stall_s(self) -> float:
        """How long sent messages may wait for their first acknowledgement: a broker is slow to
        acknowledge under load, but not for two keep-alive intervals."""
        return max(ACK_STALL_MIN_S, 2.0 * self._config.keepalive_s)

    def _check_acks(self) -> None:
        """Report a connection on which sent messages get no acknowledgement (see the module
        docstring); the message counts the waiting messages and the seconds since the oldest
        was sent or the last acknowledgement came, whichever is later."""
        with self._lock:
            if not self._connected or not self._pending_since:
                return
            oldest = next(iter(self._pending_since.values()))  # dicts keep insertion order
            waited = self._clock() - max(oldest, self._last_ack_at)
            if waited < self.ack_stall_s():
                return
            waiting, first = len(self._pending_since), self._ack_stall is None
            self._ack_stall = stall = (f"the broker {self.broker} has not acknowledged {waiting} "
                                       f"message(s) for {waited:.0f} s; it is connected but may "
                                       f"be overloaded or broken")
        if first:
            self._record_error(ErrorKind.ACK_STALL, stall)
        else:  # the same stall, older: said when it began
            self._errors.update(ErrorKind.ACK_STALL, stall)

    def stats(self) -> dict:
        """Counters for the daemon's status: queued = waiting or not yet acknowledged (in memory
        or in the spool); queued_bytes = payload bytes of those held in memory; ack_stalled =
        connected, but the broker does not acknowledge (see `_check_acks`)."""
        self._check_acks()
        self._check_stable()
        with self._lock:
            return {
                "connected": self._connected,
                "queued": self._queued_locked(),
                "queued_bytes": self._queued_bytes,
                "spooled": self._spool.unacked if self._spool is not None else None,
                "delivered": self._delivered,
                "dropped": self._dropped,
                "published": self._published,
                "reconnects": self._reconnects,
                "reconnect_delay_s": None if self._connected else self._reconnect_delay,
                "backlog": self._backlog_locked(),
                "drained": self._drained,
                "superseded": self._superseded,
                "drain_rate": self._config.drain_rate,
                **self._errors.status(),
                "ack_stalled": self._ack_stall is not None,
                "unstable": self._unstable is not None,
                "broker": self.broker,
            }

    # ------------------------------------------------------------------ paho callbacks

    @_callback
    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        """CONNACK: on success send the state at once and let the backlog follow at its pace
        (see the module docstring); on refusal report the broker's reason."""
        with self._lock:
            self._connack_seen = True
        if reason_code.is_failure:
            self._record_error(ErrorKind.CONNECTION,
                               f"connection refused by {self.broker}: {reason_code} "
                               f"(reason code {reason_code.value}); retrying")
            return
        announce = self._ha.everything() if self._ha is not None else []
        with self._send_lock:
            with self._lock:
                self._connected = True
                self._errors.resolve(ErrorKind.CONNECTION)  # the next problem is news again
                if self._connects:
                    self._reconnects += 1
                self._connects += 1
                self._connected_at = self._clock()
            state = self._replay(client, {m.topic for m in announce})
            with self._lock:
                self._ready = True
                self._last_ack_at = self._clock()  # acknowledgements are awaited from now on
                quiet, self._connect_quiet = self._connect_quiet, False
                waiting = self._backlog_locked()
                self._lock.notify_all()  # the drain thread hands over the backlog
            self._announce_all(announce)
        logger.log(logging.DEBUG if quiet else logging.INFO, "MQTT: connected to %s%s",
                   self.broker, self._connect_summary(state, waiting))

    def _connect_summary(self, state: int, waiting: int) -> str:
        """What a connect line says about the messages that waited for it."""
        if not waiting:
            return f", sent {state} retained message(s) of state" if state > 1 else ""
        pace = (f"at up to {self._config.drain_rate:g} a second" if not self._pacer.unlimited
                else "as fast as the broker takes them")
        return (f", sent {state} retained message(s) of state; {waiting} waiting message(s) "
                f"follow {pace}")

    def _replay(self, client: mqtt.Client, fresh_topics: set[str]) -> int:
        """Take paho's unacknowledged messages back to the front of the backlog, then hand over
        at once the current status and the newest waiting copy of every retained topic, and
        skip the older ones (and those of `fresh_topics`, which the caller publishes anew).
        Returns how many went out. Caller holds _send_lock.

        The unacknowledged messages are moved to the front of the outbox in one step, so stats()
        and stop() never see them missing, and their old mids cannot be confused with new ones.
        Spooled ones are not: the spool is rewound to the oldest of them instead, and the drain
        sends them again from there, before anything the spool got later.
        """
        unacked = client.drop_out_messages()
        rewind_to: int | None = None
        with self._lock:
            back = []
            for m in unacked:
                sent = self._pending.pop(m.mid, None)
                self._pending_since.pop(m.mid, None)
                if sent is not None:
                    self._queued_bytes -= len(sent.payload)
                if sent is not None and sent.seq is not None:
                    rewind_to = sent.seq if rewind_to is None else min(rewind_to, sent.seq)
                else:
                    back.append(sent or _Outgoing(m.topic, m.payload, m.qos, m.retain))
            self._outbox.extendleft(reversed(back))
            self._queued_bytes += sum(len(m.payload) for m in back)
            self._sent_ahead.clear()  # what went ahead and is not acknowledged goes again
            state = self._state_to_send_locked(fresh_topics)
            if self._status is not None and not self._closed:
                state.insert(0, self._status_message(self._status))
                self._published += 1
        if rewind_to is not None and self._spool is not None:
            self._spool.rewind(rewind_to)
        for msg in state:
            self._send(msg)
        return len(state)

    def _state_to_send_locked(self, fresh_topics: set[str]) -> list[_Outgoing]:
        """Take the status and every retained message out of the outbox: the newest copy of each
        topic is returned, to go out at once; older ones (and the status, re-published from
        `_status`) are skipped, counted in `superseded`. The newest copy of a topic that waits
        in the spool is returned too, and noted as sent ahead. Caller holds _send_lock and
        _lock."""
        state: list[_Outgoing] = []
        kept: collections.deque[_Outgoing] = collections.deque()
        for msg in self._outbox:
            if msg.topic == self.topics.status or msg.retain:
                self._queued_bytes -= len(msg.payload)
                if (msg.topic != self.topics.status and self._is_newest_locked(msg)
                        and msg.topic not in fresh_topics):
                    state.append(msg)
                else:
                    self._superseded += 1
            else:
                kept.append(msg)
        self._outbox = kept
        for topic, newest in self._retained.items():
            if (newest.seq is not None and topic not in self._retained_acked
                    and topic not in fresh_topics):
                state.append(newest)
                self._sent_ahead.add(newest.seq)
        return state

    @_callback
    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        """A (re)connect attempt failed before any CONNACK: unreachable, refused, TLS error.
        paho calls this inside its `except OSError`, so the exception is still at hand."""
        exc = sys.exc_info()[1]
        with self._lock:
            closing = self._closed
        if closing:  # an attempt that was under way when stop() began: no news
            logger.debug("MQTT: connection attempt during stop failed: %r", exc)
            return
        self._schedule_reconnect(client, None)
        self._record_error(ErrorKind.CONNECTION,
                           f"cannot connect to {self.broker}: {exc!r}{self._tls_hint(exc)}; "
                           f"retrying")

    def _tls_hint(self, exc: BaseException | None) -> str:
        """A TLS handshake with a port that speaks MQTT in clear fails as an SSL error, or the
        broker resets the connection: say what is the likely cause, not only the symptom."""
        if self._config.tls is None:
            return ""
        if isinstance(exc, (ssl.SSLError, ConnectionResetError, ConnectionAbortedError,
                            BrokenPipeError)):
            return (f" (is port {self._config.port} a TLS port? the broker may not speak TLS "
                    f"there)")
        return ""

    @_callback
    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        """Connection gone: new messages go to the outbox until the next CONNACK. Gone before
        any CONNACK is the "not an MQTT broker" class (see the module docstring); dropped by the
        inbound guard, its reason (publish/inbound.py)."""
        refusal = client.take_refusal() if isinstance(client, GuardedClient) else None
        with self._lock:
            was_connected = self._connected
            connack_seen, self._connack_seen = self._connack_seen, False
            self._connected = False
            self._ready = False
            self._ack_stall = None  # "not connected" is the problem now
            closing = self._closed
            lasted = (self._clock() - self._connected_at
                      if was_connected and self._connected_at is not None else None)
            self._errors.resolve(ErrorKind.ACK_STALL)
            self._lock.notify_all()
        if closing:
            logger.debug("MQTT: disconnected from %s (%s)", self.broker, reason_code)
            return
        self._schedule_reconnect(client, lasted)
        if refusal is not None:
            self._record_error(ErrorKind.REFUSED,
                               f"broker {self.broker} {refusal}; disconnected, reconnecting")
        elif was_connected:
            self._connection_lost(str(reason_code))
        elif not connack_seen:  # a refusal (a CONNACK) was reported by _on_connect already
            self._record_error(ErrorKind.CONNECTION, self._no_connack_error(str(reason_code)))

    def _schedule_reconnect(self, client: mqtt.Client, lasted: float | None) -> None:
        """Set paho's wait before its next attempt from the shared back-off rule, with jitter
        (see the module docstring); `lasted`: how long the connection that just ended had been
        up, None when there was none. paho calls the failure callbacks before it waits."""
        with self._lock:
            delay = self._backoff.next_delay(lasted)
            self._reconnect_delay = delay
        client.reconnect_delay_set(delay, delay)  # type: ignore[arg-type]
        logger.debug("MQTT: next connection attempt to %s in %.2f s", self.broker, delay)

    def _connection_lost(self, reason: str) -> None:
        """Warn about the first lost connection; within FLAP_WINDOW_S after that, count the
        losses and warn with their sum at most once per FLAP_WINDOW_S (see the module docstring)."""
        message = f"connection to {self.broker} lost: {reason}; reconnecting"
        now = self._clock()
        summary = None
        with self._lock:
            quiet = (self._lost_logged_at is not None
                     and now - self._lost_logged_at < FLAP_WINDOW_S)
            if quiet:
                self._flaps += 1
                self._flap_reason = reason
                self._connect_quiet = True
            else:
                if self._flaps and self._lost_logged_at is not None:
                    summary = (f"reconnected {self._flaps} time(s) in the last "
                               f"{now - self._lost_logged_at:.0f} s; last reason: {self._flap_reason}")
                self._lost_logged_at, self._flaps = now, 0
        self._errors.update(ErrorKind.CONNECTION, message, warned=not quiet)
        self._note_short_lived(now)  # after: "unstable", when it is, is the latest error
        if quiet:
            logger.debug("MQTT: %s", message)
        elif summary is not None:
            logger.warning("MQTT: connection to %s is unstable: %s; lost again: %s", self.broker,
                           summary, reason)
        else:
            logger.warning("MQTT: %s", message)

    def _note_short_lived(self, now: float) -> None:
        """Report "unstable" when the broker keeps closing connections it just accepted. Ended by
        `_check_stable` once a connection lasts."""
        with self._lock:
            if self._connected_at is None or now - self._connected_at > SHORT_LIVED_S:
                return
            self._short_lived = [t for t in self._short_lived if now - t <= FLAP_WINDOW_S] + [now]
            if len(self._short_lived) < SHORT_LIVED_LIMIT:
                return
            self._unstable = unstable = (
                f"the broker {self.broker} closed the connection {len(self._short_lived)} times "
                f"within {SHORT_LIVED_S:g} s of accepting it: is another client connected with "
                f"client id {self.client_id!r} (two daemons with the same device_id)?")
        self._record_error(ErrorKind.UNSTABLE, unstable)

    def _check_stable(self) -> None:
        """A connection that lasted FLAP_WINDOW_S ends the "unstable" report, and a refusal by
        the inbound guard: that broker behaves now."""
        with self._lock:
            if not (self._connected and self._connected_at is not None
                    and self._clock() - self._connected_at > FLAP_WINDOW_S):
                return
            self._unstable, self._short_lived = None, []
        self._errors.resolve(ErrorKind.UNSTABLE)
        self._errors.resolve(ErrorKind.REFUSED)

    def _no_connack_error(self, reason: str) -> str:
        """The message is the same on every retry, so _record_error warns once per outage."""
        where = f"broker at {self.broker}"
        hint = "(is it an MQTT broker? a TLS port without tls:?); retrying"
        if reason == "Keep alive timeout":  # paho's CONNACK deadline is the keep-alive interval
            return (f"{where} accepted the connection but sent no MQTT CONNACK within "
                    f"{self._config.keepalive_s} s {hint}")
        if reason == "Protocol error":
            return f"{where} answered with something that is not MQTT {hint}"
        return f"{where} closed the connection without sending an MQTT CONNACK {hint}"

    @_callback
    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        """Broker acknowledged (QoS >= 1) or paho wrote (QoS 0) message `mid`."""
        with self._lock:
            sent = self._pending.pop(mid, None)
            self._pending_since.pop(mid, None)
            self._last_ack_at = self._clock()
            resumed, self._ack_stall = self._ack_stall, None
            if sent is not None:
                self._queued_bytes -= len(sent.payload)
                if sent.seq is not None and self._spool is not None:
                    self._spool.ack(sent.seq)  # before notify: stop() waits for the spool too
                if sent.retain and self._is_newest_locked(sent):
                    self._retained_acked.add(sent.topic)
            elif self._in_publish_call:
                self._early_acks.add(mid)
            self._delivered += 1
            self._lock.notify_all()
        if resumed is not None:
            self._errors.resolve(ErrorKind.ACK_STALL)
            logger.info("MQTT: %s acknowledges messages again", self.broker)

    # ------------------------------------------------------------------ drain thread

    def _drain_loop(self) -> None:
        """Hand the backlog to paho at the drain's pace as room frees up, and sync the spool
        about once a second, until stop(). An error is reported, never the end of the thread: a
        thread that died would leave every later message on disk only. A drain that took nothing
        waits like an idle one: records the spool counts but cannot read back (a file damaged on
        disk) would otherwise make it spin at full CPU."""
        spool = self._spool
        progress = True
        while True:
            with self._lock:
                if self._closed:
                    return
                wait = self._drain_wait_locked(progress)
                if wait > 0:
                    self._lock.wait(wait)  # woken by connect, ack, append, stop
            progress = False
            try:
                progress = self._drain() > 0
                if spool is not None:
                    spool.sync()
                if self._errors.resolve(ErrorKind.DRAIN):
                    logger.info("MQTT: the backlog is handed over again%s",
                                f" (spool {spool.directory})" if spool is not None else "")
            except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
                self._drain_failed(exc)
                time.sleep(SPOOL_SYNC_INTERVAL_S)
            if spool is not None:
                self._count_spool_drops(spool)

    def _drain_wait_locked(self, progress: bool) -> float:
        """How long the drain thread waits before its next round (caller holds _lock): the
        spool's sync interval when there is nothing to do (or the last round took nothing),
        else until the pace allows its next step."""
        if not (progress and self._ready and self._backlog_due_locked()):
            return SPOOL_SYNC_INTERVAL_S
        if self._unpaced_locked():
            return 0.0
        return min(SPOOL_SYNC_INTERVAL_S, self._pacer.wait_s(self._pacer.step()))

    def _backlog_due_locked(self) -> bool:
        """Something waits that the drain could hand over now (caller holds _lock)."""
        if self._outbox:
            return True
        spool = self._spool
        return spool is not None and spool.has_unsent and self._full_reason_locked(0) is None

    def _unpaced_locked(self) -> bool:
        """No pace: `drain_rate` 0, or stopping without a spool (what is not sent is lost)."""
        return self._pacer.unlimited or (self._stop_requested and self._spool is None)

    def _drain_failed(self, exc: Exception) -> None:
        """Report a failure of the drain thread: a warning (with its traceback unless it is the
        disk's or the directory's fault) the first time, then (a disk that stays broken fails
        every second) at debug level and in one warning per ERROR_REPEAT_LOG_S."""
        spool = self._spool
        message = (f"spool {spool.directory}: {exc}" if spool is not None
                   else f"handing the backlog over failed: {exc!r}")
        warn = self._errors.report(ErrorKind.DRAIN, message)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.warning("MQTT: %s%s", message, warn.suffix(),
                           exc_info=None if isinstance(exc, OSError) else exc)

    def _drain(self) -> int:
        """One round: as many backlog messages as the pace allows, the outbox first, then the
        spool. Returns how many were taken from the backlog (handed over or skipped)."""
        with self._send_lock:
            with self._lock:
                if not self._ready or self._closed:
                    return 0
                budget = UNLIMITED if self._unpaced_locked() else self._pacer.available()
            if budget <= 0:
                return 0
            taken, sent = self._drain_outbox(budget)
            spool = self._spool
            if spool is not None and sent < budget:
                more_taken, more_sent = self._drain_spool(spool, budget - sent)
                taken, sent = taken + more_taken, sent + more_sent
            with self._lock:
                self._pacer.take(sent)
                self._drained += sent
            return taken

    def _drain_outbox(self, budget: int) -> tuple[int, int]:
        """Up to `budget` messages from the front of the outbox, in order; retained copies a
        newer one replaced are skipped. Returns (taken, handed over). Caller holds _send_lock."""
        taken = sent = 0
        while sent < budget:
            with self._lock:
                if not self._outbox or not self._ready:
                    break
                msg = self._outbox[0]
                if self._superseded_locked(msg.topic, msg.retain, msg.seq, msg):
                    self._outbox.popleft()
                    self._queued_bytes -= len(msg.payload)
                    self._superseded += 1
                    taken += 1
                    continue
            self._send(msg, from_outbox=True)
            taken, sent = taken + 1, sent + 1
        return taken, sent

    def _drain_spool(self, spool: Spool, budget: int) -> tuple[int, int]:
        """Up to `budget` records the spool holds beyond its cursor, within the in-memory
        limits; records sent ahead of the drain, and retained copies a newer one replaced, are
        skipped (the latter acknowledged in the spool: they will never be sent). Returns
        (taken, handed over). Caller holds _send_lock."""
        with self._lock:
            room = self._config.queue_limit - len(self._outbox) - len(self._pending)
            room_bytes = self._config.queue_limit_bytes - self._queued_bytes
        if room <= 0 or room_bytes <= 0:
            return 0, 0
        sent = 0
        records = spool.read(min(room, budget), room_bytes)
        for seq, rec in records:
            with self._lock:
                if self._sent_ahead.passed(seq):
                    continue
                if self._superseded_locked(rec.topic, rec.retain, seq):
                    self._superseded += 1
                    spool.ack(seq)
                    continue
            self._send(_Outgoing(rec.topic, rec.payload, rec.qos, rec.retain, seq))
            sent += 1
        return len(records), sent

    def _record_error(self, kind: ErrorKind, message: str, active: bool = True) -> None:
        """Keep the error for stats(); warn when its kind is news (the first of its kind, or
        the first since that kind was resolved) and again every ERROR_REPEAT_LOG_S while it
        persists, with the count of the repeats in between: a long outage stays visible without
        a warning per retry, and two errors that alternate do not defeat that."""
        warn = self._errors.report(kind, message, active=active)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.warning("MQTT: %s%s", message, warn.suffix())

    def _internal_error(self, message: str) -> None:
        """A bug caught (call it in the `except` block): logged with its traceback like any
        error kind, once and then once per ERROR_REPEAT_LOG_S, so a callback that fails on
        every packet cannot flood the journal."""
        warn = self._errors.report(ErrorKind.INTERNAL, message, active=False)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.exception("MQTT: %s%s", message, warn.suffix())


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
