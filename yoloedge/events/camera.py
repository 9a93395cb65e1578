"""One camera's events: from the tracker's frames to event messages, counts and best shots.

`CameraEvents.update(frame)` takes each `TrackFrame` in frame order (the router's thread; not
thread-safe) and returns what changed in it:

* `new` when a track is confirmed, with the zones it is already in; `end` when it ends (lost for
  `lost_s`, or `end_all` when the camera stops or the daemon shuts down); every `new` gets its
  `end`, and an `end` comes only after a `new`.
* `update` when a track enters or leaves a zone, crosses a line or gets a better snapshot, at most
  one per `UPDATE_INTERVAL_S` per event, by frame time. A change within the interval is kept
  (`pending`) and goes into the next update allowed or into the `end`, whichever comes first.
* counts (`CountsState`) of the lines and zones that changed; the first batch (or
  `counts_messages`) has them all, zeros or as loaded.
* best shots: the event's snapshot is the frame with its highest score while the box is fully in
  view (`EDGE_MARGIN_PX` off every edge of the frame); until it has been fully in view once, the
  best of its sightings cut by an edge stands in, so every event has one.

A camera fed to several models has one `CameraEvents` per model (`model`, its name, which every
event message then names), each fed by that model's own tracker; they share the camera's
`CountsState`, whose counts are per label summed over the models (see `events.counts`).

All times are frame times (capture time for live cameras), so a file played faster than real
time gives the same events. Zones: `events.zones`; lines: `events.lines`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..tracking.types import Track, TrackFrame
from .counts import CountsState
from .geometry import anchor_points, points_in_polygon
from .lines import Line, LineTrack
from ..config.schema import LineConfig, ZoneConfig
from .types import BestShot, CountKind, CountsMessage, Direction, EventBatch, EventType
from .zones import Zone, ZoneChange, ZoneTrack

log = logging.getLogger(__name__)

#: the version of the event payload.
EVENT_VERSION = 1
#: the least frame time between two `update`s of one event.
UPDATE_INTERVAL_S = 1.0
#: a box this close to an edge of the frame (pixels) is cut by it: no snapshot of record.
EDGE_MARGIN_PX = 2.0
#: the most crossings an event lists (the latest; the counts count them all): a track that paces
#: over a line all day must not grow its messages without bound.
MAX_CROSSINGS = 100

Box = tuple[float, float, float, float]


@dataclass
class _Snapshot:
    frame_time: float
    score: float
    box: Box
    in_view: bool

    def beaten_by(self, score: float, in_view: bool) -> bool:
        if in_view != self.in_view:
            return in_view
        return score > self.score


@dataclass
class _Event:
    """One confirmed track's event."""

    track: Track
    label: str
    box: Box  # the last sighting's
    score: float  # the last sighting's
    zones: dict[str, ZoneTrack] = field(default_factory=dict)
    lines: dict[str, LineTrack] = field(default_factory=dict)
    retired: dict[str, ZoneTrack] = field(default_factory=dict)  # zones a reload removed
    entered: list[str] = field(default_factory=list)  # zone names, in the order first entered
    crossings: list[dict] = field(default_factory=list)
    #: every crossing (line, inbound) and zone entry (zone, None) of the track, counted or not
    #: (a line's or zone's `objects`): a change of label moves them to the new label's counts
    tally: Counter = field(default_factory=Counter)
    snapshot: _Snapshot | None = None
    sent_at: float = -math.inf  # frame time of the last new/update message
    pending: bool = False


class _Batch:
    """What one call collects before it becomes an EventBatch."""

    def __init__(self) -> None:
        self.new: list[dict] = []
        self.updates: list[dict] = []
        self.ends: list[dict] = []
        self.counts: dict[tuple[CountKind, str], None] = {}  # ordered set
        self.best: list[BestShot] = []

    def count(self, kind: CountKind, name: str) -> None:
        self.counts[(kind, name)] = None


class CameraEvents:
    """Zones, lines, events and counts of one camera (see the module docstring)."""

    def __init__(self, camera: str, zones: Sequence[ZoneConfig], lines: Sequence[LineConfig],
                 labels: Sequence[str], counts: CountsState, model: str = "",
                 camera_labels: Sequence[str] | None = None):
        self.camera = camera
        self.labels = tuple(labels)
        #: the model's name, in every event message (`"model"`); "" leaves it out (no name given)
        self.model = model
        #: the labels of every model of the camera: a zone's or line's `objects` naming none of
        #: them is a typo (one another model has is not)
        self.camera_labels = tuple(camera_labels) if camera_labels is not None else self.labels
        self.counts = counts
        self._events: dict[str, _Event] = {}
        self._zones: list[Zone] = []
        self._lines: list[Line] = []
        self._started = False  # the counts were published once
        self._last_time: float | None = None
        self._configure(zones, lines)

    # -- configuration ---------------------------------------------------------------------------

    def _configure(self, zones: Sequence[ZoneConfig], lines: Sequence[LineConfig]) -> None:
        self._zones = [Zone(z) for z in zones]
        self._lines = [Line(line) for line in lines]
        self.counts.configure([(line.name, line.config.objects or ()) for line in self._lines],
                              [(zone.name, zone.config.objects or ()) for zone in self._zones], self._last_time)
        self._warn_unknown_labels()

    def _warn_unknown_labels(self) -> None:
        """The config check knows the model's labels only when the config lists them (or names a
        labels file); a typo would silently count nothing."""
        for what, items in (("zone", self._zones), ("line", self._lines)):
            for item in items:
                for label in item.objects or ():
                    if label not in self.camera_labels:
                        log.warning("camera %s: %s %s: object %r is not one of the model's labels; it will "
                                    "never count", self.camera, what, item.name, label, extra={"camera": self.camera})

    def reconfigure(self, zones: Sequence[ZoneConfig], lines: Sequence[LineConfig]) -> EventBatch:
        """A reload: events go on; zones and lines that keep their name keep each track's state
        (a changed outline or line is judged from the next frame on, with the usual debouncing).
        A zone that went away ends the visits in it (its dwell stays in the events); the counts of
        removed ones are dropped, new ones start at zero. Returns the counts of the new ones."""
        zone_names = {z.name for z in zones}
        line_names = {line.name for line in lines}
        old_zones = {z.name for z in self._zones}
        old_lines = {line.name for line in self._lines}
        now = self._last_time
        for event in self._events.values():
            for name in [n for n in event.zones if n not in zone_names]:
                state = event.zones.pop(name)
                event.pending = event.pending or state.present
                state.close(event.track.last_time if now is None else now)
                if state.visited:
                    earlier = event.retired.get(name)
                    if earlier is not None:
                        state.dwell += earlier.dwell
                    event.retired[name] = state
            for name in [n for n in event.lines if n not in line_names]:
                del event.lines[name]
        self._configure(zones, lines)
        batch = _Batch()
        if self._started:
            for line in self._lines:
                if line.name not in old_lines:
                    batch.count(CountKind.LINE, line.name)
            for zone in self._zones:
                if zone.name not in old_zones:
                    batch.count(CountKind.ZONE, zone.name)
            self._recount_zones(batch)
        return self._finish(batch)

    # -- frames ----------------------------------------------------------------------------------

    def counts_messages(self, now: float | None = None) -> tuple[CountsMessage, ...]:
        """Every line's and zone's counts (at camera start: zeros, or as loaded); counts that never
        started begin `now` (default: the last frame's time)."""
        start = now if now is not None else self._last_time
        if start is None:
            raise ValueError("counts_messages needs a time before the first frame")
        self.counts.start(start)
        self._started = True
        return tuple(self.counts.messages())

    def update(self, frame: TrackFrame) -> EventBatch:
        batch = _Batch()
        self._begin(frame, batch)
        started = {track.id for track in frame.started}
        for track in frame.tracks:
            if track.id not in self._events:
                self._events[track.id] = self._new_event(track)
                started.add(track.id)
        self._observe(frame, started, batch)
        for track in frame.tracks:
            event = self._events[track.id]
            if track.id in started:
                batch.new.append(self._payload(EventType.NEW, event, frame))
                event.sent_at, event.pending = frame.time, False
            elif event.pending and _may_update(event.sent_at, frame.time):
                batch.updates.append(self._payload(EventType.UPDATE, event, frame))
                event.sent_at, event.pending = frame.time, False
        for track in frame.ended:
            self._end(track.id, track, frame, batch)
        self._recount_zones(batch)
        return self._finish(batch)

    def end_all(self, frame: TrackFrame) -> EventBatch:
        """The camera stops, is removed or the daemon shuts down: every event ends (with the
        tracker's `end_all` frame; an event whose track it does not list ends as last seen)."""
        batch = _Batch()
        self._begin(frame, batch)
        final = {track.id: track for track in frame.ended}
        for event_id in list(self._events):
            self._end(event_id, final.get(event_id), frame, batch)
        self._recount_zones(batch)
        return self._finish(batch)

    def _begin(self, frame: TrackFrame, batch: _Batch) -> None:
        self._last_time = frame.time
        if not self._started:
            for message in self.counts_messages(frame.time):
                batch.count(message.kind, message.name)

    def _new_event(self, track: Track) -> _Event:
        return _Event(track=track, label=self._label(track.label_id), box=track.box, score=track.score,
                      zones={zone.name: ZoneTrack() for zone in self._zones},
                      lines={line.name: LineTrack() for line in self._lines})

    def _label(self, label_id: int) -> str:
        return self.labels[label_id] if 0 <= label_id < len(self.labels) else f"class{label_id}"

    # -- what the tracks did ---------------------------------------------------------------------

    def _observe(self, frame: TrackFrame, started: set[str], batch: _Batch) -> None:
        """Zones, lines and snapshots of this frame's sightings, vectorised over the tracks."""
        seen = [track for track in frame.tracks if track.matched or track.id in started]
        for track in frame.tracks:
            event = self._events[track.id]
            event.track = track
            self._relabel(event, self._label(track.label_id), batch)
        if not seen or frame.width <= 0 or frame.height <= 0:
            return
        boxes = np.array([track.box for track in seen], dtype=np.float64)
        used = {zone.config.anchor for zone in self._zones} | {line.config.anchor for line in self._lines}
        anchors = {anchor: anchor_points(boxes, frame.width, frame.height, anchor) for anchor in used}
        events = [self._events[track.id] for track in seen]
        starting = [track.id in started for track in seen]
        for zone in self._zones:
            inside = points_in_polygon(anchors[zone.config.anchor], zone.polygon, zone.previous).tolist()
            for event, is_inside, first in zip(events, inside, starting):
                self._zone_step(zone, event, is_inside, first, frame.time, batch)
        for line in self._lines:
            points = anchors[line.config.anchor]
            distance, band = line.distances(points, boxes, frame.width, frame.height)
            for event, point, d, b in zip(events, points.tolist(), distance.tolist(), band.tolist()):
                self._line_step(line, event, (point[0], point[1]), d, b, frame.time, batch)
        for track in seen:
            self._sighting(self._events[track.id], track, frame, batch)

    def _zone_step(self, zone: Zone, event: _Event, inside: bool, starting: bool, time: float,
                   batch: _Batch) -> None:
        state = event.zones.get(zone.name)
        if state is None:
            state = event.zones[zone.name] = ZoneTrack()
        inside = inside and zone.counts(event.label)
        if not starting and state.steady(inside):
            return
        if starting:
            change = ZoneChange.ENTERED if inside else None
            if inside:
                state.begin(time)
        else:
            change = state.step(inside, time, zone.config.inertia)
        if change is None:
            return
        event.pending = True
        if change is ZoneChange.ENTERED and zone.name not in event.entered:
            event.entered.append(zone.name)
            event.tally[(zone.name, None)] += 1
            self.counts.add_entry(zone.name, event.label)
            batch.count(CountKind.ZONE, zone.name)

    def _line_step(self, line: Line, event: _Event, point: tuple[float, float], distance: float, band: float,
                   time: float, batch: _Batch) -> None:
        state = event.lines.setdefault(line.name, LineTrack())
        direction = state.step(line, point, distance, band, time)
        if direction is not None:
            self._crossed(line, event, direction, state.crossed_at, batch)

    def _crossed(self, line: Line, event: _Event, direction: Direction, time: float, batch: _Batch) -> None:
        event.tally[(line.name, direction is Direction.IN)] += 1
        if not line.counts(event.label):
            return
        event.crossings.append({"line": line.name, "direction": direction.value, "time": time})
        del event.crossings[:-MAX_CROSSINGS]
        event.pending = True
        self.counts.add_crossing(line.name, direction is Direction.IN, event.label)
        batch.count(CountKind.LINE, line.name)

    def _relabel(self, event: _Event, label: str, batch: _Batch) -> None:
        """The track's vote changed its label: what it counted so far counts under the new label
        (a cross first seen as a star is counted as a cross), as far as each line's and zone's
        `objects` take either label."""
        old, event.label = event.label, label
        if label == old:
            return
        event.pending = True
        lines = {line.name: line for line in self._lines}
        zones = {zone.name: zone for zone in self._zones}
        for (name, inbound), n in event.tally.items():
            if inbound is None:
                zone = zones.get(name)
                if zone is not None and zone.counts(old) and zone.counts(label):
                    self.counts.add_entry(name, old, -n)
                    self.counts.add_entry(name, label, n)
                    batch.count(CountKind.ZONE, name)
                continue
            line = lines.get(name)
            if line is None:
                continue
            if line.counts(old):
                self.counts.add_crossing(name, inbound, old, -n)
            if line.counts(label):
                self.counts.add_crossing(name, inbound, label, n)
            if line.counts(old) or line.counts(label):
                batch.count(CountKind.LINE, name)

    def _sighting(self, event: _Event, track: Track, frame: TrackFrame, batch: _Batch) -> None:
        event.box, event.score = track.box, track.score
        x1, y1, x2, y2 = track.box
        in_view = (x1 > EDGE_MARGIN_PX and y1 > EDGE_MARGIN_PX and x2 < frame.width - EDGE_MARGIN_PX
                   and y2 < frame.height - EDGE_MARGIN_PX)
        if event.snapshot is not None and not event.snapshot.beaten_by(track.score, in_view):
            return
        event.snapshot = _Snapshot(frame.time, track.score, track.box, in_view)
        event.pending = True
        batch.best.append(BestShot(track.id, frame.time, track.score, track.box))

    def _end(self, event_id: str, track: Track | None, frame: TrackFrame, batch: _Batch) -> None:
        event = self._events.pop(event_id, None)
        if event is None:  # never started here (no `new`): nothing to end
            return
        if track is not None:
            event.track = track
        lines = {line.name: line for line in self._lines}
        for name, line_track in event.lines.items():
            direction = line_track.pending()  # a crossing still inside the band when the track ended
            if direction is not None and name in lines:
                self._crossed(lines[name], event, direction, line_track.crossed_at, batch)
        current = self._current_zones(event)  # the zones it was in when last seen
        for state in event.zones.values():
            state.close(event.track.last_time)
        batch.ends.append(self._payload(EventType.END, event, frame, current))

    def _recount_zones(self, batch: _Batch) -> None:
        """The objects inside each zone now, by label: every event present in it."""
        for zone in self._zones:
            inside = Counter(event.label for event in self._events.values()
                             if zone.name in event.zones and event.zones[zone.name].present)
            if self.counts.set_objects(zone.name, dict(inside), self.model):
                batch.count(CountKind.ZONE, zone.name)

    # -- messages --------------------------------------------------------------------------------

    def _current_zones(self, event: _Event) -> list[str]:
        return [zone.name for zone in self._zones if zone.name in event.zones and event.zones[zone.name].present]

    def _payload(self, kind: EventType, event: _Event, frame: TrackFrame, current: list[str] | None = None) -> dict:
        """The event message of issue 17, item 5; an `end` lists the zones it was in when last seen."""
        track = event.track
        ended = kind is EventType.END
        end = track.last_time
        if current is None:
            current = self._current_zones(event)
        at = end if ended else frame.time
        dwell = {name: round(_dwell(event, name, at), 3) for name in event.entered}
        snapshot = event.snapshot
        head = {"v": EVENT_VERSION, "type": kind.value, "id": track.id, "camera": self.camera}
        if self.model:
            head["model"] = self.model
        return {
            **head, "label": event.label, "start_time": track.start_time, "end_time": end if ended else None,
            "frame_time": frame.time, "score": round(event.score, 6), "top_score": round(track.top_score, 6),
            "box": [round(v, 2) for v in event.box],
            "box_norm": _normalised(event.box, frame.width, frame.height),
            "current_zones": current, "entered_zones": list(event.entered),
            "crossings": [dict(crossing) for crossing in event.crossings], "dwell_s": dwell,
            "snapshot": None if snapshot is None else {
                "frame_time": snapshot.frame_time, "score": round(snapshot.score, 6),
                "box": [round(v, 2) for v in snapshot.box]},
        }

    def _finish(self, batch: _Batch) -> EventBatch:
        counts = tuple(self.counts.message(kind, name) for kind, name in batch.counts)
        return EventBatch(tuple(batch.new + batch.updates + batch.ends), counts, tuple(batch.best))


def _dwell(event: _Event, name: str, time: float) -> float:
    """Seconds in zone `name` so far, with visits before a reload removed it (and re-added it)."""
    total = event.retired[name].dwell if name in event.retired else 0.0
    return total + (event.zones[name].dwell_at(time) if name in event.zones else 0.0)


def _may_update(sent_at: float, time: float) -> bool:
    """One update a second per event, by frame time; frame time going back (a clock step) lets
    the update through rather than holding it for as long as the step."""
    return time - sent_at >= UPDATE_INTERVAL_S or time < sent_at


def _normalised(box: Box, width: int, height: int) -> list[float]:
    x1, y1, x2, y2 = box
    return [round(x1 / width, 4), round(y1 / height, 4), round(x2 / width, 4), round(y2 / height, 4)]
