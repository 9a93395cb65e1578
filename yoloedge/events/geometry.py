"""Plane geometry of zones and lines, in fractions of the frame (x right, y down).

Per frame the work is vectorised over the camera's tracks: one anchor array, one point-in-polygon
test per zone and one side test per line, each a few numpy operations on (tracks x vertices)
arrays. The scalar helpers (where a path meets a line, polygon checks) run only when a track's
side of a line changes, or once when the config is read.

The side of a line is the sign of `cross = (Bx-Ax)(Py-Ay) - (By-Ay)(Px-Ax)`. Scaling x and y by
the frame's width and height multiplies it by width * height > 0, so the side, and where along
A-B a path meets the line (an affine ratio), are the same in fractions and in pixels; only
distances (the hysteresis band of `events.lines`) need pixels, and they use them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .types import Anchor, Point


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


# -- config checks -------------------------------------------------------------------------------

def polygon_problem(points: Sequence[Point]) -> str | None:
    """Why `points` is not a usable zone outline, or None: at least 3 distinct points, edges that
    do not cross or fold back onto each other, and some area inside."""
    count = len(points)
    if count < 3:
        return f"a polygon needs at least 3 points, not {count}"
    if len(set(points)) != count:
        return "lists a point more than once"
    if all(_orient(points[0], points[1], p) == 0 for p in points[2:]):
        return "encloses no area (its points lie on one line)"
    for i in range(count):
        for j in range(i + 1, count):
            if _edges_clash(points, i, j):
                return (f"edges {i + 1} and {j + 1} cross (point {i + 1} -> {(i + 1) % count + 1} and "
                        f"{j + 1} -> {(j + 1) % count + 1}): the outline must not intersect itself")
    if abs(polygon_area(points)) < 1e-12:
        return "encloses no area"
    return None


def polygon_area(points: Sequence[Point]) -> float:
    """Signed area (shoelace formula)."""
    total = 0.0
    for i, (x0, y0) in enumerate(points):
        x1, y1 = points[(i + 1) % len(points)]
        total += x0 * y1 - x1 * y0
    return total / 2.0


def _edges_clash(points: Sequence[Point], i: int, j: int) -> bool:
    """Edge i runs from point i to i+1 (the last back to the first)."""
    count = len(points)
    p, q = points[i], points[(i + 1) % count]
    r, s = points[j], points[(j + 1) % count]
    if j == i + 1 or (i == 0 and j == count - 1):  # neighbours share a point: only a fold clashes
        shared, first, second = (q, p, s) if j == i + 1 else (p, q, r)
        return _folds_back(first, shared, second)
    return segments_intersect(p, q, r, s)


def _folds_back(first: Point, shared: Point, second: Point) -> bool:
    """Two edges meeting at `shared` overlap when they are collinear and point back."""
    u = (first[0] - shared[0], first[1] - shared[1])
    v = (second[0] - shared[0], second[1] - shared[1])
    return u[0] * v[1] - u[1] * v[0] == 0 and u[0] * v[0] + u[1] * v[1] > 0


def segments_intersect(p: Point, q: Point, r: Point, s: Point) -> bool:
    """Whether the closed segments p-q and r-s share a point."""
    d1, d2 = _orient(r, s, p), _orient(r, s, q)
    d3, d4 = _orient(p, q, r), _orient(p, q, s)
    if ((d1 > 0 > d2) or (d1 < 0 < d2)) and ((d3 > 0 > d4) or (d3 < 0 < d4)):
        return True
    return ((d1 == 0 and _on_segment(r, s, p)) or (d2 == 0 and _on_segment(r, s, q))
            or (d3 == 0 and _on_segment(p, q, r)) or (d4 == 0 and _on_segment(p, q, s)))


def _orient(a: Point, b: Point, c: Point) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _on_segment(a: Point, b: Point, c: Point) -> bool:
    """c, collinear with a-b, lies within its bounding box."""
    return min(a[0], b[0]) <= c[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])


def pixel_metrics(a: Point, b: Point, width: int, height: int) -> tuple[float, float, float]:
    """For the line A-B in a frame of this size: the factor turning a cross value (fractions) into a
    signed distance in pixels, and the weights of a box's width and height in its extent across
    the line (|normal x|, |normal y| of the unit normal in pixels)."""
    dx, dy = (b[0] - a[0]) * width, (b[1] - a[1]) * height
    length = math.hypot(dx, dy)
    return width * height / length, abs(dy) / length, abs(dx) / length
