"""A camera's `zones:`, `lines:` and `publish:` keys (issue 17; see `events`).

Coordinates are fractions of the frame (0..1, x right, y down). A zone's polygon has at least 3
distinct points, does not intersect itself and encloses some area; a line has two distinct points.
Zone and line names become MQTT topic levels (`.../zones/{name}`, `.../lines/{name}`), so they are
read like camera names, and they are unique per camera across zones and lines (status and
`yoloedge-ctl reset-counts CAMERA NAME` name either by it). `objects` must be labels the camera
can publish (in its `classes:` when it has them) and, when the config gives the labels of every
model the camera gets (`labels:`, a list or a file), labels of one of those models, as must its
`classes:` (`check_camera_objects`); labels that only the model files know are checked when the
camera starts (a warning).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..model.labels import MAX_CLASSES
from .fields import (INVALID, MAX_NAME_BYTES, Choice, Context, Key, Integer, Reader, Text, did_you_mean, is_number,
                     read_fields, read_string_list, report_duplicate_names, sequence_or_report)
from .polygon import polygon_problem
from .schema import DEFAULT_INERTIA, Anchor, LineConfig, PublishMode, ZoneConfig
from .yamltree import Item

#: most zones, and most lines, per camera; every one is tested against every track each frame.
MAX_ZONES = 100
#: most points of a zone's outline (the self-intersection check is quadratic in them).
MAX_POLYGON_POINTS = 100
#: most frames of zone inertia: at 30 fps, 10 s inside before a track counts as entered.
MAX_INERTIA = 300

ANCHORS = tuple(anchor.value for anchor in Anchor)
PUBLISH_MODES = tuple(mode.value for mode in PublishMode)
POINT = "[x, y] with x and y from 0 to 1 (fractions of the frame's width and height)"


def read_point(ctx: Context, item: Item) -> Any:
    value = item.value
    if (item.is_sequence and len(value) == 2 and all(is_number(c.value) and 0 <= c.value <= 1 for c in value)):
        return (float(value[0].value), float(value[1].value))
    return ctx.bad_value(item, f"must be a point {POINT}", "e.g. [0.25, 0.5]")


def read_polygon(ctx: Context, item: Item) -> Any:
    children = sequence_or_report(ctx, item, "points", MAX_POLYGON_POINTS)
    if children is None:
        return INVALID
    points = [read_point(ctx, child) for child in children]
    if INVALID in points:
        return INVALID
    problem = polygon_problem(points)
    if problem is not None:
        return ctx.problem(item, f"not a usable zone outline: {problem}",
                           "e.g. polygon: [[0.05, 0.35], [0.35, 0.35], [0.35, 0.95], [0.05, 0.95]]")
    return tuple(points)


def read_line_points(ctx: Context, item: Item) -> Any:
    if not item.is_sequence or len(item.value) != 2:
        return ctx.bad_value(item, f"must be two points A and B, each {POINT}", "e.g. points: [[0.5, 0.0], [0.5, 1.0]]")
    points = [read_point(ctx, child) for child in item.value]
    if INVALID in points:
        return INVALID
    if points[0] == points[1]:
        return ctx.problem(item, "A and B are the same point; a line needs two distinct points")
    return (points[0], points[1])


def read_objects(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return None
    names = read_string_list(ctx, item, "label names", MAX_CLASSES)
    return INVALID if names is INVALID else tuple(dict.fromkeys(names))


def read_anchor(ctx: Context, item: Item) -> Any:
    value = Choice(ANCHORS)(ctx, item)
    return INVALID if value is INVALID else Anchor(value)


def read_publish(ctx: Context, item: Item) -> Any:
    value = Choice(PUBLISH_MODES)(ctx, item)
    return INVALID if value is INVALID else PublishMode(value)


NAME = Text(topic_safe=True, max_bytes=MAX_NAME_BYTES)

#: the keys zones and lines share, declared once
NAME_KEY = Key(NAME, "topic level (`.../zones/{name}`, `.../lines/{name}`), status, `reset-counts`",
               default="required, unique among the camera's zones and lines")
OBJECTS_KEY = Key(read_objects,
                  "count only these labels; null: every label. They must be in the camera's `classes` when it has "
                  "them, and labels of its models when the config gives their labels (labels only the model files "
                  "know are checked when the camera starts: a warning)",
                  type="non-empty list of labels, or null")
ANCHOR_KEY = Key(read_anchor, "the point of the box that counts: where an object stands, or the box's centre",
                 type="`bottom_center`, `center`")

ZONE_FIELDS: dict[str, Key] = {
    "name": NAME_KEY,
    "polygon": Key(read_polygon,
                   "the zone's outline: distinct points, not intersecting itself",
                   type=f"3 to {MAX_POLYGON_POINTS} points `[x, y]`, each 0..1",
                   default="required"),
    "objects": OBJECTS_KEY,
    "inertia": Key(Integer(ge=1, le=MAX_INERTIA, example=DEFAULT_INERTIA),
                   "consecutive frames inside before a track counts as entered, and outside before it counts as "
                   "gone"),
    "anchor": ANCHOR_KEY,
}

LINE_FIELDS: dict[str, Key] = {
    "name": NAME_KEY,
    "points": Key(read_line_points,
                  "the segment A-B; its direction decides what is `in` (below)",
                  type="two distinct points `[[Ax, Ay], [Bx, By]]`, each 0..1",
                  default="required"),
    "objects": OBJECTS_KEY,
    "anchor": ANCHOR_KEY,
}


def read_zones(ctx: Context, item: Item) -> Any:
    return _read_list(ctx, item, "zones", ZONE_FIELDS, ("name", "polygon"), ZoneConfig)


def read_lines(ctx: Context, item: Item) -> Any:
    return _read_list(ctx, item, "lines", LINE_FIELDS, ("name", "points"), LineConfig)


def _read_list(ctx: Context, item: Item, what: str, fields: Mapping[str, Reader], required: Sequence[str],
               build: Any) -> Any:
    if item.value is None:
        return ()
    children = sequence_or_report(ctx, item, what, MAX_ZONES)
    if children is None:
        return INVALID
    built = []
    for child in children:
        values = read_fields(ctx, child, fields, required)
        built.append(INVALID if values is None or any(key not in values for key in required) else build(**values))
    return INVALID if INVALID in built else tuple(built)


def zone_names_ok(ctx: Context, entries: dict) -> None:
    """Names are unique across a camera's zones and lines (reset-counts and status name either)."""
    children = [child for key in ("zones", "lines") if key in entries and entries[key].is_sequence
                for child in entries[key].value]
    names = [child.value["name"].value if child.is_mapping and "name" in child.value else None for child in children]
    report_duplicate_names(ctx, children, names, "zone or line")


def objects_in_classes_ok(ctx: Context, entries: dict, values: dict) -> bool:
    """A zone or line counting a label the camera never publishes (not in its `classes`) would
    count nothing: refused."""
    classes = values.get("classes")
    if classes is None:
        return True
    return _labels_ok(ctx, entries, classes, "is not in this camera's classes, so it would never count",
                      "add it to classes: or remove it here")


def check_camera_objects(ctx: Context, entries: dict, labels: Sequence[str], where: str) -> None:
    """Run once the models are valid, for a camera (its Items' entries) whose models' labels the
    config gives (`labels`: every label of the models it gets; `where`: how the message names
    them): its `classes`, and its zones' and lines' `objects`, must be among them. Works on the
    Items, like the accelerator check, so a camera with other problems is still checked."""
    classes = entries.get("classes")
    for label in classes.value if classes is not None and classes.is_sequence else ():
        if isinstance(label.value, str) and label.value not in labels:
            ctx.bad_value(label, f"is not one of {where}, so the camera would never publish it",
                          did_you_mean(label.value, labels))
    _labels_ok(ctx, entries, labels, f"is not one of {where}")


def _labels_ok(ctx: Context, entries: dict, known: Sequence[str], requirement: str, hint: str | None = None) -> bool:
    ok = True
    for key in ("zones", "lines"):
        section = entries.get(key)
        for child in section.value if section is not None and section.is_sequence else ():
            objects = child.value.get("objects") if child.is_mapping else None
            for label in objects.value if objects is not None and objects.is_sequence else ():
                if isinstance(label.value, str) and label.value not in known:
                    ctx.bad_value(label, requirement, did_you_mean(label.value, known) or hint)
                    ok = False
    return ok
