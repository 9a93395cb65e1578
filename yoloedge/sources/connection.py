"""A camera's connections, one attempt at a time: opening it, the stall watch, backoff and retries.

`ConnectionSupervisor.supervise` runs on the reader's supervisor thread until a terminal state.
Each attempt is a `Connection` with a thread of its own, which opens the camera (`opening`) and
reads it through the reader's `FrameDelivery`, then releases the source itself. The supervisor
never touches a source: it watches the connection, and when no good frame arrived for
`stall_timeout_s` (or an open outlives its own timeout) it abandons it and backs off, since
releasing an OpenCV capture while another thread is inside read() is not safe. State changes go
through the reader's one transition point (`set_state`).

Locks: the counters' lock (a leaf) for single updates; the state lock is the reader's.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..backoff import Backoff
from ..config.schema import CameraConfig
from ..threads import lower_priority
from ..timeutil import utc_timestamp
from .base import Source, SourceError, UnsupportedSourceError
from .delivery import FrameDelivery
from .frame import SinkClosed
from .framepool import FramePool
from .imagesize import ImageLimits
from .dvpp import MediaEngine
from .opening import open_camera
from .readercore import CameraLog, Connection, Outcome, ReaderCounters
from .state import CameraState

#: a connection that delivered frames this long resets the backoff delay to backoff_initial_s;
#: shorter ones (a flapping camera) keep doubling it, so they cannot hammer the camera.
STABLE_STREAM_S = 10.0
#: backoff delays vary by this fraction either way, so cameras behind one NVR don't reconnect in step
BACKOFF_JITTER = 0.2
#: the supervisor re-checks its connection at least this often
SUPERVISOR_POLL_S = 0.25

SetState = Callable[[CameraState, "str | None"], None]


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    reason: str | None
    streamed_s: float | None  # how long it delivered good frames; None if it never did


class ConnectionSupervisor:
    """Connection attempts and backoff for one camera until a terminal state (`supervise`).

    `current` is the attempt under way (the reader's stop() cancels it); `consecutive_failures`
    is written by the supervisor thread only.
    """

    def __init__(self, config: CameraConfig, delivery: FrameDelivery, *, stall_timeout_s: float,
                 clock: Callable[[], float], stop: threading.Event, set_state: SetState, safe_url: str,
                 pool: FramePool | None, limits: ImageLimits, counters: ReaderCounters, lock: threading.Lock,
                 camlog: CameraLog, media: MediaEngine | None = None):
        self._config = config
        self._media = media
        self._name = config.name
        self._delivery = delivery
        self._stall_timeout_s = stall_timeout_s
        self._clock = clock
        self._stop = stop
        self._set_state = set_state
        self._safe_url = safe_url
        self._pool = pool
        self._limits = limits
        self._counters = counters
        self._lock = lock  # the counters'
        self._camlog = camlog
        self._connections: list[Connection] = []  # live connection threads, for open_captures()
        self.current: Connection | None = None
        self.consecutive_failures = 0
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, reset_after_s=STABLE_STREAM_S,
                                jitter=BACKOFF_JITTER, rng=random.Random())

    def open_captures(self) -> int:
        """Connection threads still running, each holding at most one capture (abandoned ones
        release theirs when their blocked read returns)."""
        return sum(1 for c in list(self._connections) if c.thread is not None and c.thread.is_alive())

    def supervise(self) -> tuple[CameraState, str | None]:
        """Returns the terminal state to report."""
        attempt = 0
        while not self._stop.is_set():
            number, attempt = attempt, attempt + 1
            try:
                result = self._attempt(number)
                terminal = self._terminal_state(result)
                if terminal is not None:
                    return terminal
                self._wait_backoff(result)
            except Exception as exc:  # noqa: BLE001 - logged, then treated as a failed attempt
                self._camlog.exception("camera reader error", exc)
                reason = f"internal error: {type(exc).__name__}: {exc}"
                self._record_error(reason)
                self._set_state(CameraState.BACKOFF, f"{reason}; retrying in {self._config.backoff_initial_s:.1f} s")
                self._stop.wait(self._config.backoff_initial_s)
        return CameraState.STOPPED, "stop requested"

    def _terminal_state(self, result: AttemptResult) -> tuple[CameraState, str | None] | None:
        """The state the reader ends in after this attempt, or None to back off and retry."""
        if self._stop.is_set() or result.outcome is Outcome.STOPPED:
            return CameraState.STOPPED, "stop requested"
        if result.outcome is Outcome.ENDED:
            return CameraState.ENDED, result.reason
        if result.outcome is Outcome.SINK_CLOSED:
            self._stop.set()
            return CameraState.STOPPED, result.reason
        self._record_error(result.reason)
        if result.outcome is Outcome.UNSUPPORTED:
            return CameraState.FAILED, result.reason
        if result.streamed_s is not None:
            self.consecutive_failures = 0  # it worked: this is a new problem, not the same one
        else:
            self.consecutive_failures += 1
        limit = self._config.max_retries
        if limit > 0 and self.consecutive_failures >= limit:
            return CameraState.FAILED, f"{result.reason} ({self.consecutive_failures} failed attempts in a row)"
        return None

    def _attempt(self, number: int) -> AttemptResult:
        """One connection: start its thread, then watch it until it ends, stalls or we stop."""
        if number > 0:
            with self._lock:
                self._counters.reconnects += 1
        self._set_state(CameraState.CONNECTING, f"opening {self._safe_url}" if number == 0
                        else f"reconnecting to {self._safe_url} (attempt {number + 1})")
        conn = Connection(number, self._clock())
        conn.thread = threading.Thread(target=self._connection_main, args=(conn,),
                                       name=f"camera-{self._name}-capture-{number}", daemon=True)
        self._track(conn)
        self.current = conn
        if self._stop.is_set():  # stop() raced with us; don't open anything
            return AttemptResult(Outcome.STOPPED, "stop requested", None)
        conn.thread.start()
        return self._watch(conn)

    def _watch(self, conn: Connection) -> AttemptResult:
        reported_streaming = False
        while True:
            conn.wakeup.clear()  # before looking, so a change made while we look wakes the wait
            if self._stop.is_set():
                conn.abandon()
                return AttemptResult(Outcome.STOPPED, "stop requested", conn.streamed_s(self._clock()))
            if conn.first_frame_at is not None and not reported_streaming:
                reported_streaming = True
                with self._lock:
                    self._counters.error = None  # recovered: the failure is history (last_error, last_error_at)
                self._set_state(CameraState.STREAMING, self._streaming_reason(conn))
            now = self._clock()
            if conn.finished:
                if conn.outcome is Outcome.STALLED:
                    self._report_stall(conn.reason or "stalled")
                return AttemptResult(conn.outcome or Outcome.ERROR, conn.reason, conn.streamed_s(now))
            hung = self._hang_reason(conn, now)
            if hung is not None:
                return self._abandon(conn, hung, now)
            conn.wakeup.wait(self._next_check_in(conn, now))

    def _hang_reason(self, conn: Connection, now: float) -> tuple[Outcome, str] | None:
        """Stalled: a read has waited stall_timeout_s without a good frame. Also catches an open
        that outlives its own timeout (a backend that ignores it)."""
        mark = conn.progress_mark
        if conn.reading and mark is not None and now - mark > self._stall_timeout_s:
            since = conn.last_good_at if conn.last_good_at is not None else conn.opened_at or mark
            what = "no frame" if conn.last_good_at is not None else "no first frame"
            return Outcome.STALLED, f"{what} for {now - since:.1f} s"
        open_limit = self._config.open_timeout_s + self._stall_timeout_s
        if conn.opened_at is None and now - conn.started_at > open_limit:
            return Outcome.ERROR, f"open did not return within {open_limit:.1f} s"
        return None

    def _abandon(self, conn: Connection, hung: tuple[Outcome, str], now: float) -> AttemptResult:
        """Give up on a connection without touching its capture; its thread releases it."""
        outcome, reason = hung
        conn.abandon()
        if outcome is Outcome.STALLED:
            self._report_stall(reason)
        return AttemptResult(outcome, reason, conn.streamed_s(now))

    def _report_stall(self, reason: str) -> None:
        with self._lock:
            self._counters.stalls += 1
        self._set_state(CameraState.STALLED, reason)

    def _next_check_in(self, conn: Connection, now: float) -> float:
        """Sleep until the stall deadline, but at least every SUPERVISOR_POLL_S."""
        wait = SUPERVISOR_POLL_S
        mark = conn.progress_mark
        if conn.reading and mark is not None:
            wait = min(wait, mark + self._stall_timeout_s - now + 0.01)
        return max(0.01, wait)

    def _wait_backoff(self, result: AttemptResult) -> None:
        delay = self._backoff.next_delay(result.streamed_s)
        with self._lock:
            self._counters.retry_in_s = round(delay, 2)
        self._set_state(CameraState.BACKOFF, f"{result.reason}; retrying in {delay:.1f} s")
        self._stop.wait(delay)
        with self._lock:
            self._counters.retry_in_s = None

    def _streaming_reason(self, conn: Connection) -> str:
        if conn.frame_size is None:
            return "frames arriving"
        width, height = conn.frame_size
        return f"{width}x{height}"

    def _track(self, conn: Connection) -> None:
        """Remember connection threads until they have finished, for open_captures()."""
        self._connections = [c for c in self._connections if c.thread is not None and c.thread.is_alive()]
        self._connections.append(conn)

    def _connection_main(self, conn: Connection) -> None:
        lower_priority()  # decoding is host work: the device worker comes first (see yoloedge.threads)
        source: Source | None = None
        try:
            source, decoder = open_camera(self._config, camera=self._name, reuse_frame=self._pool is not None,
                                          image_limits=self._limits, media=self._media)
            with self._lock:
                self._counters.jpeg_decoder = source.jpeg_decoder
                self._counters.decoder = decoder.value
                self._counters.decoder_reason = source.decoder_reason
            conn.opened_at = conn.progress_mark = self._clock()
            conn.opened_wall = time.time()  # a file's frame times count from here (`Frame.frame_time`)
            if not conn.cancelled.is_set():
                self._delivery.pump(conn, source)
        except UnsupportedSourceError as exc:
            conn.finish(Outcome.UNSUPPORTED, self._camlog.scrub(str(exc)))
        except SourceError as exc:
            conn.finish(Outcome.ERROR, self._camlog.scrub(str(exc)))
        except SinkClosed:
            conn.finish(Outcome.SINK_CLOSED, "camera removed")
        except Exception as exc:  # noqa: BLE001 - logged; the supervisor backs off and retries
            self._camlog.exception("capture error", exc)
            conn.finish(Outcome.ERROR, f"internal error: {type(exc).__name__}: {self._camlog.scrub(str(exc))}")
        finally:
            self._release(source)
            conn.finish(Outcome.ERROR, "connection ended")  # no-op when it already has an outcome

    def _release(self, source: Source | None) -> None:
        if source is None:
            return
        try:
            source.release()
        except Exception as exc:  # noqa: BLE001 - a failing release must not hide the real outcome
            self._camlog.exception("releasing the capture failed", exc)

    def _record_error(self, reason: str | None) -> None:
        """The camera's current failure, and its latest one with the time (kept after a recovery)."""
        if reason:
            with self._lock:
                self._counters.error = self._counters.last_error = self._camlog.scrub(reason)
                self._counters.last_error_at = utc_timestamp()
