"""The frozen types of events: what `CameraEvents` hands the result router. The zones and lines it
is configured with (`ZoneConfig`, `LineConfig`, `Anchor`, `PublishMode`) are the config's
(`config.schema`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


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
