"""The MQTT client's backlog hand-over: the `mqtt-drain` thread, its pace, and the spool as the
durable outbox (publish/mqtt.py's module docstring: "Reconnect without a flood", "Durable
outbox").

Why its own class: what waits (the outbox, outbox.py) and when it may go (the token bucket, the
room in memory, the spool's cursor) are different jobs; this one owns the thread that moves
messages from one to the other and the spool's place in the path.

Locks: as in outbox.py: `send_lock` (the client's `_send_lock`) around every hand-over, `lock`
(the client's `_lock`, a Condition) for the pace and the counters, never held while calling into
paho; the spool's lock is a leaf.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

from ..config.schema import MqttConfig
from .diagnostics import Diagnostics, ErrorKind
from .link_health import LinkMonitor
from .outbox import Outbox, Outgoing
from .pacing import UNLIMITED, TokenBucket
from .spool import Record, Spool

logger = logging.getLogger("yoloedge.publish.mqtt")

#: how often the spool thread fsyncs and deletes acknowledged segments (see publish/spool.py).
SPOOL_SYNC_INTERVAL_S = 1.0


class Drain:
    """Hands the backlog to paho at its pace; appends to the spool and reads it back."""

    def __init__(self, config: MqttConfig, send_lock: threading.RLock, lock: threading.Condition,
                 outbox: Outbox, link: LinkMonitor, diagnostics: Diagnostics,
                 clock: Callable[[], float]):
        self._config = config
        self._send_lock = send_lock
        self._lock = lock
        self._outbox = outbox
        self._link = link
        self._diag = diagnostics
        self.spool: Spool | None = None  # set by start(), once it opened
        self.thread: threading.Thread | None = None
        # guarded by _lock:
        self.stopping = False  # stop() began: without a spool the backlog goes unpaced
        self.pacer = TokenBucket(config.drain_rate, max(1.0, config.drain_rate), clock)
        self.drained = 0  # backlog messages handed over by the drain
        self._spool_dropped = 0  # spool drops already counted as dropped
        self._spool_unreadable = 0  # unreadable spool records already counted as dropped

    def start(self, spool: Spool | None) -> Spool | None:
        """Recover the spool, hand it to the outbox and start the thread; returns the spool in
        use. Caller holds _send_lock."""
        self.spool = self._outbox.spool = self._open(spool)
        self.thread = threading.Thread(target=self._loop, name="mqtt-drain", daemon=True)
        self.thread.start()
        return self.spool

    def _open(self, spool: Spool | None) -> Spool | None:
        """A spool that cannot be opened (the disk failed since the config was checked) must not
        keep the daemon from publishing: the client goes on with the in-memory outbox (None) and
        says so."""
        if spool is None:
            return None
        try:
            recovered = spool.open()
        except OSError as exc:
            self._diag.record(ErrorKind.SPOOL_WRITE,
                              f"cannot open the spool {spool.directory}: {exc}; messages are "
                              f"kept in memory only")
            return None
        if recovered or spool.discarded_bytes:
            logger.log(logging.WARNING if spool.discarded_bytes else logging.INFO,
                       "MQTT: spool %s: %d message(s) from the previous run to send%s",
                       spool.directory, recovered,
                       f"; {spool.discarded_bytes} byte(s) of torn or corrupt records moved aside"
                       if spool.discarded_bytes else "")
        return spool

    def connect_summary(self, state: int, waiting: int) -> str:
        """What a connect line says about the messages that waited for it."""
        if not waiting:
            return f", sent {state} retained message(s) of state" if state > 1 else ""
        pace = (f"at up to {self._config.drain_rate:g} a second" if not self.pacer.unlimited
                else "as fast as the broker takes them")
        return (f", sent {state} retained message(s) of state; {waiting} waiting message(s) "
                f"follow {pace}")

    @property
    def spooling(self) -> bool:
        return self.spool is not None and self.thread is not None

    # ------------------------------------------------------------------ the spool

    def spool_submit(self, msg: Outgoing) -> bool:
        """Append to the spool, and while connected hand over at once when memory allows (ahead
        of an older backlog, if one drains); else the drain thread hands it over later, in
        order. False (caller falls back to memory) when the spool cannot be written. Caller holds
        _send_lock."""
        spool = self.spool
        if spool is None:
            return False
        try:
            seq = spool.append(Record(msg.topic, bytes(msg.payload), msg.qos, msg.retain))
        except OSError as exc:
            self._diag.record(ErrorKind.SPOOL_WRITE,
                              f"cannot write to the spool {spool.directory}: {exc}; "
                              f"messages are kept in memory meanwhile")
            return False
        if self._diag.errors.resolve(ErrorKind.SPOOL_WRITE):
            logger.info("MQTT: the spool %s takes messages again", spool.directory)
        msg = dataclasses.replace(msg, seq=seq)
        out = self._outbox
        with self._lock:
            out.published += 1
            out.note_retained_locked(msg)
            direct = self._link.ready_locked and out.full_reason_locked(len(msg.payload)) is None
        self.count_spool_drops(spool)
        if direct:
            if not spool.take(seq):  # an older backlog is draining: this one goes ahead of it
                with self._lock:
                    out.sent_ahead.add(seq)
            out.send(msg)
        else:
            with self._lock:
                self._lock.notify_all()  # the drain thread hands it over when it can
        return True

    def count_spool_drops(self, spool: Spool) -> None:
        dropped, unreadable = spool.dropped, spool.unreadable
        with self._lock:
            new, self._spool_dropped = dropped - self._spool_dropped, dropped
            lost, self._spool_unreadable = unreadable - self._spool_unreadable, unreadable
        if new:
            self._diag.note_drop(f"spool full ({self._config.spool_limit_bytes} bytes); its oldest "
                                 f"messages were deleted", count=new)
        if lost:
            self._diag.record(ErrorKind.SPOOL_LOST,
                              f"spool {spool.directory}: {lost} message(s) could not be read "
                              f"back (its files were deleted, truncated or unreadable) and are "
                              f"dropped; the spool goes on", active=False)
            self._diag.note_drop("unreadable in the spool", count=lost)

    def close(self, deadline: float) -> None:
        """Stop the thread (it sees the outbox closed) and fsync what is left for the next start."""
        with self._lock:
            self._lock.notify_all()
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.monotonic()))
        spool = self.spool
        if spool is not None:
            try:
                spool.close()  # releases its files and directory lock even when this raises
            except OSError as exc:
                self._diag.record(ErrorKind.SPOOL_CLOSE,
                                  f"closing the spool {spool.directory} failed: {exc}; the "
                                  f"messages spooled last may not survive a power cut")

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        """Hand the backlog to paho at the drain's pace as room frees up, and sync the spool
        about once a second, until stop(). An error is reported, never the end of the thread: a
        thread that died would leave every later message on disk only. A drain that took nothing
        waits like an idle one: records the spool counts but cannot read back (a file damaged on
        disk) would otherwise make it spin at full CPU."""
        spool = self.spool
        progress = True
        while True:
            with self._lock:
                if self._outbox.closed:
                    return
                wait = self._wait_locked(progress)
                if wait > 0:
                    self._lock.wait(wait)  # woken by connect, ack, append, stop
            progress = False
            try:
                progress = self._round() > 0
                if spool is not None:
                    spool.sync()
                if self._diag.errors.resolve(ErrorKind.DRAIN):
                    logger.info("MQTT: the backlog is handed over again%s",
                                f" (spool {spool.directory})" if spool is not None else "")
            except Exception as exc:  # noqa: BLE001 - logged with traceback and reported in stats
                self._failed(exc)
                time.sleep(SPOOL_SYNC_INTERVAL_S)
            if spool is not None:
                self.count_spool_drops(spool)

    def _wait_locked(self, progress: bool) -> float:
        """How long the thread waits before its next round (caller holds _lock): the spool's
        sync interval when there is nothing to do (or the last round took nothing), else until
        the pace allows its next step."""
        if not (progress and self._link.ready_locked and self._due_locked()):
            return SPOOL_SYNC_INTERVAL_S
        if self.unpaced_locked():
            return 0.0
        return min(SPOOL_SYNC_INTERVAL_S, self.pacer.wait_s(self.pacer.step()))

    def _due_locked(self) -> bool:
        """Something waits that the drain could hand over now (caller holds _lock)."""
        if self._outbox.waiting_locked:
            return True
        spool = self.spool
        return (spool is not None and spool.has_unsent
                and self._outbox.full_reason_locked(0) is None)

    def unpaced_locked(self) -> bool:
        """No pace: `drain_rate` 0, or stopping without a spool (what is not sent is lost)."""
        return self.pacer.unlimited or (self.stopping and self.spool is None)

    def _failed(self, exc: Exception) -> None:
        """Report a failure of the thread: a warning (with its traceback unless it is the disk's
        or the directory's fault) the first time, then (a disk that stays broken fails every
        second) at debug level and in one warning per ERROR_REPEAT_LOG_S."""
        spool = self.spool
        message = (f"spool {spool.directory}: {exc}" if spool is not None
                   else f"handing the backlog over failed: {exc!r}")
        warn = self._diag.errors.report(ErrorKind.DRAIN, message)
        if warn is None:
            logger.debug("MQTT: %s", message)
        else:
            logger.warning("MQTT: %s%s", message, warn.suffix(),
                           exc_info=None if isinstance(exc, OSError) else exc)

    def _round(self) -> int:
        """One round: as many backlog messages as the pace allows, the outbox first, then the
        spool. Returns how many were taken from the backlog (handed over or skipped)."""
        with self._send_lock:
            with self._lock:
                if not self._link.ready_locked or self._outbox.closed:
                    return 0
                budget = UNLIMITED if self.unpaced_locked() else self.pacer.available()
            if budget <= 0:
                return 0
            taken, sent = self._outbox.hand_over(budget)
            spool = self.spool
            if spool is not None and sent < budget:
                more_taken, more_sent = self._from_spool(spool, budget - sent)
                taken, sent = taken + more_taken, sent + more_sent
            with self._lock:
                self.pacer.take(sent)
                self.drained += sent
            return taken

    def _from_spool(self, spool: Spool, budget: int) -> tuple[int, int]:
        """Up to `budget` records the spool holds beyond its cursor, within the in-memory
        limits; records sent ahead of the drain, and retained copies a newer one replaced, are
        skipped (the latter acknowledged in the spool: they will never be sent). Returns
        (taken, handed over). Caller holds _send_lock."""
        out = self._outbox
        with self._lock:
            room, room_bytes = out.room_locked()
        if room <= 0 or room_bytes <= 0:
            return 0, 0
        sent = 0
        records = spool.read(min(room, budget), room_bytes)
        for seq, rec in records:
            with self._lock:
                if out.sent_ahead.passed(seq):
                    continue
                if out.superseded_locked(rec.topic, rec.retain, seq):
                    out.superseded += 1
                    spool.ack(seq)
                    continue
            out.send(Outgoing(rec.topic, rec.payload, rec.qos, rec.retain, seq))
            sent += 1
        return len(records), sent
