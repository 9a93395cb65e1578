"""The router's tracking stage: per camera a `Tracker` and its `CameraEvents`, in frame order.

Per frame (the router's thread): the candidates post-processing kept down to the tracker's low
score (`floor`) -> `Tracker.update(candidates, frame_time)` -> the confirmed track id of every
published detection -> `CameraEvents.update` -> the frame's `EventBatch` (event messages, changed
counts, best shots). When a best shot is due and the frame was kept (`FrameKeeper`), the result
carries the full image for the event log.

Outside the frames (the daemon's threads):

* `configure` when a camera is added, and on every reload: a camera's tracker and events are made
  once and then reconfigured, so tracks and events survive a reload; its counts are published
  (zeros, or as loaded from the `CountsStore`) the first time;
* `end_idle` (the main loop): a camera that stopped streaming and has had no frame routed for
  `END_GRACE_S` ends its events (its last frames may still be in the pipeline when its state
  changes, so the state change alone is not the moment);
* `remove` when a reload removes a camera, and `end_all` at shutdown (after post-processing has
  stopped, before the MQTT client closes): every event ends;
* `reset` (`yoloedge-ctl reset-counts`): zeroes counts, returned as messages to publish.

Each camera's `lock` serialises its tracker and events between the router's thread and those; it
is a leaf but for the `CountsState` lock `CameraEvents` takes under it (events.counts' order). The
table of cameras is replaced whole and read without a lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..config.schema import CameraConfig, TrackingConfig
from ..events import CameraEvents, CountKind, CountsMessage, CountsStore, EventBatch
from .router import FrameResult, Stage
from ..sources.state import CameraState
from ..tracking import Tracker, TrackIds
from .keeper import FrameKeeper

log = logging.getLogger(__name__)

#: a camera that stopped streaming ends its events once no frame of it was routed for this long
END_GRACE_S = 1.0


def tracking_of(config: CameraConfig) -> TrackingConfig:
    """The camera's tracking settings (its own merged over the top-level ones by the config)."""
    tracking = getattr(config, "tracking", None)
    return tracking if isinstance(tracking, TrackingConfig) else TrackingConfig()


@dataclass
class _Camera:
    config: CameraConfig
    tracker: Tracker
    events: CameraEvents
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_time: float | None = None  # the last frame's time (frame time)
    last_routed: float = 0.0  # monotonic, when its last frame was routed
    streaming: bool = False
    ended: bool = True  # no event open since the last end_all (nothing to end)
    removed: bool = False


class TrackingStage(Stage):
    name = "tracking"

    def __init__(self, store: CountsStore, keeper: FrameKeeper | None = None,
                 emit: Callable[[str, EventBatch], None] = lambda camera, batch: None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.store = store
        self.keeper = keeper
        self._emit = emit  # an event batch from outside the frames -> the router's sinks
        self._clock = clock
        self._wall_clock = wall_clock
        self._ids = TrackIds()  # one for every camera: no two tracks share an id
        self._cameras: dict[str, _Camera] = {}

    # -- configuration (daemon threads) ------------------------------------------------------
    def configure(self, config: CameraConfig, labels: Sequence[str]) -> None:
        """A camera added, or its settings changed by a reload: tracks and events go on."""
        cam = self._cameras.get(config.name)
        if self.keeper is not None:  # frames for best shots: only where events can have them
            self.keeper.want(config.name, tracking_of(config).enabled and config.event_snapshots_mb > 0, True)
        if not tracking_of(config).enabled:
            if cam is not None:
                self.remove(config.name, forget=False)
            return
        if cam is None:
            events = CameraEvents(config.name, config.zones, config.lines, labels, self.store.load(config.name))
            cam = _Camera(config, Tracker(tracking_of(config), labels, ids=self._ids), events)
            first = EventBatch(counts=events.counts_messages(self._wall_clock()))
            self._cameras = {**self._cameras, config.name: cam}
            self._publish(config.name, cam, first)
            return
        with cam.lock:
            cam.config = config
            cam.tracker.reconfigure(tracking_of(config))
            batch = cam.events.reconfigure(config.zones, config.lines)
        self._publish(config.name, cam, batch)

    def remove(self, camera: str, forget: bool = True) -> None:
        """A reload removed the camera (or turned its tracking off): its events end."""
        cam = self._cameras.get(camera)
        if cam is None:
            return
        self._cameras = {name: c for name, c in self._cameras.items() if name != camera}
        with cam.lock:
            cam.removed = True
            batch = self._end_locked(cam)
        self._publish(camera, cam, batch)
        if forget:
            self.store.forget(camera)

    def end_all(self) -> None:
        """Shutdown: every camera's events end (post-processing has stopped)."""
        for name, cam in list(self._cameras.items()):
            with cam.lock:
                batch = self._end_locked(cam)
            self._publish(name, cam, batch)

    def camera_state(self, camera: str, state: CameraState) -> None:
        cam = self._cameras.get(camera)
        if cam is not None:
            cam.streaming = state is CameraState.STREAMING

    def end_idle(self) -> None:
        """The main loop: cameras that stopped streaming and went quiet end their events."""
        now = self._clock()
        for name, cam in list(self._cameras.items()):
            if cam.streaming or cam.ended or now - cam.last_routed < END_GRACE_S:
                continue
            with cam.lock:
                batch = self._end_locked(cam)
            self._publish(name, cam, batch)

    def _end_locked(self, cam: _Camera) -> EventBatch:
        if cam.ended:
            return EventBatch()
        cam.ended = True
        when = cam.last_time if cam.last_time is not None else self._wall_clock()
        return cam.events.end_all(cam.tracker.end_all(when))

    def reset(self, camera: str, name: str | None) -> list[CountsMessage]:
        """`reset-counts`: zero the camera's line or zone `name` (None: all); published here."""
        if camera not in self._cameras:
            raise KeyError(camera)
        messages = self.store.reset(camera, name, self._wall_clock())
        self._emit(camera, EventBatch(counts=tuple(messages)))
        return messages

    def _publish(self, camera: str, cam: _Camera, batch: EventBatch) -> None:
        if batch.counts:
            self.store.save(camera, cam.events.counts)
        if batch:
            self._emit(camera, batch)

    # -- frames (the router's thread) --------------------------------------------------------
    def floor(self, camera: str) -> float | None:
        cam = self._cameras.get(camera)
        return cam.tracker.LOW_SCORE if cam is not None else None

    def process(self, result: FrameResult) -> FrameResult:
        cam = self._cameras.get(result.camera)
        candidates = result.candidates
        if cam is None or candidates is None:
            return result
        with cam.lock:
            if cam.removed:
                return result
            frame = cam.tracker.update(candidates, result.frame_time)
            batch = cam.events.update(frame)
            cam.last_time, cam.last_routed, cam.ended = result.frame_time, self._clock(), False
        if batch.counts:
            self.store.save(result.camera, cam.events.counts)
        ids = frame.det_track_ids
        track_ids = tuple(ids[i] for i in result.shown.tolist()) if result.shown is not None else None
        image = None
        if batch.best and self.keeper is not None:
            image = self.keeper.find(result.camera, result.seq, result.capture_mono)
        if self.keeper is not None:
            self.keeper.want(result.camera, cam.config.event_snapshots_mb > 0, bool(len(candidates) or frame.tracks))
        return dataclasses.replace(result, track_ids=track_ids, tracks=frame, events=batch, image=image)

    def done(self, result: FrameResult) -> None:
        if self.keeper is not None:
            self.keeper.done(result.camera, result.capture_mono)

    # -- status ------------------------------------------------------------------------------
    def camera_status(self, camera: str) -> dict:
        """Status's `zones` and `lines` of the camera (the status page draws them)."""
        cam = self._cameras.get(camera)
        if cam is None:
            return {"zones": [], "lines": []}
        counts = cam.events.counts
        zones, lines = [], []
        for zone in cam.config.zones:
            payload = _payload(counts, CountKind.ZONE, zone.name)
            zones.append({"name": zone.name, "polygon": [list(p) for p in zone.polygon],
                          "objects": payload.get("objects", {}), "entered": payload.get("entered", {})})
        for line in cam.config.lines:
            payload = _payload(counts, CountKind.LINE, line.name)
            lines.append({"name": line.name, "points": [list(p) for p in line.points],
                          "in": payload.get("in", {}), "out": payload.get("out", {})})
        extra = self.keeper.stats(camera) if self.keeper is not None else {}
        return {"zones": zones, "lines": lines, "best_shot_frames": extra}

    def counts(self) -> list[tuple[str, list[CountsMessage]]]:
        """Every camera's counts, for /metrics."""
        return [(name, cam.events.counts.messages()) for name, cam in list(self._cameras.items())]


def _payload(counts, kind: CountKind, name: str) -> dict:
    try:
        return counts.message(kind, name).payload
    except KeyError:  # configured a moment ago, not yet counted
        return {}
