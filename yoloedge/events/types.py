"""The frozen types of zones, lines and events: what the config builds and what `CameraEvents`
hands the result router. This module imports nothing of the daemon, so the config schema can use it.

Coordinates of zones and lines are fractions of the frame's width and height (x right, y down), so
a zone drawn on a snapshot survives a change of the camera's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

Point = tuple[float, float]


class Anchor(str, Enum):
    """The point of a box that is in a zone or crosses a line: where an object stands on the
    ground (the bottom centre) unless the zone or line asks for the box's centre."""

    BOTTOM_CENTER = "bottom_center"
    CENTER = "center"


class PublishMode(str, Enum):
    """What a camera publishes on MQTT: per-frame detections, events (and counts), or both."""

    EVENTS = "events"
    DETECTIONS = "detections"
    BOTH = "both"

    @property
    def detections(self) -> bool:
        return self is not PublishMode.EVENTS

    @property
    def events(self) -> bool:
        return self is not PublishMode.DETECTIONS


#: zone `inertia` when the config gives none: frames inside (and outside) before a track enters
#: (leaves) the zone.
DEFAULT_INERTIA = 3


@dataclass(frozen=True)
class ZoneConfig:
    name: str
    polygon: tuple[Point, ...]
    objects: tuple[str, ...] | None = None  # labels that count; None: every label
    inertia: int = DEFAULT_INERTIA
    anchor: Anchor = Anchor.BOTTOM_CENTER


@dataclass(frozen=True)
class LineConfig:
    name: str
    points: tuple[Point, Point]  # A, B
    objects: tuple[str, ...] | None = None
    anchor: Anchor = Anchor.BOTTOM_CENTER


class EventType(str, Enum):
    NEW = "new"
    UPDATE = "update"
    END = "end"


class Direction(str, Enum):
    """A line crossing's direction: with cross = (Bx-Ax)(Py-Ay) - (By-Ay)(Px-Ax), going from
    cross > 0 to cross < 0 is `in` (left to right over a line from top A to bottom B)."""

    IN = "in"
    OUT = "out"


class CountKind(str, Enum):
    LINE = "line"
    ZONE = "zone"

    @property
    def topic_level(self) -> str:
        """The topic level before the name: `lines/{name}`, `zones/{name}`."""
        return self.value + "s"


@dataclass(frozen=True)
class CountsMessage:
    """One line's or zone's counts, for the retained topic `{camera}/{kind.topic_level}/{name}`."""

    kind: CountKind
    name: str
    payload: dict


@dataclass(frozen=True)
class BestShot:
    """An event's snapshot got better in this frame: the router encodes the frame it still holds."""

    event_id: str
    frame_time: float
    score: float
    box: tuple[float, float, float, float]  # source px


@dataclass(frozen=True)
class EventBatch:
    messages: tuple[dict, ...] = ()  # new/update/end payloads, ready for json.dumps
    counts: tuple[CountsMessage, ...] = ()  # counts that changed
    best: tuple[BestShot, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.messages or self.counts or self.best)
