"""The router's tracking stage: per camera and model a `Tracker` and its `CameraEvents`, in frame order.

A camera fed to several models gets one result per frame and model (`FrameResult.model`, the
model's name): each model has its own tracker and events (ids from one shared `TrackIds`, so an
event id is unique across the camera's models and every other camera; a single model's ids are
as they always were), and every event message names its model (`"model"`). The models share the
camera's counts (one `CountsState`: per label summed over the models, on the same topics; see
`events.counts`), status's zones and lines likewise. A camera configured with one list of labels
(no model named) has one tracker, fed whatever model its results name, as before.

Per frame (the router's thread): the candidates post-processing kept down to the tracker's low
score (`floor`) -> `Tracker.update(candidates, frame_time)` -> the confirmed track id of every
published detection -> `CameraEvents.update` -> the frame's `EventBatch` (event messages, changed
counts, best shots). When a best shot is due and the frame was kept (`FrameKeeper`), the result
carries the full image for the event log.

Outside the frames (the daemon's threads):

* `configure` when a camera is added, and on every reload: a camera's trackers and events are
  made once per model and then reconfigured, so tracks and events survive a reload (a model the
  camera is no longer fed to ends its events); its counts are published (zeros, or as loaded from
  the `CountsStore`) the first time; it tells the `FrameKeeper` the camera's models;
* `end_idle` (the main loop): a camera that stopped streaming and has had no frame routed for
  `END_GRACE_S` ends its events (its last frames may still be in the pipeline when its state
  changes, so the state change alone is not the moment);
* `remove` when a reload removes a camera, and `end_all` at shutdown (after post-processing has
  stopped, before the MQTT client closes): every event ends;
* `reset` (`yoloedge-ctl reset-counts`): zeroes counts, returned as messages to publish.

Each camera's `lock` serialises its models' trackers and events between the router's threads (one
per model's post-processing) and those; it is a leaf but for the `CountsState` lock
`CameraEvents` takes under it (events.counts' order), and the keeper's lock is taken only
outside it. The tables of cameras and of a camera's models are replaced whole and read without a
lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..config.schema import CameraConfig, TrackingConfig
from ..events import CameraEvents, CountKind, CountsMessage, CountsState, CountsStore, EventBatch
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
class _Model:
    """One model's tracker and events on a camera."""

    name: str
    tracker: Tracker
    events: CameraEvents
    last_time: float | None = None  # its last frame's time (frame time)
    ended: bool = True  # no event open since the last end (nothing to end)


@dataclass
class _Camera:
    config: CameraConfig
    counts: CountsState  # shared by its models' events
    models: dict[str, _Model]  # by model name ("": configured without one); replaced whole
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_routed: float = 0.0  # monotonic, when its last frame (of any model) was routed
    streaming: bool = False
    removed: bool = False
    unknown: frozenset[str] = frozenset()  # models whose results it was not configured for (logged)

    @property
    def ended(self) -> bool:
        return all(m.ended for m in self.models.values())

    def model(self, name: str) -> _Model | None:
        """The model's part; a camera configured without a model name takes whatever its results name."""
        part = self.models.get(name)
        return self.models.get("") if part is None and len(self.models) == 1 else part


def model_labels(labels: Sequence[str] | Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """`configure`'s labels as {model name: labels}: a plain list is one model without a name."""
    if isinstance(labels, Mapping):
        return {name: tuple(model) for name, model in labels.items()}
    return {"": tuple(labels)}


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
        self._ids = TrackIds()  # one for every tracker: no two tracks share an id
        self._cameras: dict[str, _Camera] = {}

    # -- configuration (daemon threads) ------------------------------------------------------
    def configure(self, config: CameraConfig, labels: Sequence[str] | Mapping[str, Sequence[str]]) -> None:
        """A camera added, or its settings changed by a reload: tracks and events go on.
        `labels`: {model name: its labels} for every model the camera's frames go to, in order
        (what `FrameResult.model` names); a plain list of labels: one model, not named."""
        models = model_labels(labels)
        cam = self._cameras.get(config.name)
        if self.keeper is not None:  # frames for best shots: only where events can have them
            self.keeper.models(config.name, [name for name in models if name])
            self.keeper.want(config.name, tracking_of(config).enabled and config.event_snapshots_mb > 0, True)
        if not tracking_of(config).enabled:
            if cam is not None:
                self.remove(config.name, forget=False)
            return
        if cam is None:
            counts = self.store.load(config.name)
            cam = _Camera(config, counts, {})
            cam.models = self._models(cam, models, _every_label(models))
            now = self._wall_clock()
            first = EventBatch(counts=_first_counts([m.events for m in cam.models.values()], now))
            self._cameras = {**self._cameras, config.name: cam}
            self._publish(config.name, cam, first)
            return
        with cam.lock:
            cam.config = config
            batch = self._reconfigure_locked(cam, models)
        self._publish(config.name, cam, batch)

    def _models(self, cam: _Camera, models: Mapping[str, tuple[str, ...]], every: tuple[str, ...]
                ) -> dict[str, _Model]:
        """New parts for `models` (a new camera's, or models a reload added); `every`: the labels
        of all the camera's models."""
        config = cam.config
        return {name: _Model(name, Tracker(tracking_of(config), labels, ids=self._ids),
                             CameraEvents(config.name, config.zones, config.lines, labels, cam.counts,
                                          model=name, camera_labels=every))
                for name, labels in models.items()}

    def _reconfigure_locked(self, cam: _Camera, models: Mapping[str, tuple[str, ...]]) -> EventBatch:
        config, batches = cam.config, []
        for name, part in cam.models.items():
            if name not in models:  # no longer fed to this camera: its events end
                batches.append(self._end_model_locked(part))
                batches.append(EventBatch(counts=_zone_counts(cam.counts, cam.counts.forget_model(name))))
        every = _every_label(models)
        added = self._models(cam, {name: labels for name, labels in models.items() if name not in cam.models}, every)
        kept = {name: part for name, part in cam.models.items() if name in models}
        for part in kept.values():
            part.tracker.reconfigure(tracking_of(config))
            part.events.camera_labels = every
            batches.append(part.events.reconfigure(config.zones, config.lines))
        if added:
            start = self._wall_clock()
            for part in added.values():
                part.events.counts_messages(start)  # the counts already went out; only marks it started
        cam.models = {name: (kept.get(name) or added[name]) for name in models}
        return _merge(batches)

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
        return _merge([self._end_model_locked(part) for part in cam.models.values()])

    def _end_model_locked(self, part: _Model) -> EventBatch:
        if part.ended:
            return EventBatch()
        part.ended = True
        when = part.last_time if part.last_time is not None else self._wall_clock()
        return part.events.end_all(part.tracker.end_all(when))

    def reset(self, camera: str, name: str | None) -> list[CountsMessage]:
        """`reset-counts`: zero the camera's line or zone `name` (None: all); published here."""
        if camera not in self._cameras:
            raise KeyError(camera)
        messages = self.store.reset(camera, name, self._wall_clock())
        self._emit(camera, EventBatch(counts=tuple(messages)))
        return messages

    def _publish(self, camera: str, cam: _Camera, batch: EventBatch) -> None:
        if batch.counts:
            self.store.save(camera, cam.counts)
        if batch:
            self._emit(camera, batch)

    # -- frames (the router's threads) -------------------------------------------------------
    def floor(self, camera: str) -> float | None:
        cam = self._cameras.get(camera)
        part = next(iter(cam.models.values()), None) if cam is not None else None
        return part.tracker.LOW_SCORE if part is not None else None

    def process(self, result: FrameResult) -> FrameResult:
        cam = self._cameras.get(result.camera)
        candidates = result.candidates
        if cam is None or candidates is None:
            return result
        with cam.lock:
            if cam.removed:
                return result
            part = cam.model(result.model)
            if part is None:
                self._unknown_locked(cam, result.model)
                return result
            frame = part.tracker.update(candidates, result.frame_time)
            batch = part.events.update(frame)
            part.last_time, part.ended, cam.last_routed = result.frame_time, False, self._clock()
        if batch.counts:
            self.store.save(result.camera, cam.counts)
        ids = frame.det_track_ids
        track_ids = tuple(ids[i] for i in result.shown.tolist()) if result.shown is not None else None
        image = None
        if batch.best and self.keeper is not None:
            image = self.keeper.find(result.camera, result.seq, result.capture_mono)
        if self.keeper is not None:
            self.keeper.want(result.camera, cam.config.event_snapshots_mb > 0,
                             bool(len(candidates) or frame.tracks), result.model)
        return dataclasses.replace(result, track_ids=track_ids, tracks=frame, events=batch, image=image)

    @staticmethod
    def _unknown_locked(cam: _Camera, model: str) -> None:
        if model in cam.unknown:
            return
        cam.unknown = cam.unknown | {model}
        log.warning("camera %s: results of model %s, which its tracking was not configured for (%s): "
                    "not tracked", cam.config.name, model, ", ".join(cam.models) or "none",
                    extra={"camera": cam.config.name})

    def done(self, result: FrameResult) -> None:
        if self.keeper is not None:
            self.keeper.done(result.camera, result.capture_mono, result.model)

    # -- status ------------------------------------------------------------------------------
    def camera_status(self, camera: str) -> dict:
        """Status's `zones` and `lines` of the camera (the status page draws them): the counts
        of all its models, as on the counts topics."""
        cam = self._cameras.get(camera)
        if cam is None:
            return {"zones": [], "lines": []}
        counts = cam.counts
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
        return [(name, cam.counts.messages()) for name, cam in list(self._cameras.items())]


def _every_label(models: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(label for labels in models.values() for label in labels))


def _first_counts(events: Sequence[CameraEvents], now: float) -> tuple[CountsMessage, ...]:
    """The counts a new camera publishes once (every model's events are started by it)."""
    messages: tuple[CountsMessage, ...] = ()
    for part in events:
        messages = part.counts_messages(now)
    return messages


def _zone_counts(counts: CountsState, zones: Sequence[str]) -> tuple[CountsMessage, ...]:
    return tuple(counts.message(CountKind.ZONE, name) for name in zones)


def _merge(batches: Sequence[EventBatch]) -> EventBatch:
    """One batch of several models' (their counts are of one state: the latest of each kept)."""
    batches = [b for b in batches if b]
    if len(batches) <= 1:
        return batches[0] if batches else EventBatch()
    counts: dict[tuple[CountKind, str], CountsMessage] = {}
    for batch in batches:
        for message in batch.counts:
            counts.pop((message.kind, message.name), None)
            counts[(message.kind, message.name)] = message
    return EventBatch(tuple(m for b in batches for m in b.messages), tuple(counts.values()),
                      tuple(s for b in batches for s in b.best))


def _payload(counts, kind: CountKind, name: str) -> dict:
    try:
        return counts.message(kind, name).payload
    except KeyError:  # configured a moment ago, not yet counted
        return {}
