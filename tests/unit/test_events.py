"""Zones, lines, events and counts on synthetic tracks (issue 17, items 4 to 6).

The tracks are written out frame by frame (`Scene`), so every expected value is read off the
scene by hand: where an anchor is, which side of a line, how many frames inside a zone.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from yoloedge.config.polygon import polygon_problem
from yoloedge.config.schema import Anchor, LineConfig, ZoneConfig
from yoloedge.events import CameraEvents, CountKind, CountsState, CountsStore, UnknownCounts
from yoloedge.events.geometry import anchor_points, meets_segment, points_in_polygon
from yoloedge.tracking.types import Track, TrackFrame

W, H = 1000, 500  # the frame; an anchor at fraction (x, y) is pixel (1000x, 500y)
LABELS = ("person", "bicycle", "car")
PERSON, CAR = 0, 2


def box_at(x: float, y: float, w: float = 40, h: float = 100) -> tuple[float, float, float, float]:
    """The box whose bottom centre is at fraction (x, y) of the frame."""
    px, py = x * W, y * H
    return (px - w / 2, py - h, px + w / 2, py)


class Scene:
    """Tracker output written by hand: `frame(t, {id: box | None})` -- a box: matched there; None:
    alive, not matched (the box stays where it was); a track missing from the dict ended."""

    def __init__(self) -> None:
        self.alive: dict[str, Track] = {}

    def frame(self, time: float, tracks: dict, label: int = PERSON, scores: dict | None = None) -> TrackFrame:
        started, current = [], []
        for tid, box in tracks.items():
            old = self.alive.get(tid)
            score = (scores or {}).get(tid, 0.8)
            if box is None:
                track = Track(tid, old.label_id, old.box, 0.0, old.top_score, old.start_time, old.last_time,
                              False, -1)
            else:
                top = max(score, old.top_score) if old else score
                track = Track(tid, label if old is None else old.label_id, box, score, top,
                              old.start_time if old else time, time, True, 0)
            if old is None:
                started.append(track)
            current.append(track)
        ended = [track for tid, track in self.alive.items() if tid not in tracks]
        self.alive = {track.id: track for track in current}
        return TrackFrame(time, W, H, tuple(current), tuple(started), tuple(ended), ())

    def end_all(self, time: float) -> TrackFrame:
        ended = tuple(self.alive.values())
        self.alive = {}
        return TrackFrame(time, W, H, (), (), ended, ())


def events(zones=(), lines=(), counts=None) -> CameraEvents:
    return CameraEvents("gate", zones, lines, LABELS, counts if counts is not None else CountsState())


def run(ev: CameraEvents, scene: Scene, steps) -> list:
    """Feed (time, tracks) steps; every batch, in order."""
    return [ev.update(scene.frame(t, tracks)) for t, tracks in steps]


def messages(batches) -> list[dict]:
    return [m for b in batches for m in b.messages]


def crossings(batches, line="gate") -> list[str]:
    return [c["direction"] for m in messages(batches) if m["type"] == "end" for c in m["crossings"]
            if c["line"] == line]


def walk(xs, y=0.5, t0=0.0, dt=0.1, tid="a"):
    return [(t0 + i * dt, {tid: box_at(x, y)}) for i, x in enumerate(xs)]


VERTICAL = LineConfig("gate", ((0.5, 0.0), (0.5, 1.0)))  # top A to bottom B: left -> right is in


# -- geometry ----------------------------------------------------------------------------------

def test_anchor_is_bottom_centre_or_centre_in_fractions():
    boxes = np.array([[100.0, 50.0, 300.0, 450.0]])
    assert anchor_points(boxes, W, H, Anchor.BOTTOM_CENTER).tolist() == [[0.2, 0.9]]
    assert anchor_points(boxes, W, H, Anchor.CENTER).tolist() == [[0.2, 0.5]]


def test_points_in_a_concave_polygon():
    # an L: the square 0..1 without its top-right quarter
    ell = np.array([[0, 0], [0.5, 0], [0.5, 0.5], [1, 0.5], [1, 1], [0, 1]], dtype=float)
    points = np.array([[0.25, 0.25], [0.75, 0.25], [0.75, 0.75], [0.25, 0.75], [1.5, 0.5], [-0.1, 0.5]])
    assert points_in_polygon(points, ell).tolist() == [True, False, True, True, False, False]
    assert points_in_polygon(np.zeros((0, 2)), ell).tolist() == []


def test_path_through_the_segment_or_its_extension():
    a, b = (0.5, 0.4), (0.5, 0.6)
    assert meets_segment((0.4, 0.5), (0.6, 0.5), a, b)
    assert not meets_segment((0.4, 0.2), (0.6, 0.2), a, b)  # above A: the extension
    assert not meets_segment((0.4, 0.8), (0.6, 0.9), a, b)  # below B
    assert meets_segment((0.4, 0.4), (0.6, 0.4), a, b)  # through A itself


@pytest.mark.parametrize("points, problem", [
    ([(0, 0), (1, 0), (0, 1)], None),
    ([(0, 0), (1, 0)], "at least 3 points"),
    ([(0, 0), (1, 1), (1, 0), (0, 1)], "must not intersect itself"),  # a bow tie
    ([(0, 0), (0.5, 0.5), (1, 1)], "encloses no area"),
    ([(0, 0), (1, 0), (1, 0), (0, 1)], "more than once"),
    ([(0, 0), (1, 0), (0.5, 0), (0.5, 1)], "must not intersect itself"),  # folds back along an edge
    ([(0, 0), (1, 0), (1, 1), (0.5, 0), (0, 1)], "must not intersect itself"),  # a vertex on an edge
])
def test_polygon_checks(points, problem):
    found = polygon_problem(points)
    assert (found is None) if problem is None else (problem in found), found


# -- lines -------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, start, end, direction", [
    # the issue's example: a line from top A to bottom B, left to right is in
    (((0.5, 0.1), (0.5, 0.9)), (0.3, 0.5), (0.7, 0.5), "in"),
    (((0.5, 0.1), (0.5, 0.9)), (0.7, 0.5), (0.3, 0.5), "out"),
    # bottom A to top B turns it round
    (((0.5, 0.9), (0.5, 0.1)), (0.3, 0.5), (0.7, 0.5), "out"),
    # horizontal, A left, B right: cross = (1)(Py - Ay) > 0 below the line (y down): bottom -> top is in
    (((0.1, 0.5), (0.9, 0.5)), (0.5, 0.8), (0.5, 0.3), "in"),
    (((0.1, 0.5), (0.9, 0.5)), (0.5, 0.3), (0.5, 0.8), "out"),
    # diagonal A (0.1, 0.1), B (0.9, 0.9): cross = 0.8 (Py - Px), > 0 below-left of it
    (((0.1, 0.1), (0.9, 0.9)), (0.3, 0.7), (0.7, 0.3), "in"),
    (((0.1, 0.1), (0.9, 0.9)), (0.7, 0.3), (0.3, 0.7), "out"),
])
def test_direction_follows_the_cross_product_rule(line, start, end, direction):
    ev = events(lines=[LineConfig("gate", line)])
    scene = Scene()
    steps = [(i * 0.1, {"a": box_at(start[0] + (end[0] - start[0]) * i / 10, start[1] + (end[1] - start[1]) * i / 10,
                                     w=20, h=20)}) for i in range(11)]
    batches = run(ev, scene, steps)
    batches.append(ev.update(scene.frame(2.0, {})))
    assert crossings(batches) == [direction]
    counts = ev.counts.line_payload("gate")
    assert counts["in" if direction == "in" else "out"] == {"person": 1}


def test_crossing_the_extension_does_not_count():
    short = LineConfig("gate", ((0.5, 0.4), (0.5, 0.6)))
    ev = events(lines=[short])
    scene = Scene()
    batches = run(ev, scene, walk([0.3 + 0.04 * i for i in range(11)], y=0.2))  # above A
    batches += run(ev, scene, walk([0.7 - 0.04 * i for i in range(11)], y=0.5, t0=2))  # back through it
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == ["out"]


def test_jitter_on_the_line_counts_once():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    # box 40 px wide: band 4 px = 0.004 of the width. The anchor comes from the left, then sits on
    # the line for 40 frames, its x jumping 3 px either side of it, then walks on to the right.
    xs = [0.40, 0.45, 0.48] + [0.5 + (0.003 if i % 2 else -0.003) for i in range(40)] + [0.52, 0.55, 0.6]
    batches = run(ev, scene, walk(xs))
    batches.append(ev.update(scene.frame(10.0, {})))
    assert crossings(batches) == ["in"]
    assert ev.counts.line_payload("gate")["in"] == {"person": 1}
    assert ev.counts.line_payload("gate")["out"] == {"person": 0}


def test_touching_the_line_and_turning_back_counts_nothing():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    xs = [0.40, 0.45, 0.499, 0.501, 0.499, 0.503, 0.45, 0.40]  # never 4 px past the line
    batches = run(ev, scene, walk(xs))
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == []


def test_crossing_and_coming_back_counts_in_and_out():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    batches = run(ev, scene, walk([0.4, 0.45, 0.55, 0.6, 0.55, 0.45, 0.4]))
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == ["in", "out"]


def test_a_crossing_while_occluded_counts_when_seen_again():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    steps = walk([0.3, 0.35, 0.4]) + [(0.3 + i * 0.1, {"a": None}) for i in range(5)] + [(0.8, {"a": box_at(0.7, 0.5)})]
    batches = run(ev, scene, steps)
    batches.append(ev.update(scene.frame(5.0, {})))
    ends = [m for m in messages(batches) if m["type"] == "end"]
    assert ends[0]["crossings"] == [{"line": "gate", "direction": "in", "time": 0.8}]


def test_a_slow_crossing_still_inside_the_band_when_the_track_ends_counts_once():
    # band 4 px = 0.004 of the width: the anchor ends 2 px past the line (a slow object, or the
    # clip ended); the side it ended on decides
    ev = events(lines=[VERTICAL])
    scene = Scene()
    batches = run(ev, scene, walk([0.40, 0.45, 0.49, 0.499, 0.501, 0.502]))
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == ["in"]
    assert ev.counts.line_payload("gate")["in"] == {"person": 1}


def test_jitter_on_the_line_when_the_track_ends_counts_at_most_once():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    xs = [0.40, 0.45, 0.48] + [0.5 + (0.003 if i % 2 else -0.003) for i in range(20)]  # ends right of it
    batches = run(ev, scene, walk(xs))
    batches.append(ev.end_all(scene.end_all(5.0)))
    assert crossings(batches) == ["in"]


def test_a_track_first_seen_on_the_line_counts_when_it_leaves_on_the_other_side():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    batches = run(ev, scene, walk([0.499, 0.501, 0.52, 0.6]))  # first seen 1 px left of the line
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == ["in"]


def test_a_track_whose_label_changes_is_counted_under_its_new_label():
    # the tracker's vote: first "person", then (from the third frame on) "car"
    from dataclasses import replace
    ev = events(lines=[VERTICAL], zones=[ZoneConfig("yard", ((0.2, 0.2), (0.8, 0.2), (0.8, 0.8), (0.2, 0.8)),
                                                    inertia=1)])
    scene = Scene()
    frames = [scene.frame(t, tracks) for t, tracks in walk([0.4, 0.45, 0.55, 0.6, 0.65])]
    for frame in frames[:2]:
        ev.update(frame)
    assert ev.counts.line_payload("gate")["in"] == {}  # not crossed yet
    ev.update(frames[2])  # crossed as a person
    assert ev.counts.line_payload("gate")["in"] == {"person": 1}
    for frame in frames[3:]:
        relabelled = tuple(t._replace(label_id=CAR) for t in frame.tracks)
        ev.update(replace(frame, tracks=relabelled))
    assert ev.counts.line_payload("gate")["in"] == {"person": 0, "car": 1}
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 0, "car": 1}
    end = ev.update(scene.frame(5.0, {})).messages[-1]
    assert end["type"] == "end" and end["label"] == "car" and end["crossings"][0]["direction"] == "in"


def test_line_objects_filter():
    ev = events(lines=[LineConfig("gate", ((0.5, 0.0), (0.5, 1.0)), objects=("car",))])
    scene = Scene()
    batches = run(ev, scene, walk([0.4, 0.45, 0.55, 0.6]))  # a person
    batches.append(ev.update(scene.frame(5.0, {})))
    assert crossings(batches) == []
    assert ev.counts.line_payload("gate")["in"] == {"car": 0}


# -- zones -------------------------------------------------------------------------------------

YARD = ZoneConfig("yard", ((0.2, 0.2), (0.6, 0.2), (0.6, 0.8), (0.2, 0.8)))


def zone_steps(inside_flags, t0=0.0, dt=0.1, tid="a"):
    """The anchor inside the yard (0.4, 0.5) or outside it (0.8, 0.5), frame by frame."""
    return [(t0 + i * dt, {tid: box_at(0.4 if inside else 0.8, 0.5)}) for i, inside in enumerate(inside_flags)]


def test_inertia_frames_before_entering_and_leaving():
    ev = events(zones=[YARD])
    scene = Scene()
    run(ev, scene, zone_steps([False, True, True, False]))  # two frames in: not entered
    assert ev.counts.zone_payload("yard")["entered"] == {}
    run(ev, scene, zone_steps([True, True, True], t0=0.4))  # three: entered
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 1}
    assert ev.counts.zone_payload("yard")["objects"] == {"person": 1}
    run(ev, scene, zone_steps([False, True, False, False, True], t0=0.7))  # jitter on the edge: still in
    assert ev.counts.zone_payload("yard")["objects"] == {"person": 1}
    run(ev, scene, zone_steps([False, False, False], t0=1.2))  # three out: left
    assert ev.counts.zone_payload("yard")["objects"] == {"person": 0}
    run(ev, scene, zone_steps([True, True, True], t0=1.5))  # back: the same track counts once
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 1}


def test_dwell_from_arrival_to_departure():
    ev = events(zones=[YARD])
    scene = Scene()
    # outside at 0.0-0.9, inside from 1.0 (entered at 1.2, dating from 1.0), outside from 5.0 (left at
    # 5.2, dating from 5.0), then gone
    flags = [False] * 10 + [True] * 40 + [False] * 5
    batches = run(ev, scene, zone_steps(flags))
    batches.append(ev.update(scene.frame(9.0, {})))
    end = [m for m in messages(batches) if m["type"] == "end"][0]
    assert end["entered_zones"] == ["yard"] and end["current_zones"] == []
    assert end["dwell_s"] == {"yard": pytest.approx(4.0)}


def test_dwell_of_a_track_that_ends_inside_runs_to_its_last_sighting():
    ev = events(zones=[YARD])
    scene = Scene()
    batches = run(ev, scene, zone_steps([True] * 21))  # confirmed inside at 0.0, last seen at 2.0
    batches += [ev.update(scene.frame(2.0 + i * 0.5, {"a": None})) for i in range(1, 5)]
    batches.append(ev.update(scene.frame(4.5, {})))
    end = [m for m in messages(batches) if m["type"] == "end"][0]
    assert end["current_zones"] == ["yard"] and end["end_time"] == 2.0
    assert end["dwell_s"] == {"yard": pytest.approx(2.0)}


def test_new_event_already_lists_the_zone_it_is_confirmed_in():
    ev = events(zones=[YARD])
    first = ev.update(Scene().frame(0.0, {"a": box_at(0.4, 0.5)}))
    new = first.messages[0]
    assert new["type"] == "new" and new["current_zones"] == ["yard"] and new["entered_zones"] == ["yard"]
    assert first.counts[-1].payload["objects"] == {"person": 1}


def test_zone_objects_filter_and_center_anchor():
    cars = ZoneConfig("yard", YARD.polygon, objects=("car",))
    ev = events(zones=[cars])
    scene = Scene()
    run(ev, scene, zone_steps([True] * 5))  # a person
    assert ev.counts.zone_payload("yard") == {"v": 1, "objects": {"car": 0}, "entered": {"car": 0}, "since": 0.0}
    # the centre of a 100 px tall box standing at y = 0.9 is at 0.9 - 50/500 = 0.8: on the bottom
    # edge; standing at 0.95 its centre is at 0.85, outside, while its bottom centre is also outside
    centred = events(zones=[ZoneConfig("yard", YARD.polygon, anchor=Anchor.CENTER)])
    batch = centred.update(Scene().frame(0.0, {"a": box_at(0.4, 0.88)}))
    assert batch.messages[0]["current_zones"] == ["yard"]  # centre at 0.78 inside, bottom at 0.88 outside
    bottom = events(zones=[YARD]).update(Scene().frame(0.0, {"a": box_at(0.4, 0.88)}))
    assert bottom.messages[0]["current_zones"] == []


# -- events ------------------------------------------------------------------------------------

def test_payload_has_exactly_the_issues_fields():
    ev = events(zones=[YARD], lines=[VERTICAL])
    batch = ev.update(Scene().frame(100.0, {"a": (100.0, 50.0, 300.0, 450.0)}, label=CAR, scores={"a": 0.9}))
    new = batch.messages[0]
    assert list(new) == ["v", "type", "id", "camera", "label", "start_time", "end_time", "frame_time", "score",
                         "top_score", "box", "box_norm", "current_zones", "entered_zones", "crossings", "dwell_s",
                         "snapshot"]
    assert new["v"] == 1 and new["type"] == "new" and new["id"] == "a" and new["camera"] == "gate"
    assert new["label"] == "car" and new["start_time"] == 100.0 and new["end_time"] is None
    assert new["box"] == [100.0, 50.0, 300.0, 450.0] and new["box_norm"] == [0.1, 0.1, 0.3, 0.9]
    assert new["snapshot"] == {"frame_time": 100.0, "score": pytest.approx(0.9), "box": [100.0, 50.0, 300.0, 450.0]}
    assert json.loads(json.dumps(new)) == new
    assert [(b.event_id, b.frame_time) for b in batch.best] == [("a", 100.0)]


def test_updates_are_rate_limited_by_frame_time_and_nothing_pending_is_lost():
    ev = events(lines=[VERTICAL])
    scene = Scene()
    # 10 frames a second; the score rises every frame (a better snapshot each time), the line is
    # crossed between frames 15 (x = 0.49) and 16 (x = 0.52, 20 px past the line: out of the band)
    batches = []
    for i in range(25):
        frame = scene.frame(i * 0.1, {"a": box_at(0.04 + 0.03 * i, 0.5)}, scores={"a": 0.3 + 0.02 * i})
        batches.append(ev.update(frame))
    sent = [(m["type"], m["frame_time"]) for m in messages(batches)]
    assert sent == [("new", 0.0), ("update", pytest.approx(1.0)), ("update", pytest.approx(2.0))]
    assert len([b for batch in batches for b in batch.best]) == 25  # the router gets every better frame
    first, second = messages(batches)[1:]
    assert first["crossings"] == [] and first["snapshot"]["frame_time"] == pytest.approx(1.0)
    assert second["crossings"] == [{"line": "gate", "direction": "in", "time": pytest.approx(1.6)}]
    # a change after the last update (a better snapshot at 2.4) goes into the end
    end = ev.update(scene.frame(2.45, {})).messages[0]
    assert end["type"] == "end" and end["snapshot"]["frame_time"] == pytest.approx(2.4)
    assert end["end_time"] == pytest.approx(2.4) and end["frame_time"] == 2.45


def test_no_update_without_a_change():
    ev = events(zones=[YARD])
    scene = Scene()
    batches = run(ev, scene, [(i * 0.1, {"a": box_at(0.4, 0.5)}) for i in range(50)])  # standing still
    assert [m["type"] for m in messages(batches)] == ["new"]


def test_every_new_ends_with_one_end_and_end_all_ends_the_rest():
    ev = events(zones=[YARD])
    scene = Scene()
    out = []
    out.append(ev.update(scene.frame(0.0, {"a": box_at(0.4, 0.5), "b": box_at(0.8, 0.5)})))
    out.append(ev.update(scene.frame(0.1, {"b": box_at(0.8, 0.5)})))  # a ends
    out.append(ev.update(scene.frame(0.2, {"b": None, "c": box_at(0.3, 0.5)})))
    final = ev.end_all(scene.end_all(0.3))
    out.append(final)
    kinds = [(m["type"], m["id"]) for m in messages(out)]
    assert kinds == [("new", "a"), ("new", "b"), ("end", "a"), ("new", "c"), ("end", "b"), ("end", "c")]
    assert final.counts and final.counts[0].payload["objects"] == {"person": 0}
    assert not ev.end_all(scene.end_all(0.4))  # nothing left to end
    # an ended track the events never saw start gets no end
    assert not events().update(TrackFrame(1.0, W, H, (), (), (Track("x", 0, (0, 0, 1, 1), 0, 0.5, 0, 0, False, -1),),
                                          ())).messages


def test_best_snapshot_prefers_a_box_fully_in_view():
    ev = events()
    scene = Scene()
    edge = (0.0, 100.0, 100.0, 300.0)  # touching the left edge
    ev.update(scene.frame(0.0, {"a": edge}, scores={"a": 0.5}))
    inside = ev.update(scene.frame(0.1, {"a": (10.0, 100.0, 110.0, 300.0)}, scores={"a": 0.4}))
    assert [b.score for b in inside.best] == [pytest.approx(0.4)]  # in view beats cut off
    higher_at_edge = ev.update(scene.frame(0.2, {"a": edge}, scores={"a": 0.95}))
    assert higher_at_edge.best == ()
    end = ev.update(scene.frame(1.5, {})).messages[0]
    assert end["snapshot"]["score"] == pytest.approx(0.4) and end["top_score"] == pytest.approx(0.95)


# -- counts ------------------------------------------------------------------------------------

def test_first_batch_has_every_count_from_zero():
    ev = events(zones=[YARD], lines=[VERTICAL])
    first = ev.update(Scene().frame(50.0, {}))
    assert [(c.kind, c.name, c.payload) for c in first.counts] == [
        (CountKind.LINE, "gate", {"v": 1, "in": {}, "out": {}, "since": 50.0}),
        (CountKind.ZONE, "yard", {"v": 1, "objects": {}, "entered": {}, "since": 50.0})]
    assert CountKind.LINE.topic_level == "lines"
    assert not ev.update(Scene().frame(50.1, {})).counts  # nothing changed


def test_counts_by_label_and_only_when_changed():
    ev = events(zones=[YARD], lines=[VERTICAL])
    scene = Scene()
    ev.update(scene.frame(0.0, {}))
    batches = []
    for i in range(14):  # a car walks from the yard over the line; a person stands in the yard
        frame = scene.frame(0.1 * (i + 1), {"car": box_at(0.35 + 0.03 * i, 0.5), "p": box_at(0.3, 0.5)})
        batches.append(ev.update(frame))
    kinds = [[(c.kind.value, c.name) for c in b.counts] for b in batches]
    assert kinds[0] == [("zone", "yard")]  # both confirmed inside
    assert ("line", "gate") in [k for ks in kinds for k in ks]
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 2}  # the scene labels both person
    assert ev.counts.line_payload("gate")["in"] == {"person": 1}
    assert sum(len(k) for k in kinds) == 3  # entered, crossed, the car left the yard


def test_store_round_trip_and_atomic_durable_write(tmp_path, monkeypatch):
    store = CountsStore(tmp_path / "state")
    state = store.load("gate")
    ev = events(zones=[YARD], lines=[VERTICAL], counts=state)
    scene = Scene()
    run(ev, scene, walk([0.4, 0.45, 0.55, 0.6], t0=10.0))
    assert store.save("gate", state)
    written = json.loads((tmp_path / "state" / "gate.counts.json").read_text())
    assert written["lines"]["gate"] == {"in": {"person": 1}, "out": {"person": 0}, "since": 10.0}
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    assert store.save("gate", state) and synced == []  # unchanged: not written again
    state.add_crossing("gate", False, "person")
    assert store.save("gate", state) and len(synced) == 2  # the file, then its folder
    # a restart: a new store reads the totals back; objects inside are not kept
    again = CountsStore(tmp_path / "state").load("gate")
    assert again.line_payload("gate") == {"v": 1, "in": {"person": 1}, "out": {"person": 1}, "since": 10.0}
    assert again.zone_payload("yard")["objects"] == {}


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    store = CountsStore(tmp_path)
    state = store.load("gate")
    state.configure([("gate", ())], [], now=1.0)
    assert store.save("gate", state)
    before = (tmp_path / "gate.counts.json").read_bytes()
    state.add_crossing("gate", True, "car")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    assert not store.save("gate", state)
    assert (tmp_path / "gate.counts.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.counts.json"]  # no temporary left
    monkeypatch.undo()
    assert store.save("gate", state)  # tried again next time
    assert json.loads((tmp_path / "gate.counts.json").read_text())["lines"]["gate"]["in"] == {"car": 1}


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe", b"[]", b'{"v": 2, "camera": "gate"}', b'{"v": 1, "camera": "lobby", "lines": {}}',
    b'{"v": 1, "camera": "gate", "lines": {"gate": {"in": {"car": -1}, "out": {}, "since": 1}}}',
    b'{"v": 1, "camera": "gate", "lines": {"gate": {"in": {}, "out": {}, "since": "yesterday"}}}',
    b"",
])
def test_a_bad_file_is_kept_aside_and_counting_starts_from_zero(tmp_path, caplog, content):
    (tmp_path / "gate.counts.json").write_bytes(content)
    store = CountsStore(tmp_path, clock=lambda: 1234.0)
    state = store.load("gate")
    state.configure([("gate", ())], [], now=5.0)
    assert state.line_payload("gate") == {"v": 1, "in": {}, "out": {}, "since": 5.0}
    assert (tmp_path / "gate.counts.json.bad-1234").read_bytes() == content
    assert "is not a counts file" in caplog.text and "kept as gate.counts.json.bad-1234" in caplog.text


def test_counts_of_lines_and_zones_no_longer_configured_are_dropped(tmp_path):
    document = {"v": 1, "camera": "gate",
                "lines": {"gate": {"in": {"car": 3}, "out": {}, "since": 7.0},
                          "old": {"in": {"car": 9}, "out": {}, "since": 7.0}},
                "zones": {"yard": {"entered": {"person": 4}, "since": 8.0}}}
    (tmp_path / "gate.counts.json").write_text(json.dumps(document))
    store = CountsStore(tmp_path)
    ev = events(lines=[VERTICAL], counts=store.load("gate"))
    first = ev.update(Scene().frame(20.0, {}))
    assert [(c.name, c.payload) for c in first.counts] == [("gate", {"v": 1, "in": {"car": 3}, "out": {},
                                                                     "since": 7.0})]
    store.save("gate", ev.counts)
    assert set(json.loads((tmp_path / "gate.counts.json").read_text())["lines"]) == {"gate"}
    assert json.loads((tmp_path / "gate.counts.json").read_text())["zones"] == {}


def test_reset_one_or_all(tmp_path):
    store = CountsStore(tmp_path)
    ev = events(zones=[YARD], lines=[VERTICAL], counts=store.load("gate"))
    scene = Scene()
    run(ev, scene, walk([0.35, 0.4, 0.45, 0.55, 0.6]))  # entered the yard, crossed the line
    line_only = store.reset("gate", "gate", now=30.0)
    assert [(m.kind, m.payload) for m in line_only] == [
        (CountKind.LINE, {"v": 1, "in": {"person": 0}, "out": {"person": 0}, "since": 30.0})]
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 1}
    everything = store.reset("gate", None, now=40.0)
    assert [m.name for m in everything] == ["gate", "yard"]
    assert everything[1].payload["entered"] == {"person": 0} and everything[1].payload["since"] == 40.0
    saved = json.loads((tmp_path / "gate.counts.json").read_text())
    assert saved["zones"]["yard"] == {"entered": {"person": 0}, "since": 40.0}
    with pytest.raises(UnknownCounts, match="no line or zone named 'gaet'"):
        store.reset("gate", "gaet", now=50.0)
    with pytest.raises(UnknownCounts, match="camera 'lobby' has no counts"):
        store.reset("lobby", None, now=50.0)


def test_in_memory_store_saves_nothing(tmp_path):
    store = CountsStore(None)
    state = store.load("gate")
    state.configure([("gate", ())], [], now=1.0)
    assert store.save("gate", state) and store.path("gate") is None
    assert store.load("gate") is state


# -- reload ------------------------------------------------------------------------------------

def test_reconfigure_keeps_zones_by_name_and_events():
    ev = events(zones=[YARD, ZoneConfig("door", ((0.7, 0.2), (0.9, 0.2), (0.9, 0.8), (0.7, 0.8)))],
                lines=[VERTICAL])
    scene = Scene()
    run(ev, scene, zone_steps([True] * 5))  # in the yard since 0.0
    bigger = ZoneConfig("yard", ((0.1, 0.1), (0.65, 0.1), (0.65, 0.9), (0.1, 0.9)))
    new_line = LineConfig("exit", ((0.0, 0.9), (1.0, 0.9)))
    batch = ev.reconfigure([bigger], [new_line])
    assert [(c.kind.value, c.name) for c in batch.counts] == [("line", "exit")]
    assert batch.counts[0].payload == {"v": 1, "in": {}, "out": {}, "since": pytest.approx(0.4)}
    assert ev.counts.line_names() == ["exit"] and ev.counts.zone_names() == ["yard"]
    later = run(ev, scene, zone_steps([True] * 5, t0=0.5))
    assert [m["type"] for m in messages(later)] == []  # same event, still in the yard: nothing to say
    assert ev.counts.zone_payload("yard")["entered"] == {"person": 1}  # not entered a second time
    end = ev.update(scene.frame(2.0, {})).messages[0]
    assert end["id"] == "a" and end["current_zones"] == ["yard"]
    assert end["dwell_s"] == {"yard": pytest.approx(0.9)}


def test_a_removed_zone_ends_the_visit_and_keeps_its_dwell():
    ev = events(zones=[YARD])
    scene = Scene()
    run(ev, scene, zone_steps([True] * 11))  # in since 0.0, last frame 1.0
    ev.reconfigure([], [])
    assert ev.counts.zone_names() == []
    run(ev, scene, zone_steps([True] * 11, t0=1.1))
    end = ev.update(scene.frame(3.0, {})).messages[0]
    assert end["current_zones"] == [] and end["entered_zones"] == ["yard"]
    assert end["dwell_s"] == {"yard": pytest.approx(1.0)}


def test_objects_the_model_does_not_know_are_warned_about(caplog):
    events(zones=[ZoneConfig("yard", YARD.polygon, objects=("persn",))])
    assert "zone yard: object 'persn' is not one of the model's labels; it will never count" in caplog.text


def test_counts_can_be_published_before_the_first_frame():
    ev = events(lines=[VERTICAL])
    assert [m.payload for m in ev.counts_messages(now=5.0)] == [{"v": 1, "in": {}, "out": {}, "since": 5.0}]
    assert not ev.update(Scene().frame(6.0, {})).counts  # already published: not again
    with pytest.raises(ValueError):
        events().counts_messages()
