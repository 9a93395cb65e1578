"""Zones: whether a track is in a polygon, debounced by `inertia`, and how long it stayed.

A track enters a zone once its anchor was inside for `inertia` consecutive matched frames, and
leaves it once it was outside for `inertia` consecutive matched frames: a box whose anchor jitters
on the edge neither enters and leaves every other frame nor counts as entering twice. Frames in
which the tracker only predicts a track's box (not matched) change nothing: a prediction is not a
sighting. A track confirmed inside a zone is in it at once (the tracker's `min_hits` detections
were its debounce), so its `new` event already lists the zone.

Dwell time counts from the first of the inside frames that made the track enter to the first of
the outside frames that made it leave (or to the track's last sighting at its end), in frame time;
`dwell_s` sums a track's visits of a zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..config.schema import ZoneConfig


class ZoneChange(Enum):
    ENTERED = "entered"
    LEFT = "left"


class Zone:
    """A configured zone, ready for the vectorised inside test."""

    def __init__(self, config: ZoneConfig):
        self.config = config
        self.name = config.name
        self.polygon = np.asarray(config.polygon, dtype=np.float64)
        self.previous = np.roll(self.polygon, 1, axis=0)  # each edge's other end
        self.objects = frozenset(config.objects) if config.objects is not None else None

    def counts(self, label: str) -> bool:
        return self.objects is None or label in self.objects


@dataclass
class ZoneTrack:
    """One track in one zone."""

    present: bool = False
    streak: int = 0  # consecutive matched frames on the other side of `present`
    streak_start: float = 0.0  # the first of them
    entered_at: float = 0.0  # when the current visit began
    dwell: float = 0.0  # seconds of the visits that ended
    visited: bool = False  # entered at least once

    def begin(self, time: float) -> None:
        """The track is inside when it is confirmed."""
        self.present, self.visited, self.entered_at, self.streak = True, True, time, 0

    def steady(self, inside: bool) -> bool:
        """Whether a sighting `inside` (or not) leaves this state as it is."""
        return inside == self.present and self.streak == 0

    def step(self, inside: bool, time: float, inertia: int) -> ZoneChange | None:
        """One matched frame; the change it completes, if any."""
        if inside == self.present:
            self.streak = 0
            return None
        if self.streak == 0:
            self.streak_start = time
        self.streak += 1
        if self.streak < inertia:
            return None
        self.streak = 0
        if inside:
            self.present, self.visited, self.entered_at = True, True, self.streak_start
            return ZoneChange.ENTERED
        self.present = False
        self.dwell += max(0.0, self.streak_start - self.entered_at)
        return ZoneChange.LEFT

    def close(self, time: float) -> None:
        """The track ended (last seen at `time`) or the zone went away: the visit ends."""
        if self.present:
            self.dwell += max(0.0, time - self.entered_at)
            self.present = False
        self.streak = 0

    def dwell_at(self, time: float) -> float:
        return self.dwell + (max(0.0, time - self.entered_at) if self.present else 0.0)
