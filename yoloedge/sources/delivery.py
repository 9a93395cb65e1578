"""How a camera's frames reach its sink: pacing, sampling, late frames, the pixel bound, the sink call.

`FrameDelivery.pump` runs on a connection thread (see `reader`), from the source's first frame to
its end or the connection's cancellation: it grabs every frame, paces a file as a camera would
deliver it, drops the frames a frozen stream's decoder held back (late reads), samples down to the
camera's fps, and only then retrieves the kept frame -- into a buffer lent from the `FramePool`
for as long as the sink call lasts -- and hands it to the sink.

Locks: `deliver_lock` is held around each sink call, so `CameraReader.join()` can be sure that no
abandoned connection still delivers; the counters' lock (a leaf) is taken for single updates.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..config.schema import CameraConfig
from ..metrics import RateMeter
from .base import Source, SourceKind
from .frame import Frame, FrameSink
from .framepool import FramePool
from .imagesize import ImageLimits, over_pixel_bound
from .readercore import CameraLog, Connection, Outcome, ReaderCounters

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


class FrameDelivery:
    """Reads an opened source into the camera's sink (`pump`), counting what it reads, drops and
    delivers in the reader's `ReaderCounters`. One per reader, used by one connection thread at a
    time (an abandoned one only until its cancelled read returns)."""

    def __init__(self, config: CameraConfig, sink: FrameSink, *, clock: Callable[[], float], pool: FramePool | None,
                 limits: ImageLimits, counters: ReaderCounters, lock: threading.Lock, camlog: CameraLog):
        self._config = config
        self._name = config.name
        self._sink = sink
        self._clock = clock
        self._pool = pool
        self._limits = limits
        self._counters = counters
        self._lock = lock  # the counters'
        self._camlog = camlog
        #: held around each sink call, so join() can be sure no abandoned connection still delivers
        self.deliver_lock = threading.Lock()
        self.rate_in = RateMeter(RATE_WINDOW_S, clock)
        self.rate_out = RateMeter(RATE_WINDOW_S, clock)

    def pump(self, conn: Connection, source: Source) -> None:
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
                why = source.error or f"{source.description}: a frame of no size"
                conn.finish(Outcome.ERROR, self._camlog.scrub(why))
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
                    self._counters.sampled_out += 1
                continue
            if not self._retrieve_and_deliver(conn, source, size, seq):
                return

    def _size_ok(self, conn: Connection, source: Source, size: tuple[int, int]) -> bool:
        """Refuse a frame over the pixel bound (the connection fails); note a change of size."""
        too_large = over_pixel_bound(size[0], size[1], self._limits)
        if too_large is not None:
            conn.finish(Outcome.ERROR, self._camlog.scrub(f"{source.description}: a frame of {too_large}"))
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
                conn.finish(Outcome.ERROR, self._camlog.scrub(source.error or f"{source.description}: retrieve failed"))
                return False
            actual = (int(image.shape[1]), int(image.shape[0]))
            if actual != size and not self._size_ok(conn, source, actual):  # the source said another size
                return False
            captured = time.time()
            position = source.position_s()
            self._deliver(conn, Frame(self._name, seq, image, captured, time.monotonic(),
                                      None if position is None else conn.opened_wall + position,
                                      source.take_picture()))
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
            conn.finish(Outcome.ERROR, self._camlog.scrub(source.error or "read failed"))

    def _count_frame_in(self, conn: Connection) -> int | None:
        """The frame's seq (frames read since the reader started); None if the connection was
        abandoned meanwhile, so an orphaned thread never interleaves its frames with the next."""
        with self._lock:
            if conn.cancelled.is_set():
                return None
            seq = self._counters.frames_in
            self._counters.frames_in += 1
        self.rate_in.mark()
        return seq

    def _count_skipped(self, conn: Connection, source: Source) -> None:
        """Add the images the source skipped since the last look to the reader's count."""
        new = source.skipped - conn.skipped_seen
        if new > 0:
            conn.skipped_seen = source.skipped
            with self._lock:
                self._counters.images_skipped += new

    def _note_size(self, conn: Connection, source: Source, size: tuple[int, int]) -> None:
        """Say once per connection and size when a camera's frames change size (it switched its
        resolution): mid-stream, where the source hands frames over at their own size (GStreamer,
        the MJPEG reader; OpenCV's FFmpeg scales them to the connection's first size), or from one
        connection to the next. The images of a folder may have any size."""
        if size == conn.size:
            return
        mid_stream = conn.size is not None
        with self._lock:
            before, self._counters.frame_size = self._counters.frame_size, size
            changed = before is not None and before != size and source.kind is not SourceKind.FOLDER
            if changed:
                self._counters.size_changes += 1
        conn.size = size
        if not changed or before is None or size in conn.sizes_told:
            return
        conn.sizes_told.add(size)
        if mid_stream:
            self._camlog.log(logging.WARNING, "camera %s: frames changed size mid-stream, %dx%d to %dx%d (the camera "
                             "changed its resolution); they go on at the new size", self._name, *before, *size)
        else:
            self._camlog.log(logging.WARNING, "camera %s: frames are %dx%d since this connection, %dx%d before (the "
                             "camera changed its resolution)", self._name, *size, *before)

    def _count_late(self, read_s: float) -> None:
        with self._lock:
            self._counters.late_frames += 1
        self._camlog.log(logging.DEBUG, "camera %s: frame came %.1f s late (held back by the decoder), not used",
                         self._name, read_s)

    def _note_good_frame(self, conn: Connection, size: tuple[int, int], now: float) -> None:
        conn.last_good_at = now
        if conn.first_frame_at is None:
            conn.frame_size = size
            conn.first_frame_at = now
            conn.wakeup.set()
        with self._lock:
            self._counters.last_good_at = now

    def _deliver(self, conn: Connection, frame: Frame) -> None:
        """Hand a frame to the sink. A lossless sink blocks; we wait in slices so stop() is
        honoured. The cancel check and the sink call happen under `_deliver_lock`, so once join()
        has passed that lock an abandoned connection can never deliver another frame."""
        try:
            while True:
                with self.deliver_lock:
                    if conn.cancelled.is_set():
                        return
                    if self._sink(frame, PUT_SLICE_S):
                        break
        finally:
            if frame.picture is not None:  # the reader's hold; each model's entry holds its own
                frame.picture.release()
        with self._lock:
            self._counters.frames_out += 1
        self.rate_out.mark()

    def _log_plan(self, source: Source, plan: DeliveryPlan) -> None:
        cfg = self._config
        fps = f"{source.nominal_fps:.2f}" if source.nominal_fps else "unknown"
        self._camlog.log(logging.INFO, "camera %s: opened %s source %s (fps %s); pacing %s, sampling %s",
                         self._name, source.kind.value, self._camlog.scrub(source.description), fps,
                         f"{plan.pace_fps:.2f} fps" if plan.pace_fps else "off", type(plan.sampler).__name__)
        if source.is_live and cfg.realtime is False:
            self._camlog.log(logging.WARNING, "camera %s: realtime: false applies to files only; ignored for a live "
                             "source", self._name)
        elif not source.is_live and cfg.fps and isinstance(plan.sampler, KeepAll) and not plan.pace_fps:
            self._camlog.log(logging.WARNING, "camera %s: source has no frame rate to sample against; fps ignored",
                             self._name)
        elif not source.is_live and cfg.realtime is not False and plan.pace_fps is None:
            self._camlog.log(logging.WARNING, "camera %s: %s has no frame rate to play at; frames go out as fast as "
                             "they are read (set fps, or realtime: false to process every one)", self._name,
                             source.kind.value)


_END_OF = {SourceKind.FILE: "end of file", SourceKind.FOLDER: "end of folder"}
