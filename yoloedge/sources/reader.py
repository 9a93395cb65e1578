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

The reader is three parts: this module's `CameraReader` (the public surface, the state and its one
transition point, `_set_state`), the connection supervisor (`connection`: open, stall watch,
backoff, retries) and the frame delivery (`delivery`: pacing, sampling, the sink); they share a
`ReaderCounters` and a `CameraLog` (`readercore`). Lock order: `_state_lock` (state changes and
their callbacks, in order), then the counters' lock `_lock`, a leaf; `FrameDelivery.deliver_lock`
is held around each sink call and taken with neither.

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
import threading
import time
from typing import Callable

from ..config.schema import CameraConfig
from ..redact import SECRETS
from .dvpp import MediaEngine
from .connection import ConnectionSupervisor
from .delivery import FrameDelivery
from .frame import FrameSink
from .framepool import FramePool
from .imagesize import DEFAULT_LIMITS, ImageLimits
from .opening import camera_description
from .readercore import CameraLog, ReaderCounters
from .state import CameraState

log = logging.getLogger(__name__)

StateCallback = Callable[[str, CameraState, "str | None"], None]


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
                 pool: FramePool | None = None, limits: ImageLimits = DEFAULT_LIMITS,
                 media: MediaEngine | None = None):
        self._config = config
        self._on_state = on_state
        self._clock = clock
        SECRETS.add_url(config.url)  # for scrubbing and the log filter: the raw URL in any form it is quoted
        self._safe_url = camera_description(config)  # registers the URLs of a pipeline: too
        self._camlog = CameraLog(config.name, log)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # this reader's counters; never shared with other readers
        self._counters = ReaderCounters(decoder=config.decoder)
        #: serializes state changes and their callbacks, so listeners see them in order
        self._state_lock = threading.RLock()
        self._state = CameraState.CONNECTING if config.enabled else CameraState.DISABLED
        self._reported: CameraState | None = None  # the last state given to on_state
        self._started = False
        self._supervisor: threading.Thread | None = None
        self._supervisor_done = False
        self._delivery = FrameDelivery(config, sink, clock=clock, pool=pool, limits=limits, counters=self._counters,
                                       lock=self._lock, camlog=self._camlog)
        self._connections = ConnectionSupervisor(config, self._delivery, stall_timeout_s=stall_timeout_s, clock=clock,
                                                 stop=self._stop, set_state=self._set_state, safe_url=self._safe_url,
                                                 pool=pool, limits=limits, counters=self._counters, lock=self._lock,
                                                 camlog=self._camlog, media=media)

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
            current = self._connections.current
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
        if not self._delivery.deliver_lock.acquire(timeout=remaining):  # a put still under way
            return False
        self._delivery.deliver_lock.release()
        return True

    def is_alive(self) -> bool:
        """True until the supervisor has finished (see join())."""
        return self._supervisor is not None and self._supervisor.is_alive()

    def open_captures(self) -> int:
        """Connection threads still running, each holding at most one capture (abandoned ones
        release theirs when their blocked read returns)."""
        return self._connections.open_captures()

    def stats(self) -> dict:
        now = self._clock()
        with self._lock:
            counted = self._counters
            return {
                "state": self._state.value,
                "url": self._safe_url,
                "frames_in": counted.frames_in,
                "frames_out": counted.frames_out,
                "sampled_out": counted.sampled_out,
                "late_frames": counted.late_frames,
                "reconnects": counted.reconnects,
                "stalls": counted.stalls,
                "images_skipped": counted.images_skipped,
                "jpeg_decoder": counted.jpeg_decoder,
                "decoder": counted.decoder,
                "decoder_reason": counted.decoder_reason,
                "frame_size": None if counted.frame_size is None else "{}x{}".format(*counted.frame_size),
                "size_changes": counted.size_changes,
                "last_frame_age_s": None if counted.last_good_at is None else round(now - counted.last_good_at, 3),
                "fps_in": round(self._delivery.rate_in.rate(), 2),
                "fps_out": round(self._delivery.rate_out.rate(), 2),
                "consecutive_failures": self._connections.consecutive_failures,
                "retry_in_s": counted.retry_in_s,
                "error": counted.error,
                "last_error": counted.last_error,
                "last_error_at": counted.last_error_at,
            }

    # -- supervisor thread, and the one transition point -----------------------------------------
    def _run(self) -> None:
        """The supervisor thread: connection attempts and backoff until a terminal state."""
        final: tuple[CameraState, str | None] = (CameraState.STOPPED, "stop requested")
        try:
            final = self._connections.supervise()
        except BaseException as exc:  # a bug in the state machine itself: never die silently
            self._camlog.exception("camera reader crashed", exc)
            final = (CameraState.FAILED, f"internal error: {type(exc).__name__}: {self._camlog.scrub(str(exc))}")
        finally:
            current = self._connections.current
            if current is not None:
                current.abandon()  # whatever ended the supervisor, its connection must not go on
            with self._state_lock:  # decides, with stop(), who reports `stopped`
                self._supervisor_done = True
                if self._stop.is_set():
                    final = (CameraState.STOPPED, final[1] if final[0] is CameraState.STOPPED else "stop requested")
                self._set_state(*final)

    def _set_state(self, state: CameraState, reason: str | None) -> None:
        reason = self._camlog.scrub(reason) if reason else reason
        with self._state_lock:
            with self._lock:
                if self._reported is state and state.terminal:
                    return  # report a terminal state once
                self._state = self._reported = state
            self._camlog.log(_LEVEL_BY_STATE.get(state, logging.INFO), "camera %s: %s%s", self.name, state.value,
                             f" ({reason})" if reason else "")
            if self._on_state is None:
                return
            try:
                self._on_state(self.name, state, reason)
            except Exception as exc:  # noqa: BLE001 - a faulty listener must not break the reader
                self._camlog.exception("state callback failed", exc)


_LEVEL_BY_STATE = {
    CameraState.STALLED: logging.WARNING,
    CameraState.BACKOFF: logging.WARNING,
    CameraState.FAILED: logging.ERROR,
}
