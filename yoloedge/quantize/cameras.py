"""Calibration frames taken from the configured cameras (`yoloedge quantize --cameras`).

Each camera is read with the daemon's own source code (`sources.opening.open_camera`, `grab()` /
`retrieve()`, `release()`), so its frames are decoded as the daemon decodes them. What a camera
gives depends on what it is:

* a video file or a folder of images: frames spread over its whole length (`frames.split`), so a
  clip calibrates on its whole scene, not on its first second;
* a live camera (RTSP, HTTP/MJPEG, V4L2, a `pipeline:`, a synthetic one): frames `interval_s`
  apart, so calibration sees more than one moment. The camera is grabbed all along (grabbing
  without retrieving is cheap) and the first frame grabbed after each interval is kept: a stream
  left unread fills its buffer, and the next read would hand over a stale frame;
* a file or pipeline whose length is unknown: consecutive frames.

A network stream that goes silent makes FFmpeg wait out the read timeout and then hand over
frames it held back, looking fresh (`sources.delivery`); a grab that took most of the read
timeout therefore ends that camera's reading, keeping the frames taken before it.

The calibration frames and the held-out frames of the report are taken in one pass and never
overlap: a camera's frames (moments, for a live camera) are split as `frames.split` splits a
video, the held-out ones between the calibration ones.

The frames are shared out evenly over the cameras that open (`allocate`): every camera is
opened first, and a folder of two images gives two while the others make up the rest, so a dead
camera costs no calibration frames as long as another can give them.

The cameras are read at once, one thread each: a thread owns its source from open to release
(a source is used by one thread only, `sources.base`). The calling thread watches them: an open
that outlives the camera's `open_timeout_s`, or a grab its `read_timeout_s` (each plus
`GRACE_S`), abandons the camera -- reported and skipped, the others go on -- and its thread is
left to return from the call and release its capture itself, as the daemon's reader does. A
camera that cannot be opened or read is reported the same way. Lock order: each `_CameraRun`'s
`_lock` is a leaf.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Sequence

from ..config.schema import CameraConfig
from ..errors import YoloedgeError
from ..redact import redact_text
from ..sources.base import Source, SourceKind, local_path, source_kind
from ..sources.delivery import LATE_READ_FRACTION
from ..sources.opening import camera_description, open_camera
from .frames import Frame, MediaError, source_length, split

log = logging.getLogger(__name__)

#: how much longer than its own timeout an open or a grab may take before the camera is abandoned
#: (the source's own timeout fires first where it has one; this bounds those that have none)
GRACE_S = 1.0
#: how often the calling thread looks at the cameras
WATCH_POLL_S = 0.05

Warn = Callable[[str], None]


class Phase(Enum):
    OPENING = "opening"
    WAITING = "waiting"  # open, for its share of the frames
    READING = "reading"
    DONE = "done"


@dataclass(frozen=True)
class Share:
    """What one camera is asked for."""

    calibrate: int
    evaluate: int

    @property
    def total(self) -> int:
        return self.calibrate + self.evaluate


@dataclass
class CameraFrames:
    """What one camera gave: its calibration and held-out frames, or why it gave none."""

    name: str
    calibration: list[Frame] = field(default_factory=list)
    held_out: list[Frame] = field(default_factory=list)
    #: why the camera was skipped (redacted); None when it gave frames
    problem: str | None = None


@dataclass(frozen=True)
class CameraSample:
    """Every camera's frames, in the cameras' order, and the ones skipped."""

    cameras: list[CameraFrames]

    @property
    def calibration(self) -> list[Frame]:
        return [f for c in self.cameras for f in c.calibration]

    @property
    def held_out(self) -> list[Frame]:
        return [f for c in self.cameras for f in c.held_out]

    def used(self) -> list[CameraFrames]:
        return [c for c in self.cameras if c.problem is None and (c.calibration or c.held_out)]

    def skipped(self) -> dict[str, str]:
        return {c.name: c.problem for c in self.cameras if c.problem is not None}


def even(total: int, count: int) -> list[int]:
    """`total` split over `count` parts as evenly as can be, the first parts taking the rest."""
    if count <= 0:
        return []
    base, rest = divmod(max(total, 0), count)
    return [base + (1 if i < rest else 0) for i in range(count)]


def allocate(total: int, capacities: Sequence[int | None]) -> list[int]:
    """`total` frames over cameras that hold `capacities` frames each (None: no end, a live
    camera), evenly, what a short camera cannot give going to the others."""
    given = [0] * len(capacities)

    def room(i: int) -> int | None:
        cap = capacities[i]
        return None if cap is None else cap - given[i]

    left = total
    takers = [i for i in range(len(capacities)) if room(i) != 0]
    while left > 0 and takers:
        for i, want in zip(takers, even(left, len(takers))):
            space = room(i)
            give = want if space is None else min(want, space)
            given[i] += give
            left -= give
        takers = [i for i in takers if room(i) != 0]
    return given


def sample_cameras(cameras: Sequence[CameraConfig], calibrate: int, evaluate: int, interval_s: float,
                   warn: Warn, clock: Callable[[], float] = time.monotonic) -> CameraSample:
    """Read every camera at once and return what each gave; `warn` is told of each camera
    skipped (or ending early) as it happens. Every camera is opened first, then the frames are
    shared out over those that opened (`allocate`: a folder of two images gives two, the others
    make up the rest). A camera's thread that crashed re-raises here."""
    runs = [_CameraRun(camera, interval_s, clock) for camera in cameras]
    for run in runs:
        run.start()
    _watch(runs, warn, lambda run: run.opened(), clock)
    ready = [run for run in runs if not run.finished()]
    capacities = [run.capacity() for run in ready]
    calib = allocate(calibrate, capacities)
    rest = [None if cap is None else cap - c for cap, c in zip(capacities, calib)]
    for run, c, e in zip(ready, calib, allocate(evaluate, rest)):
        run.assign(Share(c, e))
    _watch(runs, warn, lambda run: run.finished(), clock)
    for run in runs:
        run.raise_crash()
    return CameraSample([run.result() for run in runs])


def _watch(runs: "list[_CameraRun]", warn: Warn, until: "Callable[[_CameraRun], bool]",
           clock: Callable[[], float]) -> None:
    """Until `until` holds for every camera: abandon those overdue, tell of those that end."""
    pending = list(runs)
    while pending:
        now = clock()
        for run in list(pending):
            overdue = run.overdue(now)
            if overdue is not None:
                run.abandon(overdue)
            if run.finished():
                run.tell(warn)
            if until(run) or run.finished():
                pending.remove(run)
        if pending:
            time.sleep(WATCH_POLL_S)


class _CameraRun:
    """One camera's thread and what it has gathered; the watcher reads it through the lock."""

    def __init__(self, camera: CameraConfig, interval_s: float, clock: Callable[[], float]):
        self.camera = camera
        self.name = camera.name
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._phase = Phase.OPENING
        self._since = clock()  # when the open or grab in progress began
        self._capacity: int | None = None  # frames a file or folder holds; None: live or unknown
        self._share = Share(0, 0)
        self._assigned = threading.Event()  # the share is set (or the camera abandoned)
        self._abandoned = False
        self._told = False
        self._problem: str | None = None
        self._short: str | None = None  # it gave frames, but fewer than asked
        self._stopped: str | None = None  # why the camera's thread stopped reading a live camera early
        self._crash: Exception | None = None
        self._frames = CameraFrames(self.name)
        self._thread = threading.Thread(target=self._main, name=f"quantize-{self.name}", daemon=True)

    # -- the watcher's side ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def overdue(self, now: float) -> str | None:
        """Why the camera is to be abandoned now (an open or a grab past its timeout), or None."""
        config = self.camera
        with self._lock:
            if self._abandoned:
                return None
            waited = now - self._since
            if self._phase is Phase.OPENING and waited > config.open_timeout_s + GRACE_S:
                return f"did not open within its open_timeout_s ({config.open_timeout_s:g} s)"
            if self._phase is Phase.READING and waited > config.read_timeout_s + GRACE_S:
                return f"gave no frame within its read_timeout_s ({config.read_timeout_s:g} s)"
        return None

    def abandon(self, reason: str) -> None:
        """Give up on the camera; its thread releases the source when its call returns."""
        with self._lock:
            self._abandoned = True
            self._problem = reason
        self._assigned.set()

    def opened(self) -> bool:
        with self._lock:
            return self._phase is not Phase.OPENING

    def finished(self) -> bool:
        with self._lock:
            return self._abandoned or self._phase is Phase.DONE

    def capacity(self) -> int | None:
        with self._lock:
            return self._capacity

    def assign(self, share: Share) -> None:
        with self._lock:
            self._share = share
        self._assigned.set()

    def tell(self, warn: Warn) -> None:
        """Warn, once, of a camera skipped or cut short."""
        with self._lock:
            problem, short, told = self._problem, self._short, self._told
            self._told = True
        if told:
            return
        where = camera_description(self.camera)
        if problem is not None:
            warn(redact_text(f"camera {self.name} ({where}) {problem}; skipped"))
        elif short is not None:
            warn(redact_text(f"camera {self.name} ({where}) {short}"))

    def raise_crash(self) -> None:
        """Re-raise, in the watcher's thread, what crashed the camera's thread (a bug, not a camera)."""
        with self._lock:
            crash = self._crash
        if crash is not None:
            raise crash

    def result(self) -> CameraFrames:
        with self._lock:
            if self._problem is not None:
                return CameraFrames(self.name, problem=self._problem)
            return CameraFrames(self.name, list(self._frames.calibration), list(self._frames.held_out))

    # -- the camera's thread -----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._read()
        except Exception as exc:  # re-raised in the watcher's thread by raise_crash
            with self._lock:
                self._crash = exc
        finally:
            with self._lock:
                self._phase = Phase.DONE
            self._assigned.set()

    def _read(self) -> None:
        config = replace(self.camera, loop=False)  # a looping file would hand its frames over twice
        try:
            source, _ = open_camera(config, camera=self.name)
        except YoloedgeError as exc:  # SourceError, and the GStreamer or PyAV one naming what to install
            self._fail(f"cannot be opened: {exc}")
            return
        try:
            length = 0 if source.is_live else self._length()
            with self._lock:
                self._capacity = length or None
                self._phase = Phase.WAITING
            self._assigned.wait()
            with self._lock:
                share, abandoned = self._share, self._abandoned
            if abandoned or share.total == 0:
                return
            self._begin(Phase.READING)
            if length > 0:
                parts = split(length, share.calibrate, share.evaluate)
                taken = self._take_spread(source, sorted(parts.calibration + parts.held_out))
            else:
                parts = split(share.total, share.calibrate, share.evaluate)
                taken = self._take_timed(source, share.total, self._interval_s if source.is_live else 0.0)
            self._keep(source, taken, set(parts.calibration), share.total)
        finally:
            source.release()

    def _length(self) -> int:
        """Frames of a file camera, images of a folder camera; 0 when it cannot be told."""
        config = self.camera
        if config.pipeline or source_kind(config.url) not in (SourceKind.FILE, SourceKind.FOLDER):
            return 0
        try:
            return source_length(local_path(config.url))
        except MediaError:
            return 0
    def _take_spread(self, source: Source, indices: list[int]) -> list[tuple[int, Frame]]:
        """The frames at `indices` (sorted) of a file or folder, by grabbing up to the last."""
        wanted = set(indices)
        taken: list[tuple[int, Frame]] = []
        index = 0
        last = indices[-1] if indices else -1
        while wanted and index <= last:
            if not self._grab(source):
                break
            if index in wanted:
                image = source.retrieve()
                if image is not None:
                    taken.append((index, Frame(f"{self.name}#{index}", image)))
                wanted.discard(index)
            index += 1
        return taken

    def _take_timed(self, source: Source, count: int, interval_s: float) -> list[tuple[int, Frame]]:
        """`count` frames `interval_s` apart: every frame is grabbed, the first after each interval kept."""
        taken: list[tuple[int, Frame]] = []
        late_after = self._late_after(source)
        start = self._clock()
        next_at = start
        while len(taken) < count:
            began = self._clock()
            if not self._grab(source):
                break
            now = self._clock()
            if late_after is not None and now - began >= late_after:
                self._stopped = (f"went silent (a read waited {now - began:.1f} s of its read_timeout_s "
                                 f"{self.camera.read_timeout_s:g} s and gave a held-back frame)")
                break
            if now < next_at:
                continue
            image = source.retrieve()
            if image is None:
                break
            taken.append((len(taken), Frame(f"{self.name}@{now - start:.1f}s", image)))
            next_at = now + interval_s
        return taken

    def _late_after(self, source: Source) -> float | None:
        """How long a grab of an FFmpeg stream may take before its frame is one the decoder held
        back while the camera was silent (`sources.delivery`): the camera is read no further."""
        if source.kind not in (SourceKind.RTSP, SourceKind.HTTP):
            return None
        return LATE_READ_FRACTION * self.camera.read_timeout_s

    def _grab(self, source: Source) -> bool:
        """One grab, timed for the watcher; False at the end, on a failure or once abandoned."""
        if self._is_abandoned():
            return False
        self._begin(Phase.READING)
        ok = source.grab()
        return ok and not self._is_abandoned()

    def _keep(self, source: Source, taken: list[tuple[int, Frame]], calibration: set[int], wanted: int) -> None:
        with self._lock:
            if self._abandoned:
                return
            for index, frame in taken:
                (self._frames.calibration if index in calibration else self._frames.held_out).append(frame)
        why = self._stopped or source.error or ("it ended" if source.eof else "a frame could not be retrieved")
        if not taken:
            self._fail(f"gave no frame: {why}")
        elif len(taken) < wanted and (self._stopped or source.error):
            with self._lock:
                self._short = f"gave {len(taken)} of {wanted} frames: {why}"
        log.debug("camera %s gave %d frames", self.name, len(taken))

    def _begin(self, phase: Phase) -> None:
        with self._lock:
            self._phase = phase
            self._since = self._clock()

    def _is_abandoned(self) -> bool:
        with self._lock:
            return self._abandoned

    def _fail(self, problem: str) -> None:
        with self._lock:
            if self._problem is None:
                self._problem = redact_text(problem)  # it goes into the report too
