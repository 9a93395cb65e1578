"""paho's callbacks for the MQTT client: CONNACK, a failed attempt, a lost connection, an
acknowledgement (publish/mqtt.py has the design: "Ordering", "No CONNACK", "Flapping").

Why its own class: what paho reports from its network thread is turned into events of the link
(link_health.py), the outbox (outbox.py) and the diagnostics (diagnostics.py); the client itself
(mqtt.py) keeps its lifecycle and its publishing API. Each callback is wrapped so an exception
cannot end paho's network thread.

Locks: the client's, as in mqtt.py: `send_lock` around the replay and the announcement on a
CONNACK, `lock` (a Condition, a leaf) for the link's state and the outbox's counters, never held
while calling into paho.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any, Callable

import paho.mqtt.client as mqtt

from .diagnostics import Diagnostics, ErrorKind
from .drain import Drain
from .homeassistant import Message, Renderer
from .inbound import GuardedClient
from .link_health import LinkMonitor
from .outbox import Outbox

logger = logging.getLogger("yoloedge.publish.mqtt")


def _callback(method: Callable[..., None]) -> Callable[..., None]:
    """Wrap a paho callback: an exception escaping one ends paho's network thread, after which
    the daemon would never publish again. It is logged with its traceback and kept in
    stats()["last_error"] instead."""

    @functools.wraps(method)
    def wrapper(self: "PahoCallbacks", *args: Any) -> None:
        try:
            method(self, *args)
        except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
            self._diag.internal(f"internal error in {method.__name__}: {exc!r}")

    return wrapper


class PahoCallbacks:
    """The client's callbacks, set on its paho client by `attach`."""

    def __init__(self, broker: str, send_lock: threading.RLock, lock: threading.Condition,
                 outbox: Outbox, drain: Drain, link: LinkMonitor, diagnostics: Diagnostics,
                 homeassistant: Renderer | None,
                 publish_discovery: Callable[[list[Message]], None]):
        self.broker = broker
        self._send_lock = send_lock
        self._lock = lock
        self._out = outbox
        self._drain = drain
        self._link = link
        self._diag = diagnostics
        self._ha = homeassistant
        self._publish_discovery = publish_discovery

    def attach(self, client: mqtt.Client) -> None:
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish

    @_callback
    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        """CONNACK: on success send the state at once and let the backlog follow at its pace
        (see mqtt.py's module docstring); on refusal report the broker's reason."""
        with self._lock:
            self._link.connack_seen = True
        if reason_code.is_failure:
            self._diag.record(ErrorKind.CONNECTION,
                              f"connection refused by {self.broker}: {reason_code} "
                              f"(reason code {reason_code.value}); retrying")
            return
        announce = self._ha.everything() if self._ha is not None else []
        with self._send_lock:
            self._link.connected()
            state = self._out.replay(client, {m.topic for m in announce})
            with self._lock:
                quiet = self._link.mark_ready_locked()
                waiting = self._out.backlog_locked()
                self._lock.notify_all()  # the drain thread hands over the backlog
            if announce:  # every config and the last counts, right after the replay
                self._publish_discovery(announce)
        logger.log(logging.DEBUG if quiet else logging.INFO, "MQTT: connected to %s%s",
                   self.broker, self._drain.connect_summary(state, waiting))

    @_callback
    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        """A (re)connect attempt failed before any CONNACK: unreachable, refused, TLS error.
        paho calls this inside its `except OSError`, so the exception is still at hand."""
        exc = sys.exc_info()[1]
        with self._lock:
            closing = self._out.closed
        if closing:  # an attempt that was under way when stop() began: no news
            logger.debug("MQTT: connection attempt during stop failed: %r", exc)
            return
        self._schedule_reconnect(client, None)
        self._diag.record(ErrorKind.CONNECTION,
                          f"cannot connect to {self.broker}: {exc!r}{self._link.tls_hint(exc)}; "
                          f"retrying")

    @_callback
    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        """Connection gone: new messages go to the outbox until the next CONNACK. Gone before
        any CONNACK is the "not an MQTT broker" class (see mqtt.py's module docstring); dropped
        by the inbound guard, its reason (publish/inbound.py)."""
        refusal = client.take_refusal() if isinstance(client, GuardedClient) else None
        with self._lock:
            was_connected, connack_seen, lasted = self._link.disconnected_locked()
            closing = self._out.closed
            self._diag.errors.resolve(ErrorKind.ACK_STALL)
            self._lock.notify_all()
        if closing:
            logger.debug("MQTT: disconnected from %s (%s)", self.broker, reason_code)
            return
        self._schedule_reconnect(client, lasted)
        if refusal is not None:
            self._diag.record(ErrorKind.REFUSED,
                              f"broker {self.broker} {refusal}; disconnected, reconnecting")
        elif was_connected:
            self._link.connection_lost(str(reason_code))
        elif not connack_seen:  # a refusal (a CONNACK) was reported by _on_connect already
            self._diag.record(ErrorKind.CONNECTION, self._link.no_connack_error(str(reason_code)))

    def _schedule_reconnect(self, client: mqtt.Client, lasted: float | None) -> None:
        """Set paho's wait before its next attempt (see mqtt.py's module docstring); paho calls
        the failure callbacks before it waits."""
        delay = self._link.schedule_reconnect(lasted)
        client.reconnect_delay_set(delay, delay)  # type: ignore[arg-type]

    @_callback
    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        """Broker acknowledged (QoS >= 1) or paho wrote (QoS 0) message `mid`."""
        with self._lock:
            self._out.acknowledged(mid)
            resumed = self._link.acknowledged_locked()
            self._lock.notify_all()
        if resumed:
            self._diag.errors.resolve(ErrorKind.ACK_STALL)
            logger.info("MQTT: %s acknowledges messages again", self.broker)
