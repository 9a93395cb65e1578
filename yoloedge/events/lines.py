"""Lines: when a track's anchor crosses the segment A-B, and in which direction.

Direction (issue 17): with `cross = (Bx-Ax)(Py-Ay) - (By-Ay)(Px-Ax)` in image coordinates (y
down), going from cross > 0 to cross < 0 is `in`, the other way `out`; for a line from top A to
bottom B, left to right is `in`.

Debouncing, so jitter on the line never counts twice:

* Hysteresis band. A track is *on a side* only while its anchor is farther from the line than
  the band: 10% of the box's extent across the line (`BAND_FRACTION`; the box's width for a
  vertical line, its height for a horizontal one, in between for a slanted one), at least
  `MIN_BAND_PX`. Box jitter from frame to frame is a few percent of the box's size, so a box
  standing on the line stays inside the band, however often its anchor changes sides there.
* A crossing counts when the side a track is on changes: from the last side it was seen on,
  through the band, to the other side. Going into the band and back out on the same side counts
  nothing; going back and forth across the line inside the band counts nothing; crossing and
  returning counts one `in` and one `out`, as it should.
* The segment, not its extension. Each time the anchor's path between two consecutive sightings
  changes sides of the (infinite) line, it is noted whether it met the line between A and B
  (ends included). When the side changes, the crossing counts only if the last such change of
  sides went through the segment: an object walking round the end of a line changes sides but
  does not cross it.
* Sightings only. Frames in which the tracker only predicts a box (not matched) are skipped; the
  path runs from one sighting to the next, so a track occluded while it crosses still counts
  when it is seen again on the other side.
* A track's first side is the side it is first seen on (inside the band or not); its first
  sighting counts no crossing (where it came from is not known).
* When a track ends (lost, its camera stops, shutdown) while its last sighting was across the
  line (through the segment) but still inside the band -- a slow object, or the clip ended --
  the side it ended on decides: that crossing counts, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .geometry import line_sides, meets_segment, pixel_metrics
from ..config.schema import LineConfig, Point
from .types import Direction

#: the band's half-width as a fraction of the box's extent across the line.
BAND_FRACTION = 0.1
#: the narrowest band, in pixels (a tiny box's extent rounds to nothing).
MIN_BAND_PX = 1.0


class Line:
    """A configured line, ready for the vectorised side test."""

    def __init__(self, config: LineConfig):
        self.config = config
        self.name = config.name
        self.a, self.b = config.points
        self.objects = frozenset(config.objects) if config.objects is not None else None

    def counts(self, label: str) -> bool:
        return self.objects is None or label in self.objects

    def distances(self, anchors: np.ndarray, boxes: np.ndarray, width: int, height: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Signed distances in pixels of (n, 2) anchors (fractions) from the line (the sign is
        the side), and each box's hysteresis band in pixels."""
        to_px, weight_w, weight_h = pixel_metrics(self.a, self.b, width, height)
        distance = line_sides(anchors, self.a, self.b) * to_px
        extent = weight_w * (boxes[:, 2] - boxes[:, 0]) + weight_h * (boxes[:, 3] - boxes[:, 1])
        return distance, np.maximum(MIN_BAND_PX, BAND_FRACTION * extent)


@dataclass
class LineTrack:
    """One track against one line."""

    side: int = 0  # +1 / -1: the side it was last seen on outside the band; 0: not yet
    last_point: Point | None = None  # the last sighting off the line itself
    last_sign: int = 0  # its side of the line (band or not)
    through_segment: bool = False  # whether the last change of sides met the segment A-B
    crossed_at: float = 0.0  # the frame time of that change

    def step(self, line: Line, point: Point, distance: float, band: float, time: float) -> Direction | None:
        """One sighting; the crossing it completes, if any."""
        sign = 1 if distance > 0 else -1 if distance < 0 else 0
        if sign != 0:
            if self.last_point is not None and sign != self.last_sign:
                self.through_segment = meets_segment(self.last_point, point, line.a, line.b)
                self.crossed_at = time
            self.last_point, self.last_sign = point, sign
        if abs(distance) <= band:
            if self.side == 0 and sign != 0:  # first seen on the line: the side it is on, for now
                self.side = sign
            return None
        previous, self.side = self.side, sign
        if previous in (0, sign) or not self.through_segment:
            return None
        return Direction.IN if previous > 0 else Direction.OUT

    def pending(self) -> Direction | None:
        """When the track ends: the crossing it was making, if its last sighting was across the
        line (through the segment) but still inside the band -- a slow object, or the clip's end.
        The side it ends on decides, so jitter on the line still counts at most once."""
        if self.side == 0 or self.last_sign in (0, self.side) or not self.through_segment:
            return None
        direction = Direction.IN if self.side > 0 else Direction.OUT
        self.side = self.last_sign
        return direction
