"""The state of the MQTT client's connection and what is wrong with it: reconnect back-off,
flapping, short-lived connections, acknowledgement stalls and the "no CONNACK" diagnoses
(publish/mqtt.py's module docstring has the why of each).

Why its own class: the client's callbacks only say what happened (CONNACK, disconnect, an
acknowledgement); deciding whether that is news, a flap or a problem is this class's one job, and
it answers with a typed `LinkHealth` that the client's `stats()` flattens into its dict.

The link state is an explicit state machine (`LinkState`, `_ALLOWED`): DOWN -> CONNECTED on a
CONNACK, CONNECTED -> READY once the replay is handed over, and back to DOWN when the connection
is lost.

Locks: every method runs under the client's `_lock` (the `lock` passed in, a Condition) where it
says `_locked`, and takes it itself otherwise; it never calls into paho while holding it. The
diagnostics' locks are leaves, taken after it.
"""

from __future__ import annotations

import enum
import logging
import random
import ssl
import threading
from dataclasses import dataclass
from typing import Callable

from ..backoff import Backoff
from ..config.schema import MqttConfig
from .diagnostics import Diagnostics, ErrorKind

logger = logging.getLogger("yoloedge.publish.mqtt")

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


class LinkState(enum.Enum):
    DOWN = "down"  # not connected: connecting, or waiting for the next attempt
    CONNECTED = "connected"  # CONNACK received; the replay is being handed over
    READY = "ready"  # connected and replay done: new messages may go straight to paho


_ALLOWED: dict[LinkState, frozenset[LinkState]] = {
    LinkState.DOWN: frozenset({LinkState.CONNECTED, LinkState.DOWN}),
    LinkState.CONNECTED: frozenset({LinkState.READY, LinkState.DOWN}),
    LinkState.READY: frozenset({LinkState.DOWN}),
}


@dataclass(frozen=True)
class LinkHealth:
    """The connection as `stats()` reports it."""

    state: LinkState
    reconnects: int
    reconnect_delay_s: float | None  # the wait before the current attempt; None while connected
    ack_stalled: bool  # connected, but the broker acknowledges nothing
    unstable: bool  # the broker keeps closing connections it just accepted

    @property
    def connected(self) -> bool:
        return self.state is not LinkState.DOWN


class LinkMonitor:
    """The link's state and its problems, fed by the client's paho callbacks."""

    def __init__(self, config: MqttConfig, broker: str, client_id: str, lock: threading.Condition,
                 diagnostics: Diagnostics, clock: Callable[[], float], rng: random.Random | None):
        self._config = config
        self._broker = broker
        self._client_id = client_id
        self._lock = lock
        self._diag = diagnostics
        self._clock = clock
        # guarded by _lock:
        self.state = LinkState.DOWN
        self.connack_seen = False  # since the last disconnect: tells "no CONNACK" from "refused"
        self._connects = 0
        self._reconnects = 0
        self._connected_at: float | None = None
        self._lost_logged_at: float | None = None  # when a lost connection was last warned about
        self._flaps = 0  # lost connections since then, not yet reported
        self._flap_reason = ""
        self._short_lived: list[float] = []  # when the recent short-lived connections were lost
        self._unstable: str | None = None  # the last_error that reports them (see SHORT_LIVED_S)
        self._connect_quiet = False  # the last loss was not logged: neither is the reconnect
        self._last_ack_at = 0.0
        self._ack_stall: str | None = None  # the last_error that reports missing acks
        self._backoff = Backoff(config.reconnect_min_s, config.reconnect_max_s,
                                reset_after_s=SHORT_LIVED_S, jitter=RECONNECT_JITTER, rng=rng)
        self._reconnect_delay: float | None = None

    # ------------------------------------------------------------------ state machine

    def _move_locked(self, new: LinkState) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"MQTT link: {self.state.value} -> {new.value} is not a transition")
        self.state = new

    @property
    def ready_locked(self) -> bool:
        return self.state is LinkState.READY

    @property
    def connected_locked(self) -> bool:
        return self.state is not LinkState.DOWN

    def connected(self) -> None:
        """A successful CONNACK (caller holds the client's _send_lock, not _lock)."""
        with self._lock:
            self._move_locked(LinkState.CONNECTED)
            self._diag.errors.resolve(ErrorKind.CONNECTION)  # the next problem is news again
            if self._connects:
                self._reconnects += 1
            self._connects += 1
            self._connected_at = self._clock()

    def mark_ready_locked(self) -> bool:
        """The replay is handed over: new messages go straight to paho. Returns whether the
        connect is quiet (the loss before it was not logged). Caller holds _lock."""
        self._move_locked(LinkState.READY)
        self._last_ack_at = self._clock()  # acknowledgements are awaited from now on
        quiet, self._connect_quiet = self._connect_quiet, False
        return quiet

    def disconnected_locked(self) -> tuple[bool, bool, float | None]:
        """The connection is gone: (was connected, a CONNACK was seen, how long it lasted).
        Caller holds _lock."""
        was_connected = self.state is not LinkState.DOWN
        connack_seen, self.connack_seen = self.connack_seen, False
        self._move_locked(LinkState.DOWN)
        self._ack_stall = None  # "not connected" is the problem now
        lasted = (self._clock() - self._connected_at
                  if was_connected and self._connected_at is not None else None)
        return was_connected, connack_seen, lasted

    def acknowledged_locked(self) -> bool:
        """An acknowledgement came; True when it ends an ack stall. Caller holds _lock."""
        self._last_ack_at = self._clock()
        resumed, self._ack_stall = self._ack_stall, None
        return resumed is not None

    def health(self) -> LinkHealth:
        with self._lock:
            return LinkHealth(self.state, self._reconnects,
                              None if self.connected_locked else self._reconnect_delay,
                              self._ack_stall is not None, self._unstable is not None)

    # ------------------------------------------------------------------ reconnecting

    def schedule_reconnect(self, lasted: float | None) -> float:
        """The wait before paho's next attempt from the shared back-off rule, with jitter;
        `lasted`: how long the connection that just ended had been up, None when there was none."""
        with self._lock:
            delay = self._backoff.next_delay(lasted)
            self._reconnect_delay = delay
        logger.debug("MQTT: next connection attempt to %s in %.2f s", self._broker, delay)
        return delay

    def connection_lost(self, reason: str) -> None:
        """Warn about the first lost connection; within FLAP_WINDOW_S after that, count the
        losses and warn with their sum at most once per FLAP_WINDOW_S (see the module docstring)."""
        message = f"connection to {self._broker} lost: {reason}; reconnecting"
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
        self._diag.errors.update(ErrorKind.CONNECTION, message, warned=not quiet)
        self._note_short_lived(now)  # after: "unstable", when it is, is the latest error
        if quiet:
            logger.debug("MQTT: %s", message)
        elif summary is not None:
            logger.warning("MQTT: connection to %s is unstable: %s; lost again: %s", self._broker,
                           summary, reason)
        else:
            logger.warning("MQTT: %s", message)

    def _note_short_lived(self, now: float) -> None:
        """Report "unstable" when the broker keeps closing connections it just accepted. Ended by
        `check_stable` once a connection lasts."""
        with self._lock:
            if self._connected_at is None or now - self._connected_at > SHORT_LIVED_S:
                return
            self._short_lived = [t for t in self._short_lived if now - t <= FLAP_WINDOW_S] + [now]
            if len(self._short_lived) < SHORT_LIVED_LIMIT:
                return
            self._unstable = unstable = (
                f"the broker {self._broker} closed the connection {len(self._short_lived)} times "
                f"within {SHORT_LIVED_S:g} s of accepting it: is another client connected with "
                f"client id {self._client_id!r} (two daemons with the same device_id)?")
        self._diag.record(ErrorKind.UNSTABLE, unstable)

    def check_stable(self) -> None:
        """A connection that lasted FLAP_WINDOW_S ends the "unstable" report, and a refusal by
        the inbound guard: that broker behaves now."""
        with self._lock:
            if not (self.connected_locked and self._connected_at is not None
                    and self._clock() - self._connected_at > FLAP_WINDOW_S):
                return
            self._unstable, self._short_lived = None, []
        self._diag.errors.resolve(ErrorKind.UNSTABLE)
        self._diag.errors.resolve(ErrorKind.REFUSED)

    # ------------------------------------------------------------------ acknowledgements

    def ack_stall_s(self) -> float:
        """How long sent messages may wait for their first acknowledgement: a broker is slow to
        acknowledge under load, but not for two keep-alive intervals."""
        return max(ACK_STALL_MIN_S, 2.0 * self._config.keepalive_s)

    def check_acks(self, oldest_pending: Callable[[], tuple[int, float | None]]) -> None:
        """Report a connection on which sent messages get no acknowledgement (see the module
        docstring); the message counts the waiting messages and the seconds since the oldest
        was sent or the last acknowledgement came, whichever is later. `oldest_pending` (called
        under _lock): how many wait for an acknowledgement, and since when the oldest does."""
        with self._lock:
            waiting, oldest = oldest_pending()
            if not self.connected_locked or oldest is None:
                return
            waited = self._clock() - max(oldest, self._last_ack_at)
            if waited < self.ack_stall_s():
                return
            first = self._ack_stall is None
            self._ack_stall = stall = (f"the broker {self._broker} has not acknowledged {waiting} "
                                       f"message(s) for {waited:.0f} s; it is connected but may "
                                       f"be overloaded or broken")
        if first:
            self._diag.record(ErrorKind.ACK_STALL, stall)
        else:  # the same stall, older: said when it began
            self._diag.errors.update(ErrorKind.ACK_STALL, stall)

    # ------------------------------------------------------------------ diagnoses

    def no_connack_error(self, reason: str) -> str:
        """The message is the same on every retry, so it warns once per outage."""
        where = f"broker at {self._broker}"
        hint = "(is it an MQTT broker? a TLS port without tls:?); retrying"
        if reason == "Keep alive timeout":  # paho's CONNACK deadline is the keep-alive interval
            return (f"{where} accepted the connection but sent no MQTT CONNACK within "
                    f"{self._config.keepalive_s} s {hint}")
        if reason == "Protocol error":
            return f"{where} answered with something that is not MQTT {hint}"
        return f"{where} closed the connection without sending an MQTT CONNACK {hint}"

    def tls_hint(self, exc: BaseException | None) -> str:
        """A TLS handshake with a port that speaks MQTT in clear fails as an SSL error, or the
        broker resets the connection: say what is the likely cause, not only the symptom."""
        if self._config.tls is None:
            return ""
        if isinstance(exc, (ssl.SSLError, ConnectionResetError, ConnectionAbortedError,
                            BrokenPipeError)):
            return (f" (is port {self._config.port} a TLS port? the broker may not speak TLS "
                    f"there)")
        return ""
