"""The MQTT client's outbox: what waits for a connection, what paho holds unacknowledged, the
queue limits, the newest copy of each retained topic, and the replay on a CONNACK
(publish/mqtt.py's module docstring has the design: "Ordering and never twice", "Bounded",
"Reconnect without a flood").

Why its own class: every message is in exactly one place (this outbox, paho's unacknowledged set
tracked here as `pending`, or the spool), and the counting that keeps that true is one job; the
client's lifecycle (mqtt.py), its callbacks (callbacks.py), the link's health (link_health.py)
and the paced hand-over of the backlog (drain.py) only call it.

Locks: the client's `_send_lock` (re-entrant) is held around everything that hands messages to
paho (`send`, `replay`, `hand_over`); `lock` (the client's `_lock`, a Condition) guards every field
below and is never held while calling into paho. Methods named `_locked` expect it held.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

from ..config.schema import MqttConfig
from .diagnostics import Diagnostics
from .link_health import LinkMonitor
from .pacing import SentAhead
from .spool import Spool
from .topics import Topics


@dataclass(frozen=True)
class Outgoing:
    topic: str
    payload: bytes | bytearray  # paho hands unacknowledged messages back as it stored them
    qos: int
    retain: bool
    seq: int | None = None  # its record in the spool, when there is one


class Outbox:
    """Messages on their way to the broker, in memory, within the queue limits."""

    def __init__(self, config: MqttConfig, topics: Topics, lock: threading.Condition,
                 link: LinkMonitor, diagnostics: Diagnostics, clock: Callable[[], float],
                 status_message: Callable[[str], Outgoing]):
        self._config = config
        self._topics = topics
        self._lock = lock
        self._link = link
        self._diag = diagnostics
        self._clock = clock
        self._status_message = status_message
        self.client: mqtt.Client | None = None  # set by start()
        self.spool: Spool | None = None  # set by start(), once it opened
        # guarded by _lock (set under _send_lock too):
        self.closed = False  # stop() is done with the connection: nothing is taken any more
        self.status: str | None = None  # the device status, re-published after every reconnect
        self._queue: collections.deque[Outgoing] = collections.deque()
        self._pending: dict[int, Outgoing] = {}  # by mid: handed to paho, not yet acknowledged
        self._pending_since: dict[int, float] = {}  # mid -> when it was handed to paho
        self.queued_bytes = 0  # payload bytes in _queue and _pending
        self._early_acks: set[int] = set()
        self._in_publish_call = False
        self._retained: dict[str, Outgoing] = {}  # newest retained message per topic (not status)
        self._retained_acked: set[str] = set()  # topics whose newest copy the broker acknowledged
        self.sent_ahead = SentAhead()  # spool records handed over before the drain reached them
        self.superseded = 0  # retained copies skipped: a newer one on the topic went out
        self.published = 0
        self.delivered = 0

    # ------------------------------------------------------------------ taking messages

    def submit(self, msg: Outgoing, limited: bool) -> bool:
        """Send now when connected, else keep (QoS >= 1), within the queue limits when `limited`.
        Caller holds _send_lock."""
        with self._lock:
            ready = self._link.ready_locked
            made_room = self._make_room_locked(len(msg.payload)) if ready and limited else 0
            full = self.full_reason_locked(len(msg.payload))
            if (full is None or not limited) and (ready or msg.qos > 0):
                self.note_retained_locked(msg)
        if made_room:
            self._diag.note_drop("queue full while the backlog drains: the oldest waiting "
                                 "message(s) made room for a new one", count=made_room)
        if full is not None and limited:
            self._diag.note_drop(full)
            return False
        if not ready:
            return self._keep(msg)
        if not self.send(msg):
            return False
        with self._lock:
            self.published += 1
        return True

    def _make_room_locked(self, size: int) -> int:
        """While connected, a new message that does not fit takes the place of the oldest ones
        waiting (see "Bounded" in publish/mqtt.py); returns how many were dropped."""
        dropped = 0
        if size > self._config.queue_limit_bytes:
            return 0  # it would not fit in an empty queue either
        while self._queue and self.full_reason_locked(size) is not None:
            old = self._queue.popleft()
            self.queued_bytes -= len(old.payload)
            dropped += 1
        return dropped

    def note_retained_locked(self, msg: Outgoing) -> None:
        """Remember the newest retained message of each topic: older copies still waiting are
        skipped, and at a reconnect this one goes out at once. The status is not among them: it
        is re-published from `status` instead."""
        if msg.retain and msg.topic != self._topics.status:
            self._retained[msg.topic] = msg
            self._retained_acked.discard(msg.topic)

    def _is_newest_locked(self, msg: Outgoing) -> bool:
        """`msg` is the newest retained message of its topic (the same object in memory, or the
        same spool record)."""
        newest = self._retained.get(msg.topic)
        return newest is not None and (newest is msg or (newest.seq is not None
                                                         and newest.seq == msg.seq))

    def superseded_locked(self, topic: str, retain: bool, seq: int | None,
                          msg: Outgoing | None = None) -> bool:
        """A retained message waiting in the backlog that a newer one on its topic replaced."""
        if not retain or topic not in self._retained:
            return False
        if msg is not None:
            return not self._is_newest_locked(msg)
        return self._retained[topic].seq != seq

    def full_reason_locked(self, size: int) -> str | None:
        """Why one more message of `size` payload bytes does not fit in memory, or None."""
        cfg = self._config
        if len(self._queue) + len(self._pending) >= cfg.queue_limit:
            return f"queue full ({cfg.queue_limit} messages waiting)"
        if size > cfg.queue_limit_bytes:
            return f"a {size}-byte message is larger than queue_limit_bytes ({cfg.queue_limit_bytes})"
        if self.queued_bytes + size > cfg.queue_limit_bytes:
            return f"queue full ({self.queued_bytes} of {cfg.queue_limit_bytes} bytes waiting)"
        return None

    def room_locked(self) -> tuple[int, int]:
        """(messages, payload bytes) that fit in memory now."""
        return (self._config.queue_limit - len(self._queue) - len(self._pending),
                self._config.queue_limit_bytes - self.queued_bytes)

    def _keep(self, msg: Outgoing) -> bool:
        """Hold a message for the next connection; QoS 0 means "don't bother", so it is dropped."""
        if msg.qos == 0:
            self._diag.note_drop("not connected (QoS 0 messages are not queued)")
            return False
        with self._lock:
            self._queue.append(msg)
            self.queued_bytes += len(msg.payload)
            self.published += 1
        return True

    # ------------------------------------------------------------------ handing over

    def send(self, msg: Outgoing, from_queue: bool = False) -> bool:
        """Hand one message to paho (caller holds _send_lock) and start tracking its mid.

        An acknowledgement can arrive (in paho's thread) before client.publish() returns here;
        such early acks are collected while the call runs (and until the mid is recorded, in the
        same critical section), so the mid is not tracked forever.
        """
        client = self.client
        if client is None:
            raise RuntimeError("send before start()")
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
            if from_queue:
                self._queue.popleft()
                self.queued_bytes -= len(msg.payload)
            done = not accepted or info.mid in self._early_acks
            if msg.qos > 0 and not done:
                self._pending[info.mid] = msg
                self._pending_since[info.mid] = self._clock()
                self.queued_bytes += len(msg.payload)
            if done and msg.seq is not None and self.spool is not None:
                self.spool.ack(msg.seq)  # acknowledged already, or refused (counted as dropped)
            if done and accepted and msg.retain and self._is_newest_locked(msg):
                self._retained_acked.add(msg.topic)
            self._early_acks.clear()
            self._lock.notify_all()
        if not accepted:
            self._diag.note_drop(f"the MQTT client refused it ({mqtt.error_string(rc)})")
        return accepted

    def hand_over(self, budget: int) -> tuple[int, int]:
        """Up to `budget` messages from the front of the queue, in order; retained copies a
        newer one replaced are skipped. Returns (taken, handed over). Caller holds _send_lock."""
        taken = sent = 0
        while sent < budget:
            with self._lock:
                if not self._queue or not self._link.ready_locked:
                    break
                msg = self._queue[0]
                if self.superseded_locked(msg.topic, msg.retain, msg.seq, msg):
                    self._queue.popleft()
                    self.queued_bytes -= len(msg.payload)
                    self.superseded += 1
                    taken += 1
                    continue
            self.send(msg, from_queue=True)
            taken, sent = taken + 1, sent + 1
        return taken, sent

    def acknowledged(self, mid: int) -> None:
        """Broker acknowledged (QoS >= 1) or paho wrote (QoS 0) message `mid` (caller holds
        _lock)."""
        sent = self._pending.pop(mid, None)
        self._pending_since.pop(mid, None)
        if sent is not None:
            self.queued_bytes -= len(sent.payload)
            if sent.seq is not None and self.spool is not None:
                self.spool.ack(sent.seq)  # before notify: stop() waits for the spool too
            if sent.retain and self._is_newest_locked(sent):
                self._retained_acked.add(sent.topic)
        elif self._in_publish_call:
            self._early_acks.add(mid)
        self.delivered += 1

    def replay(self, client: mqtt.Client, fresh_topics: set[str]) -> int:
        """Take paho's unacknowledged messages back to the front of the backlog, then hand over
        at once the current status and the newest waiting copy of every retained topic, and
        skip the older ones (and those of `fresh_topics`, which the caller publishes anew).
        Returns how many went out. Caller holds _send_lock.

        The unacknowledged messages are moved to the front of the queue in one step, so stats()
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
                    self.queued_bytes -= len(sent.payload)
                if sent is not None and sent.seq is not None:
                    rewind_to = sent.seq if rewind_to is None else min(rewind_to, sent.seq)
                else:
                    back.append(sent or Outgoing(m.topic, m.payload, m.qos, m.retain))
            self._queue.extendleft(reversed(back))
            self.queued_bytes += sum(len(m.payload) for m in back)
            self.sent_ahead.clear()  # what went ahead and is not acknowledged goes again
            state = self._state_to_send_locked(fresh_topics)
            if self.status is not None and not self.closed:
                state.insert(0, self._status_message(self.status))
                self.published += 1
        if rewind_to is not None and self.spool is not None:
            self.spool.rewind(rewind_to)
        for msg in state:
            self.send(msg)
        return len(state)

    def _state_to_send_locked(self, fresh_topics: set[str]) -> list[Outgoing]:
        """Take the status and every retained message out of the queue: the newest copy of each
        topic is returned, to go out at once; older ones (and the status, re-published from
        `status`) are skipped, counted in `superseded`. The newest copy of a topic that waits
        in the spool is returned too, and noted as sent ahead."""
        state: list[Outgoing] = []
        kept: collections.deque[Outgoing] = collections.deque()
        for msg in self._queue:
            if msg.topic == self._topics.status or msg.retain:
                self.queued_bytes -= len(msg.payload)
                if (msg.topic != self._topics.status and self._is_newest_locked(msg)
                        and msg.topic not in fresh_topics):
                    state.append(msg)
                else:
                    self.superseded += 1
            else:
                kept.append(msg)
        self._queue = kept
        for topic, newest in self._retained.items():
            if (newest.seq is not None and topic not in self._retained_acked
                    and topic not in fresh_topics):
                state.append(newest)
                self.sent_ahead.add(newest.seq)
        return state

    # ------------------------------------------------------------------ counting

    @property
    def waiting_locked(self) -> bool:
        """Messages wait in memory for the drain."""
        return bool(self._queue)

    def oldest_pending_locked(self) -> tuple[int, float | None]:
        """How many messages wait for an acknowledgement, and since when the oldest does."""
        oldest = next(iter(self._pending_since.values()), None)  # dicts keep insertion order
        return len(self._pending_since), oldest

    def queued_locked(self) -> int:
        """Messages waiting or not yet acknowledged; spooled ones counted once."""
        if self.spool is None:
            return len(self._queue) + len(self._pending)
        unspooled = sum(1 for m in self._pending.values() if m.seq is None)
        return len(self._queue) + unspooled + self.spool.unacked

    def backlog_locked(self) -> int:
        """Messages waiting to be handed to the broker: queued, less those in flight while
        connected."""
        queued = self.queued_locked()
        return max(0, queued - len(self._pending)) if self._link.connected_locked else queued

    def wait_drained(self, deadline: float) -> bool:
        """Block until nothing is queued or unacknowledged, or until `deadline` (monotonic)."""
        with self._lock:
            while self._queue or self._pending or (self.spool is not None and self.spool.unacked):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

