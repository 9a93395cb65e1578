"""Whether a zone's outline is usable: checked once, when the config is read (`config.zones`).

Plain Python on the few points of one polygon, in fractions of the frame; the per-frame geometry
on NumPy arrays is `events.geometry`'s.
"""

from __future__ import annotations

from typing import Sequence

from .schema import Point


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
