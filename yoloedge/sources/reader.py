"""One reader per camera: opens the source, keeps it alive, samples frames into the camera's sink.

Two kinds of threads per camera, and why:

* the *supervisor* (one per reader, for its whole life) runs the state machine -- connecting,
  streaming, stalled, backoff, failed, ended, stopped -- and the stall watchdog;
* a *connection* thread (one per connection attempt) opens the source, reads, paces, samples and
  queues frames, and releases its capture itself when it is done.

A frozen RTSP camera blocks `read()` for the whole read timeout, and even returns stale frames
a couple of times before it fails (research/infra.md). So the supervisor does not wait for
read() to fail: when no good frame arrived for `stall_timeout_s` it abandons the connection and
reconnects. A frame counts as good only if its read did not need (nearly) the whole read timeout
and it did not come right after such a late read (the decoder's held-back frames; see
RECOVERY_FRACTION). The abandoned thread is left to return from its read and release its own
capture: releasing an OpenCV capture while another thread is inside read() is not safe.

Nothing is shared between readers but a `FramePool` (a lock held for a list operation, never
waited on otherwise), so one broken camera cannot slow another. Frames leave through a sink
callable (see `frame.FrameSink`): the reader does not know what is behind it.

Every frame is grabbed (decoded), but only the frames the camera keeps are retrieved (converted
to BGR and copied): a camera sampled from 30 to 5 fps converts one frame in six. With a pool, a
kept frame of an OpenCV capture is retrieved into a buffer lent for the sink call and given back
when the sink returns; other sources decode into an array of their own (`reuse_frame`).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import traceback
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from ..backoff import Backoff
from ..config.schema import CameraConfig
from ..metrics import RateMeter
from ..redact import SECRETS, redact_text
from ..threads import lower_priority
from ..timeutil import utc_timestamp
from .base import Source, SourceError, SourceKind, UnsupportedSourceError
from .frame import Frame, FrameSink, SinkClosed
from .framepool import FramePool
from .opening import camera_description, open_camera
from .imagesize import DEFAULT_LIMITS, ImageLimits, over_pixel_bound
from .state import CameraState

log = logging.getLogger(__name__)

StateCallback = Callable[[str, CameraState, "str | None"], None]

#: a connection that delivered frames this long resets the backoff delay to backoff_initial_s;
#: shorter ones (a flapping camera) keep doubling it, so they cannot hammer the camera.
STABLE_STREAM_S = 10.0
#: backoff delays vary by this fraction either way, so cameras behind one NVR don't reconnect in step
BACKOFF_JITTER = 0.2
#: the supervisor re-checks its connection at least this often
SUPERVISOR_POLL_S = 0.25
#: a lossless put waits this long at a time, then checks whether the reader is stopping
PUT_SLICE_S = 0.25
#: a stream read that took this fraction of the read timeout returned a frame the decoder held
#: back while the stream was silent, not a new one: it is not used.
LATE_READ_FRACTION = 0.9
#: after such a late read the decoder also hands out the rest of what it held back, at once and
#: looking fresh. Only a frame this long after the last late read (a fraction of the read
#: timeout, at most the cap) shows that the camera really sends again and restarts the stall clock.
RECOVERY_FRACTION = 0.5
RECOVERY_CAP_S = 2.0
#: a paced file more than this far behind its schedule starts a new schedule instead of bursting
PACING_SLACK_S = 1.0
RATE_WINDOW_S = 5.0


class Outcome(Enum):
    """How one connection attempt ended."""

    ENDED = "ended"  # a finite source was read to its end
    ERROR = "error"  # open failed, the stream broke, or the reader hit a bug
    STALLED = "stalled"  # the watchdog gave up on a silent source
    STOPPED = "stopped"  # stop() was called
    SINK_CLOSED = "sink closed"  # the camera's sink takes no more frames: it is being removed
    UNSUPPORTED = "unsupported"  # the URL can never work


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    reason: str | None
    streamed_s: float | None  # how long it delivered good frames; None if it never did


class KeepAll:
    """No sampling: every frame goes to the queue."""

    def keep(self, index: int, now: float) -> bool:
        return True


class IndexSampler:
    """Keeps frames of a file evenly by frame index: deterministic, independent of decode speed.

    Frame i is kept when it starts a new 1/fps slot of the file's timeline.
    """

    def __init__(self, source_fps: float, fps: float):
        self._ratio = fps / source_fps

    def keep(self, index: int, now: float) -> bool:
        if index == 0:
            return True
        return math.floor(index * self._ratio + 1e-9) > math.floor((index - 1) * self._ratio + 1e-9)

    def __repr__(self) -> str:
        return f"IndexSampler(ratio={self._ratio:.3f})"


class TimeSampler:
    """Thins a live stream to `fps` frames per second on average.

    Each kept frame books the next slot one period later, so a 25 fps camera sampled to 10 fps
    really gives 10 fps (keeping a frame only once a full period has passed would give 8.3, as
    frames arrive on a 40 ms grid). A source more than a period late (after a gap) starts a new
    schedule instead of catching up in a burst.
    """

    def __init__(self, fps: float):
        self._period = 1.0 / fps
        self._next_due: float | None = None

    def keep(self, index: int, now: float) -> bool:
        if self._next_due is not None and now < self._next_due:
            return False
        late = 0.0 if self._next_due is None else now - self._next_due
        self._next_due = (self._next_due + self._period) if late < self._period and self._next_due is not None \
            else now + self._period
        return True


@dataclass(frozen=True)
class DeliveryPlan:
    """How the frames of one source reach the queue: pacing (files played as a camera would
    deliver them) and sampling down to the configured fps."""

    pace_fps: float | None
    sampler: KeepAll | IndexSampler | TimeSampler
    detects_late_reads: bool  # only FFmpeg streams return held-back frames after a timeout


def delivery_plan(config: CameraConfig, source: Source) -> DeliveryPlan:
    """Decide pacing and sampling for a freshly opened source (see CameraConfig.fps/realtime)."""
    fps = config.fps if config.fps and config.fps > 0 else None
    if source.is_live:
        late_reads = source.kind in (SourceKind.RTSP, SourceKind.HTTP)
        return DeliveryPlan(None, TimeSampler(fps) if fps else KeepAll(), late_reads)
    if config.realtime is False:
        if fps and source.nominal_fps:
            return DeliveryPlan(None, IndexSampler(source.nominal_fps, fps), False)
        return DeliveryPlan(None, KeepAll(), False)
    pace = source.nominal_fps or fps
    if fps and pace and fps < pace:
        return DeliveryPlan(pace, IndexSampler(pace, fps), False)
    return DeliveryPlan(pace, KeepAll(), False)


class Connection:
    """One connection attempt. Its thread owns the source; the supervisor only reads these
    fields and sets `cancelled`."""

    def __init__(self, number: int, now: float):
        self.number = number
        self.cancelled = threading.Event()  # supervisor: stop, stall or give-up; the thread exits
        self.wakeup = threading.Event()  # thread: first frame or finished; the supervisor looks
        self.started_at = now
        self.opened_at: float | None = None
        self.opened_wall = 0.0  # time.time() when the source opened
        self.first_frame_at: float | None = None
        self.last_good_at: float | None = None
        self.late_at: float | None = None  # when the last late read returned
        self.frame_size: tuple[int, int] | None = None  # of the first frame
        self.size: tuple[int, int] | None = None  # of the latest frame
        self.sizes_told: set[tuple[int, int]] = set()  # sizes a change to was logged for
        self.skipped_seen = 0  # the source's skipped-image count already added to the reader's
        #: while `reading`, a stall is counted from here: the start of the first read after the
        #: last good frame (time spent pacing or blocked on a full lossless queue does not count)
        self.progress_mark: float | None = None
        self.reading = False
        self.finished = False
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.thread: threading.Thread | None = None

    def finish(self, outcome: Outcome, reason: str | None) -> None:
        if self.finished:
            return
        self.outcome, self.reason = outcome, reason
        self.finished = True
        self.wakeup.set()

    def abandon(self) -> None:
        self.cancelled.set()

    def streamed_s(self, now: float) -> float | None:
        return None if self.first_frame_at is None else now - self.first_frame_at


class CameraReader:
    """Reads one camera into its sink, reconnecting with backoff, until stopped.

    `on_state(camera, state, reason)` is called on every state change, from the reader's own
    thread (or from stop()); it must not block for long.

    `limits` bounds what a camera may hand us: image files over it are skipped, and a stream
    whose frames are over its pixel bound fails like a broken one (backoff, retry), before the
    frame goes anywhere: one hostile camera must not take the memory every camera needs. The size
    of a frame is known from the source before it is retrieved, so an oversized one is refused
    before its BGR picture is made.

    With a `pool` the sink must be done with each frame when it returns (or have copied what it
    needs): OpenCV captures retrieve into buffers lent from the pool and given back right after
    the sink call; other sources decode the next frame into the same array.
    """

    def __init__(self, config: CameraConfig, sink: FrameSink, stall_timeout_s: float,
                 on_state: StateCallback | None = None, clock: Callable[[], float] = time.monotonic,
                 pool: FramePool | None = None, limits: ImageLimits = DEFAULT_LIMITS):
        self._config = config
        self._limits = limits
        self._sink = sink
        self._pool = pool
        self._stall_timeout_s = stall_timeout_s
        self._on_state = on_state
        self._clock = clock
        SECRETS.add_url(config.url)  # for _scrub and the log filter: the raw URL in any form it is quoted
        self._safe_url = camera_description(config)  # registers the URLs of a pipeline: too
        #: the video decoder in use (`auto` resolved once a connection has opened the source)
        self._decoder = config.decoder
        self._stop = threading.Event()
        self._lock = threading.Lock()  # this reader's counters; never shared with other readers
        #: serializes state changes and their callbacks, so listeners see them in order
        self._state_lock = threading.RLock()
        #: held around each sink call, so join() can be sure no abandoned connection still delivers
        self._deliver_lock = threading.Lock()
        self._random = random.Random()
        self._state = CameraState.CONNECTING if config.enabled else CameraState.DISABLED
        self._reported: CameraState | None = None  # the last state given to on_state
        self._started = False
        self._supervisor: threading.Thread | None = None
        self._supervisor_done = False
        self._connections: list[Connection] = []  # live connection threads, for join()
        self._current: Connection | None = None
        # counters (under _lock)
        self._frames_in = 0
        self._frames_out = 0
        self._sampled_out = 0
        self._late_frames = 0
        self._reconnects = 0
        self._stalls = 0
        self._images_skipped = 0
        self._jpeg_decoder: str | None = None  # the decoder the last opened source uses (folders, HTTP)
        self._error: str | None = None  # the failure the camera is in now; None once it streams again
        self._last_error: str | None = None  # the latest failure, kept after a recovery
        self._last_error_at: str | None = None  # when it happened (UTC)
        self._last_good_at: float | None = None
        self._frame_size: tuple[int, int] | None = None  # the latest frame's (width, height)
        self._size_changes = 0  # frames that came at another size than the one before them
        self._retry_in_s: float | None = None
        self._rate_in = RateMeter(RATE_WINDOW_S, clock)
        self._rate_out = RateMeter(RATE_WINDOW_S, clock)
        # backoff bookkeeping (supervisor thread only)
        self._consecutive_failures = 0
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, reset_after_s=STABLE_STREAM_S,
                                jitter=BACKOFF_JITTER, rng=self._random)

    # -- public API ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._config.name

    @property
    def state(self) -> CameraState:
        return self._state

    def start(self) -> None:
        """Start reading (once). A disabled camera only reports `disabled`; it is never opened."""
        with self._lock:
            if self._started or self._stop.is_set():
                return
            self._started = True
        if not self._config.enabled:
            self._set_state(CameraState.DISABLED, "enabled: false")
            return
        self._supervisor = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)
        self._supervisor.start()

    def stop(self) -> None:
        """Ask the reader to stop; returns at once (join() waits). Idempotent. Interrupts a
        backoff wait, pacing, a blocked lossless put and a connection attempt immediately; a
        capture blocked inside read() is released by its own thread when the read returns."""
        with self._state_lock:
            if self._stop.is_set():
                return
            self._stop.set()
            current = self._current
            if current is not None:
                current.abandon()
                current.wakeup.set()
            if self._supervisor is None or self._supervisor_done:
                self._set_state(CameraState.STOPPED, "stop requested")  # no supervisor left to report it

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the reader has stopped: its supervisor has finished (final state reported)
        and no frame will be queued any more. True when that is so within `timeout`.

        A capture thread blocked inside a frozen camera's read() is not waited for: it can take
        up to ~3 x read_timeout_s to return, then releases its capture and exits without
        touching the queue. `open_captures()` counts those.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._supervisor is not None:
            self._supervisor.join(timeout)
            if self._supervisor.is_alive():
                return False
        remaining = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._deliver_lock.acquire(timeout=remaining):  # a put still under way
            return False
        self._deliver_lock.release()
        return True

    def is_alive(self) -> bool:
        """True until the supervisor has finished (see join())."""
        return self._supervisor is not None and self._supervisor.is_alive()

    def open_captures(self) -> int:
        """Connection threads still running, each holding at most one capture (abandoned ones
        release theirs when their blocked read returns)."""
        return sum(1 for c in list(self._connections) if c.thread is not None and c.thread.is_alive())

    def stats(self) -> dict:
        now = self._clock()
        with self._lock:
            return {
                "state": self._state.value,
                "url": self._safe_url,
                "frames_in": self._frames_in,
                "frames_out": self._frames_out,
                "sampled_out": self._sampled_out,
                "late_frames": self._late_frames,
                "reconnects": self._reconnects,
                "stalls": self._stalls,
                "images_skipped": self._images_skipped,
                "jpeg_decoder": self._jpeg_decoder,
                "decoder": self._decoder,
                "frame_size": None if self._frame_size is None else "{}x{}".format(*self._frame_size),
                "size_changes": self._size_changes,
                "last_frame_age_s": None if self._last_good_at is None else round(now - self._last_good_at, 3),
                "fps_in": round(self._rate_in.rate(), 2),
                "fps_out": round(self._rate_out.rate(), 2),
                "consecutive_failures": self._consecutive_failures,
                "retry_in_s": self._retry_in_s,
                "error": self._error,
                "last_error": self._last_error,
                "last_error_at": self._last_error_at,
            }

    # -- supervisor ------------------------------------------------------------------------------
    def _run(self) -> None:
        """The supervisor thread: connection attempts and backoff until a terminal state."""
        final: tuple[CameraState, str | None] = (CameraState.STOPPED, "stop requested")
        try:
            final = self._supervise()
        except BaseException as exc:  # a bug in the state machine itself: never die silently
            self._log_exception("camera reader crashed", exc)
            final = (CameraState.FAILED, f"internal error: {type(exc).__name__}: {self._scrub(str(exc))}")
        finally:
            current = self._current
            if current is not None:
                current.abandon()  # whatever ended the supervisor, its connection must not go on
            with self._state_lock:  # decides, with stop(), who reports `stopped`
                self._supervisor_done = True
                if self._stop.is_set():
                    final = (CameraState.STOPPED, final[1] if final[0] is CameraState.STOPPED else "stop requested")
                self._set_state(*final)

    def _supervise(self) -> tuple[CameraState, str | None]:
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
                self._log_exception("camera reader error", exc)
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
            self._consecutive_failures = 0  # it worked: this is a new problem, not the same one
        else:
            self._consecutive_failures += 1
        limit = self._config.max_retries
        if limit > 0 and self._consecutive_failures >= limit:
            return CameraState.FAILED, f"{result.reason} ({self._consecutive_failures} failed attempts in a row)"
        return None

    def _attempt(self, number: int) -> AttemptResult:
        """One connection: start its thread, then watch it until it ends, stalls or we stop."""
        if number > 0:
            with self._lock:
                self._reconnects += 1
        self._set_state(CameraState.CONNECTING, f"opening {self._safe_url}" if number == 0
                        else f"reconnecting to {self._safe_url} (attempt {number + 1})")
        conn = Connection(number, self._clock())
        conn.thread = threading.Thread(target=self._connection_main, args=(conn,),
                                       name=f"camera-{self.name}-capture-{number}", daemon=True)
        self._track(conn)
        self._current = conn
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
                    self._error = None  # recovered: the failure is history (last_error, last_error_at)
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
            self._stalls += 1
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
            self._retry_in_s = round(delay, 2)
        self._set_state(CameraState.BACKOFF, f"{result.reason}; retrying in {delay:.1f} s")
        self._stop.wait(delay)
        with self._lock:
            self._retry_in_s = None

    def _streaming_reason(self, conn: Connection) -> str:
        if conn.frame_size is None:
            return "frames arriving"
        width, height = conn.frame_size
        return f"{width}x{height}"

    def _track(self, conn: Connection) -> None:
        """Remember connection threads until they have finished, for open_captures()."""
        self._connections = [c for c in self._connections if c.thread is not None and c.thread.is_alive()]
        self._connections.append(conn)

    # -- connection thread -----------------------------------------------------------------------
    def _connection_main(self, conn: Connection) -> None:
        lower_priority()  # decoding is host work: the device worker comes first (see yoloedge.threads)
        source: Source | None = None
        try:
            source, decoder = open_camera(self._config, camera=self.name, reuse_frame=self._pool is not None,
                                          image_limits=self._limits)
            with self._lock:
                self._jpeg_decoder = source.jpeg_decoder
                self._decoder = decoder.value
            conn.opened_at = conn.progress_mark = self._clock()
            conn.opened_wall = time.time()  # a file's frame times count from here (`Frame.frame_time`)
            if not conn.cancelled.is_set():
                self._pump(conn, source)
        except UnsupportedSourceError as exc:
            conn.finish(Outcome.UNSUPPORTED, self._scrub(str(exc)))
        except SourceError as exc:
            conn.finish(Outcome.ERROR, self._scrub(str(exc)))
        except SinkClosed:
            conn.finish(Outcome.SINK_CLOSED, "camera removed")
        except Exception as exc:  # noqa: BLE001 - logged; the supervisor backs off and retries
            self._log_exception("capture error", exc)
            conn.finish(Outcome.ERROR, f"internal error: {type(exc).__name__}: {self._scrub(str(exc))}")
        finally:
            self._release(source)
            conn.finish(Outcome.ERROR, "connection ended")  # no-op when it already has an outcome

    def _pump(self, conn: Connection, source: Source) -> None:
        """Grab, pace, sample, and retrieve and queue the kept frames, until the source ends or
        we are cancelled."""
        plan = delivery_plan(self._config, source)
        self._log_plan(source, plan)
        late_after = LATE_READ_FRACTION * self._config.read_timeout_s if plan.detects_late_reads else None
        recovery_s = min(RECOVERY_CAP_S, RECOVERY_FRACTION * self._config.read_timeout_s)
        schedule_start = self._clock()
        index = 0  # frames read from this source
        while not conn.cancelled.is_set():
            if plan.pace_fps is not None:
                schedule_start = self._pace(conn, schedule_start, index, plan.pace_fps)
                if conn.cancelled.is_set():
                    return
            grabbed, read_s = self._timed_grab(conn, source)
            self._count_skipped(conn, source)
            if conn.cancelled.is_set():
                return  # abandoned while reading: whatever came back is stale
            if not grabbed:
                timed_out = late_after is not None and read_s >= late_after
                self._finish_source(conn, source, timed_out)
                return
            size = source.grabbed_size()
            if size is None:  # the conversion that was to tell it failed
                conn.finish(Outcome.ERROR, self._scrub(source.error or f"{source.description}: a frame of no size"))
                return
            if not self._size_ok(conn, source, size):
                return
            seq = self._count_frame_in(conn)
            if seq is None:
                return
            frame_index, index = index, index + 1
            now = self._clock()
            if late_after is not None and read_s >= late_after:
                conn.late_at = now
                self._count_late(read_s)
                continue
            if conn.late_at is None or now - conn.late_at >= recovery_s:
                self._note_good_frame(conn, size, now)  # proof of life: restarts the stall clock
            if not plan.sampler.keep(frame_index, now):
                with self._lock:
                    self._sampled_out += 1
                continue
            if not self._retrieve_and_deliver(conn, source, size, seq):
                return

    def _size_ok(self, conn: Connection, source: Source, size: tuple[int, int]) -> bool:
        """Refuse a frame over the pixel bound (the connection fails); note a change of size."""
        too_large = over_pixel_bound(size[0], size[1], self._limits)
        if too_large is not None:
            conn.finish(Outcome.ERROR, self._scrub(f"{source.description}: a frame of {too_large}"))
            return False
        self._note_size(conn, source, size)
        return True

    def _retrieve_and_deliver(self, conn: Connection, source: Source, size: tuple[int, int], seq: int) -> bool:
        """The kept frame retrieved (into a buffer lent from the pool, given back once the sink
        has returned) and handed to the sink. False when the connection is to end."""
        width, height = size
        pool = self._pool if source.fills_buffers else None
        lent = pool.take((height, width, 3)) if pool is not None else None
        try:
            image = source.retrieve(lent)
            if image is None:
                conn.finish(Outcome.ERROR, self._scrub(source.error or f"{source.description}: retrieve failed"))
                return False
            actual = (int(image.shape[1]), int(image.shape[0]))
            if actual != size and not self._size_ok(conn, source, actual):  # the source said another size
                return False
            captured = time.time()
            position = source.position_s()
            self._deliver(conn, Frame(self.name, seq, image, captured, time.monotonic(),
                                      None if position is None else conn.opened_wall + position))
            return True
        finally:
            if pool is not None and lent is not None:
                pool.give(lent)

    def _pace(self, conn: Connection, schedule_start: float, index: int, fps: float) -> float:
        """Wait until frame `index` is due, as a camera would deliver it. Returns the schedule
        start, moved forward when reading fell far behind (so it does not burst to catch up)."""
        due = schedule_start + index / fps
        now = self._clock()
        if now - due > PACING_SLACK_S:
            return now - index / fps
        if due > now:
            conn.cancelled.wait(due - now)
        return schedule_start

    def _timed_grab(self, conn: Connection, source: Source) -> tuple[bool, float]:
        if conn.last_good_at is not None and conn.progress_mark is not None \
                and conn.progress_mark < conn.last_good_at:
            conn.progress_mark = self._clock()  # the stall clock starts with the first read after a good frame
        started = self._clock()
        conn.reading = True
        try:
            grabbed = source.grab()
        finally:
            conn.reading = False
        return grabbed, self._clock() - started

    def _finish_source(self, conn: Connection, source: Source, timed_out: bool) -> None:
        """Record why the source gave no frame. A stream read that failed only after its whole
        timeout means a camera that went silent without closing the connection: a stall."""
        if source.eof:
            conn.finish(Outcome.ENDED, _END_OF.get(source.kind, "end of stream"))
        elif timed_out:
            since = conn.last_good_at if conn.last_good_at is not None else conn.opened_at
            silent = f"{self._clock() - since:.1f} s" if since is not None else "the read timeout"
            conn.finish(Outcome.STALLED, f"no frame for {silent} (read timed out)")
        else:
            conn.finish(Outcome.ERROR, self._scrub(source.error or "read failed"))

    def _count_frame_in(self, conn: Connection) -> int | None:
        """The frame's seq (frames read since the reader started); None if the connection was
        abandoned meanwhile, so an orphaned thread never interleaves its frames with the next."""
        with self._lock:
            if conn.cancelled.is_set():
                return None
            seq = self._frames_in
            self._frames_in += 1
        self._rate_in.mark()
        return seq

    def _count_skipped(self, conn: Connection, source: Source) -> None:
        """Add the images the source skipped since the last look to the reader's count."""
        new = source.skipped - conn.skipped_seen
        if new > 0:
            conn.skipped_seen = source.skipped
            with self._lock:
                self._images_skipped += new

    def _note_size(self, conn: Connection, source: Source, size: tuple[int, int]) -> None:
        """Say once per connection and size when a camera's frames change size (it switched its
        resolution): mid-stream, where the source hands frames over at their own size (GStreamer,
        the MJPEG reader; OpenCV's FFmpeg scales them to the connection's first size), or from one
        connection to the next. The images of a folder may have any size."""
        if size == conn.size:
            return
        mid_stream = conn.size is not None
        with self._lock:
            before, self._frame_size = self._frame_size, size
            changed = before is not None and before != size and source.kind is not SourceKind.FOLDER
            if changed:
                self._size_changes += 1
        conn.size = size
        if not changed or before is None or size in conn.sizes_told:
            return
        conn.sizes_told.add(size)
        if mid_stream:
            self._log(logging.WARNING, "camera %s: frames changed size mid-stream, %dx%d to %dx%d (the camera "
                      "changed its resolution); they go on at the new size", self.name, *before, *size)
        else:
            self._log(logging.WARNING, "camera %s: frames are %dx%d since this connection, %dx%d before (the "
                      "camera changed its resolution)", self.name, *size, *before)

    def _count_late(self, read_s: float) -> None:
        with self._lock:
            self._late_frames += 1
        self._log(logging.DEBUG, "camera %s: frame came %.1f s late (held back by the decoder), not used",
                  self.name, read_s)

    def _note_good_frame(self, conn: Connection, size: tuple[int, int], now: float) -> None:
        conn.last_good_at = now
        if conn.first_frame_at is None:
            conn.frame_size = size
            conn.first_frame_at = now
            conn.wakeup.set()
        with self._lock:
            self._last_good_at = now

    def _deliver(self, conn: Connection, frame: Frame) -> None:
        """Hand a frame to the sink. A lossless sink blocks; we wait in slices so stop() is
        honoured. The cancel check and the sink call happen under `_deliver_lock`, so once join()
        has passed that lock an abandoned connection can never deliver another frame."""
        while True:
            with self._deliver_lock:
                if conn.cancelled.is_set():
                    return
                if self._sink(frame, PUT_SLICE_S):
                    break
        with self._lock:
            self._frames_out += 1
        self._rate_out.mark()

    def _release(self, source: Source | None) -> None:
        if source is None:
            return
        try:
            source.release()
        except Exception as exc:  # noqa: BLE001 - a failing release must not hide the real outcome
            self._log_exception("releasing the capture failed", exc)

    def _log_plan(self, source: Source, plan: DeliveryPlan) -> None:
        cfg = self._config
        fps = f"{source.nominal_fps:.2f}" if source.nominal_fps else "unknown"
        self._log(logging.INFO, "camera %s: opened %s source %s (fps %s); pacing %s, sampling %s",
                  self.name, source.kind.value, self._scrub(source.description), fps,
                  f"{plan.pace_fps:.2f} fps" if plan.pace_fps else "off", type(plan.sampler).__name__)
        if source.is_live and cfg.realtime is False:
            self._log(logging.WARNING, "camera %s: realtime: false applies to files only; ignored for a live source",
                      self.name)
        elif not source.is_live and cfg.fps and isinstance(plan.sampler, KeepAll) and not plan.pace_fps:
            self._log(logging.WARNING, "camera %s: source has no frame rate to sample against; fps ignored",
                      self.name)
        elif not source.is_live and cfg.realtime is not False and plan.pace_fps is None:
            self._log(logging.WARNING, "camera %s: %s has no frame rate to play at; frames go out as fast as "
                      "they are read (set fps, or realtime: false to process every one)", self.name,
                      source.kind.value)

    # -- state, errors, logging ------------------------------------------------------------------
    def _set_state(self, state: CameraState, reason: str | None) -> None:
        reason = self._scrub(reason) if reason else reason
        with self._state_lock:
            with self._lock:
                if self._reported is state and state.terminal:
                    return  # report a terminal state once
                self._state = self._reported = state
            self._log(_LEVEL_BY_STATE.get(state, logging.INFO), "camera %s: %s%s", self.name, state.value,
                      f" ({reason})" if reason else "")
            if self._on_state is None:
                return
            try:
                self._on_state(self.name, state, reason)
            except Exception as exc:  # noqa: BLE001 - a faulty listener must not break the reader
                self._log_exception("state callback failed", exc)

    def _record_error(self, reason: str | None) -> None:
        """The camera's current failure, and its latest one with the time (kept after a recovery)."""
        if reason:
            with self._lock:
                self._error = self._last_error = self._scrub(reason)
                self._last_error_at = utc_timestamp()

    def _scrub(self, text: str) -> str:
        """Remove credentials from text that may quote the URL (FFmpeg, OpenCV, exceptions): the raw
        URL and its secrets in whatever form they appear (registered above), then every URL in
        its display form."""
        return redact_text(text)

    def _log(self, level: int, msg: str, *args: object) -> None:
        log.log(level, msg, *args, extra={"camera": self.name})

    def _log_exception(self, what: str, exc: BaseException) -> None:
        """Log with the traceback, scrubbed: exception texts may quote the camera URL."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._log(logging.ERROR, "camera %s: %s\n%s", self.name, what, self._scrub(text).rstrip())


_END_OF = {SourceKind.FILE: "end of file", SourceKind.FOLDER: "end of folder"}

_LEVEL_BY_STATE = {
    CameraState.STALLED: logging.WARNING,
    CameraState.BACKOFF: logging.WARNING,
    CameraState.FAILED: logging.ERROR,
}
