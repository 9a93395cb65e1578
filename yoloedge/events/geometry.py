"""Plane geometry of zones and lines, in fractions of the frame (x right, y down).

Per frame the work is vectorised over the camera's tracks: one anchor array, one point-in-polygon
test per zone and one side test per line, each a few numpy operations on (tracks x vertices)
arrays. The scalar helpers (where a path meets a line) run only when a track's side of a line
changes; the polygon checks run once, when the config is read (`config.polygon`).

The side of a line is the sign of `cross = (Bx-Ax)(Py-Ay) - (By-Ay)(Px-Ax)`. Scaling x and y by
the frame's width and height multiplies it by width * height > 0, so the side, and where along
A-B a path meets the line (an affine ratio), are the same in fractions and in pixels; only
distances (the hysteresis band of `events.lines`) need pixels, and they use them.
"""

from __future__ import annotations

import math

import numpy as np

from ..config.schema import Anchor, Point


def anchor_points(boxes: np.ndarray, width: int, height: int, anchor: Anchor) -> np.ndarray:
    """(n, 2) anchor points in fractions of the frame for (n, 4) x1 y1 x2 y2 boxes in pixels."""
    x = (boxes[:, 0] + boxes[:, 2]) * (0.5 / width)
    if anchor is Anchor.CENTER:
        y = (boxes[:, 1] + boxes[:, 3]) * (0.5 / height)
    else:
        y = boxes[:, 3] * (1.0 / height)
    return np.stack((x, y), axis=1)


def points_in_polygon(points: np.ndarray, polygon: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """(n,) bool: whether each of (n, 2) points lies inside the (m, 2) polygon (even-odd rule,
    a horizontal ray to the right). A point exactly on an edge gets one consistent answer.
    `previous`: the polygon's points rolled by one (each edge's other end), if already made."""
    if len(points) == 0:
        return np.zeros(0, bool)
    x = points[:, 0:1]
    y = points[:, 1:2]
    xi, yi = polygon[:, 0], polygon[:, 1]
    rolled = np.roll(polygon, 1, axis=0) if previous is None else previous
    xj, yj = rolled[:, 0], rolled[:, 1]
    straddles = (yi > y) != (yj > y)  # (n, m): the edge spans the point's height
    with np.errstate(divide="ignore", invalid="ignore"):  # horizontal edges never straddle
        x_cross = (xj - xi) * (y - yi) / (yj - yi) + xi
    hits = np.count_nonzero(straddles & (x < x_cross), axis=1)
    return (hits % 2) == 1


def line_sides(points: np.ndarray, a: Point, b: Point) -> np.ndarray:
    """(n,) cross values of points against the line A-B (> 0 and < 0 are its two sides)."""
    return (b[0] - a[0]) * (points[:, 1] - a[1]) - (b[1] - a[1]) * (points[:, 0] - a[0])


def cross_value(p: Point, a: Point, b: Point) -> float:
    return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])


def meets_segment(p0: Point, p1: Point, a: Point, b: Point) -> bool:
    """Whether the path p0 -> p1, which changes sides of the line through A and B, meets it
    between A and B (ends included) rather than on its extension."""
    d0, d1 = cross_value(p0, a, b), cross_value(p1, a, b)
    if d0 == d1:  # parallel to the line: it does not change sides
        return False
    s = d0 / (d0 - d1)
    x = p0[0] + s * (p1[0] - p0[0])
    y = p0[1] + s * (p1[1] - p0[1])
    ab_x, ab_y = b[0] - a[0], b[1] - a[1]
    u = ((x - a[0]) * ab_x + (y - a[1]) * ab_y) / (ab_x * ab_x + ab_y * ab_y)
    return 0.0 <= u <= 1.0


def pixel_metrics(a: Point, b: Point, width: int, height: int) -> tuple[float, float, float]:
    """For the line A-B in a frame of this size: the factor turning a cross value (fractions) into a
    signed distance in pixels, and the weights of a box's width and height in its extent across
    the line (|normal x|, |normal y| of the unit normal in pixels)."""
    dx, dy = (b[0] - a[0]) * width, (b[1] - a[1]) * height
    length = math.hypot(dx, dy)
    return width * height / length, abs(dy) / length, abs(dx) / length
