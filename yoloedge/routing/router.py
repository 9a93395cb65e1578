"""The result path: one frame's detections -> the camera's filters -> stages -> every sink.

Post-processing calls the router (`ResultRouter.__call__`) in each camera's frame order (see
`pipeline.post`). Per frame it

1. applies the camera's filters (`classes`, `min_score`) on top of the model's thresholds;
2. builds one frozen `FrameResult` (what every sink sees of the frame);
3. runs the stages, in order (tracking, then zones and lines: see `stages`); a stage returns the
   result with its part filled in (`dataclasses.replace`), so each sees what those before it made;
4. calls every sink (`sinks/`) on its own: a sink that raises is counted (its `errors`, shown in
   status under `sinks`) and logged, rate-limited, and the other sinks still get the frame.

Camera state changes (reader threads) and camera lifecycle (the daemon: added, removed) go from the
router to the sinks directly, not through the pipeline.

Adding a sink is one module in `sinks/` (a `Sink` subclass) and one line in `sinks.REGISTRY`.

Threads: a camera belongs to one accelerator group, whose post-processing hands each model's
frames over one at a time and in order, so a camera's stages see the frames of one model
sequentially. A camera fed to several models has one result per frame and model, and those of
different models arrive on different threads at once, as do frames of cameras on different
groups: sinks are shared and must be thread-safe (each guards what it keeps), and a stage keeps
its state per camera and model. Lock order: a sink's own locks are leaves; the router's `_lock` guards
its error counters only and nothing is called while it is held.

Status shows per camera the frames published, rate, capture -> publish latency and where it went:

    queue      captured -> taken from the camera's queue for letterboxing
    batch      taken -> its batch started on the device (letterbox, waiting for the batch/device)
    inference  the device call
    publish    device done -> the router has the frame (decode, NMS); then filters and sinks
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..redact import redact_text
from ..postprocess import Detections
from ..publish.messages import class_mask, detection_message, filter_detections
from ..sources.state import CameraState
from ..pipeline.cameras import CameraRuntime
from ..pipeline.slots import OutputSet, SlotMeta

if TYPE_CHECKING:
    from ..config.schema import CameraConfig

log = logging.getLogger(__name__)

#: a failing sink or stage logs its traceback at most this often (seconds); every failure is counted
ERROR_LOG_INTERVAL_S = 30.0


@dataclass(frozen=True, eq=False)
class FrameResult:
    """One frame of one camera as every sink sees it. Valid only while the sinks run: `image`
    (when set) is a buffer that is reused for a later frame once the router returns."""

    camera: str
    seq: int
    capture_time: float  # wall clock, published as `ts`
    capture_mono: float
    frame_time: float  # the frame's own time (capture or media time): what tracking runs on
    taken_mono: float
    started_mono: float  # its batch started on the device
    inferred_mono: float  # ... and returned
    routed_mono: float  # the router has it (decoded, NMS done)
    detections: Detections  # after the model's thresholds and the camera's filters: published
    labels: Sequence[str]
    model: str  # the model's name (`models[].name`), as in the detections message
    runtime: CameraRuntime
    #: every candidate post-processing kept for a tracker (down to its low score), through the
    #: camera's `classes`; None when no stage asked for them (see `Stage.floor`)
    candidates: Detections | None = None
    shown: np.ndarray | None = None  # indices of `detections` within `candidates`
    #: per detection: its confirmed track's id, None while unconfirmed; None: no tracking
    track_ids: tuple[str | None, ...] | None = None
    tracks: Any = None  # tracking.TrackFrame of this frame (tracking on)
    events: Any = None  # events.EventBatch of this frame (zones or lines configured)
    image: np.ndarray | None = None  # the full frame, only when a stage asked for it (best shots)

    @property
    def config(self) -> CameraConfig:
        return self.runtime.config

    @property
    def wanted(self) -> bool:
        """The frame has detections, or the camera publishes empty frames too (`publish_empty`)."""
        return bool(len(self.detections)) or self.runtime.config.publish_empty

    @functools.cached_property
    def message(self) -> dict:
        """The detections message (docs/integrations/mqtt.md), built once for every sink that needs it."""
        message = detection_message(self.camera, self.seq, self.capture_time, self.detections,
                                    self.labels, self.model, (self.routed_mono - self.capture_mono) * 1000)
        if self.track_ids is not None:
            for det, track_id in zip(message["detections"], self.track_ids):
                det["track_id"] = track_id
        return message


def publishes_detections(config: CameraConfig) -> bool:
    """A camera's `publish` (events | detections | both): whether its per-frame detections go out."""
    mode = getattr(config, "publish", None)
    return mode is None or bool(mode.detections)


def publishes_events(config: CameraConfig) -> bool:
    """... and whether its events and counts go out on MQTT."""
    mode = getattr(config, "publish", None)
    return mode is None or bool(mode.events)


class Sink:
    """One consumer of results. Every hook is called on its own: what one raises is counted
    against this sink and does not reach the others. Subclasses override what they need."""

    #: shown in status under `sinks`, and in the logs
    name = "sink"

    def frame(self, result: FrameResult) -> None:
        """One frame, in the camera's frame order."""

    def events(self, camera: str, batch: Any) -> None:
        """An `events.EventBatch` that came outside a frame: the camera stopped or was removed,
        a reload changed its zones, shutdown."""

    def camera_state(self, camera: str, state: CameraState, reason: str | None, now: float) -> None:
        """A reader's state change (reader threads)."""

    def camera_added(self, config: CameraConfig) -> None:
        """The daemon added the camera (at start, or by a reload), before its first state."""

    def camera_removed(self, camera: str) -> None:
        """A reload removed the camera (not called on shutdown)."""

    def stats(self) -> dict:
        """What this sink adds to status (besides its error counts)."""
        return {}


class Stage:
    """Fills its part of a frame's result before the sinks run (e.g. tracking)."""

    name = "stage"

    def process(self, result: FrameResult) -> FrameResult:
        return result

    def done(self, result: FrameResult) -> None:
        """Every sink has had the frame (e.g. its full image may go)."""

    def camera_state(self, camera: str, state: CameraState) -> None:
        """A reader's state change (reader threads), before the sinks hear of it."""

    def floor(self, camera: str) -> float | None:
        """The lowest score this stage wants post-processing to keep for `camera` (candidates
        under the model's own threshold), or None."""
        return None

    def stats(self) -> dict:
        return {}


@dataclass
class _Errors:
    count: int = 0
    last_error: str | None = None
    last_logged: float = float("-inf")


class ResultRouter:
    """Post-processing's sink (see the module docstring)."""

    def __init__(self, cameras: Mapping[str, CameraRuntime], sinks: Sequence[Sink] = (),
                 stages: Sequence[Stage] = (), clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self._cameras = cameras
        self.sinks = tuple(sinks)
        self.stages = tuple(stages)
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()  # guards `_errors`; a leaf
        self._parts: tuple[Sink | Stage, ...] = (*self.sinks, *self.stages)
        self._errors: dict[str, _Errors] = {part.name: _Errors() for part in self._parts}

    # -- frames (post-processing threads) ----------------------------------------------------
    def __call__(self, meta: SlotMeta, dets: Detections, output_set: OutputSet) -> None:
        self.route(meta, dets, output_set.model.name, output_set.model.labels, output_set.started_mono,
                   output_set.inferred_mono)

    def route(self, meta: SlotMeta, dets: Detections, model: str, labels: Sequence[str], started_mono: float,
              inferred_mono: float) -> None:
        """One decoded frame of one model: filters, stages, every sink."""
        runtime = self._cameras.get(meta.camera)
        if runtime is None:  # removed by a reload while its frames were in flight
            return
        shown, candidates, index = self._filter(runtime, dets, labels)
        result = FrameResult(
            camera=meta.camera, seq=meta.seq, capture_time=meta.capture_time,
            capture_mono=meta.capture_mono, frame_time=meta.frame_time, taken_mono=meta.taken_mono,
            started_mono=started_mono, inferred_mono=inferred_mono, routed_mono=self._clock(),
            labels=labels, model=model, runtime=runtime, detections=shown,
            candidates=candidates, shown=index)
        for stage in self.stages:
            try:
                result = stage.process(result)
            except Exception as exc:  # noqa: BLE001 - a failing stage leaves its part out; the frame goes on
                self._failed(stage, exc, result.camera)
        self._each(lambda sink: sink.frame(result), result.camera)
        for stage in self.stages:
            try:
                stage.done(result)
            except Exception as exc:  # noqa: BLE001 - counted like its process()
                self._failed(stage, exc, result.camera)

    @staticmethod
    def _filter(runtime: CameraRuntime, dets: Detections, labels: Sequence[str]
                ) -> tuple[Detections, Detections | None, np.ndarray | None]:
        """(what is published, the tracker's candidates, where the published are among them).
        Candidates (post-processing kept scores below the model's thresholds: `floor`) go through
        the camera's `classes` only; what is published is the confident ones, also over its
        `min_score`."""
        min_score = runtime.config.min_score
        if dets.confident is None:
            return filter_detections(dets, labels, runtime.classes, min_score), None, None
        keep = class_mask(dets, labels, runtime.classes)
        candidates = dets if keep.all() else dets.take(keep)
        shown = candidates.confident if candidates.confident is not None else np.ones(len(candidates), bool)
        if min_score is not None:
            shown = shown & (candidates.scores >= min_score)
        index = np.flatnonzero(shown)
        published = dataclasses.replace(candidates.take(index), confident=None)
        return published, candidates, index

    def floor(self, camera: str) -> float | None:
        """The lowest score post-processing keeps for `camera` (None: the model's own threshold)."""
        floors = [f for f in (stage.floor(camera) for stage in self.stages) if f is not None]
        return min(floors) if floors else None

    # -- cameras -----------------------------------------------------------------------------
    def camera_state(self, camera: str, state: CameraState, reason: str | None) -> None:
        """A reader's state change -> every sink (the MQTT state topic, Home Assistant ...)."""
        now = self._wall_clock()
        for stage in self.stages:
            try:
                stage.camera_state(camera, state)
            except Exception as exc:  # noqa: BLE001 - counted; the sinks still hear of it
                self._failed(stage, exc, camera)
        self._each(lambda sink: sink.camera_state(camera, state, reason, now), camera)

    def camera_added(self, config: CameraConfig) -> None:
        self._each(lambda sink: sink.camera_added(config), config.name)

    def camera_removed(self, camera: str) -> None:
        self._each(lambda sink: sink.camera_removed(camera), camera)

    def events(self, camera: str, batch: Any) -> None:
        """An event batch from outside the frames' path (see `Sink.events`)."""
        self._each(lambda sink: sink.events(camera, batch), camera)

    # -- errors ------------------------------------------------------------------------------
    def _each(self, call: Callable[[Sink], None], camera: str) -> None:
        for sink in self.sinks:
            try:
                call(sink)
            except Exception as exc:  # noqa: BLE001 - one failing sink must not stop the others
                self._failed(sink, exc, camera)

    def _failed(self, part: Sink | Stage, exc: Exception, camera: str) -> None:
        now = self._clock()
        with self._lock:
            errors = self._errors.setdefault(part.name, _Errors())
            errors.count += 1
            errors.last_error = redact_text(f"{type(exc).__name__}: {exc}")
            due = now - errors.last_logged >= ERROR_LOG_INTERVAL_S
            if due:
                errors.last_logged = now
            count = errors.count
        if due:
            log.error("%s %s failed on camera %s (%d failure(s) so far)",
                      "stage" if isinstance(part, Stage) else "sink", part.name, camera, count,
                      exc_info=exc, extra={"camera": camera})

    def errors(self, name: str) -> int:
        with self._lock:
            errors = self._errors.get(name)
            return errors.count if errors is not None else 0

    def stats(self) -> dict:
        """For status: each sink's and stage's errors, and what it reports of itself."""
        with self._lock:
            errors = {name: dataclasses.replace(e) for name, e in self._errors.items()}
        out: dict[str, dict] = {}
        for part in self._parts:
            e = errors.get(part.name, _Errors())
            out[part.name] = {"errors": e.count, "last_error": e.last_error, **part.stats()}
        return out
