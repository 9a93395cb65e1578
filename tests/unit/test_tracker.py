"""The tracker on synthetic detections: crossing objects, occlusion gaps, label flicker, duplicates
under two labels, confirmation, the lost time in frame time, and the matching solver.

Every expected value follows from the rules (docs/integrations/tracking.md), not from running the code: ids
come from an injected TrackIds, times are given, and no clock is read.
"""

from __future__ import annotations

import itertools
import time as time_module

import numpy as np
import pytest

from yoloedge.postprocess import Detections
from yoloedge.config.schema import TrackingConfig
from yoloedge.tracking import Tracker, TrackIds
from yoloedge.tracking.assignment import match, solve
from yoloedge.tracking.ids import base36

T0 = 1_780_000_000.0
CAR, TRUCK, PERSON = 2, 7, 0
LABELS = [f"class{i}" for i in range(10)]


def dets(*objects, width=640, height=480) -> Detections:
    """objects: (x1, y1, x2, y2, score, class_id); sorted by score as post-processing gives them."""
    rows = sorted(objects, key=lambda o: -o[4])
    return Detections(np.array([r[:4] for r in rows], np.float32).reshape(-1, 4),
                      np.array([r[4] for r in rows], np.float32), np.array([r[5] for r in rows], np.int32),
                      width, height)


def box(x, y, size=40, score=0.9, cls=PERSON):
    return (x, y, x + size, y + size, score, cls)


def tracker(**options) -> Tracker:
    t = Tracker(TrackingConfig(**options), LABELS, ids=TrackIds(prefix="t"))
    t.update(dets(), T0 - 1.0)  # an empty first frame: upstream confirms the first frame's tracks at once
    return t


def feed(t: Tracker, frames, fps=10.0, start=T0):
    return [t.update(d, start + i / fps) for i, d in enumerate(frames)]


def ids_of(frame) -> list:
    return list(frame.det_track_ids)


# -- confirmation ------------------------------------------------------------------------------

def test_a_track_is_confirmed_at_its_min_hits_th_detection():
    frames = feed(tracker(), [dets(box(100 + 5 * i, 100)) for i in range(4)])
    assert [ids_of(f) for f in frames] == [[None], [None], ["t-1"], ["t-1"]]
    assert [len(f.started) for f in frames] == [0, 0, 1, 0]
    started = frames[2].started[0]
    assert started == frames[2].tracks[0]
    assert (started.start_time, started.last_time, started.matched, started.detection) == (T0, T0 + 0.2, True, 0)
    assert started.box == (110.0, 100.0, 150.0, 140.0) and started.score == pytest.approx(0.9)


def test_min_hits_one_confirms_at_once_and_a_tentative_track_dies_at_its_first_miss():
    assert ids_of(feed(tracker(min_hits=1), [dets(box(10, 10))])[0]) == ["t-1"]
    t = tracker()
    frames = feed(t, [dets(box(100, 100)), dets(box(100, 100)), dets(), dets(box(100, 100))])
    assert [ids_of(f) for f in frames] == [[None], [None], [], [None]]
    assert all(not f.tracks and not f.ended for f in frames)  # tentative tracks never end: never started


def test_the_first_frame_confirms_what_is_in_view_as_upstream():
    t = Tracker(TrackingConfig(), LABELS, ids=TrackIds(prefix="t"))
    frame = t.update(dets(box(10, 10), box(200, 10, score=0.3)), T0)
    # 0.3 is a high-score detection (>= 0.25) but below the new-track score 0.25 + 0.1
    assert ids_of(frame) == ["t-1", None] and len(frame.started) == 1


def test_low_score_detections_keep_a_track_but_never_start_one():
    t = tracker()
    frames = feed(t, [dets(box(100 + 4 * i, 100, score=0.9 if i < 3 else 0.15), box(400, 300, score=0.15))
                      for i in range(6)])
    assert [ids_of(f) for f in frames[2:]] == [["t-1", None]] * 4
    assert all(f.tracks[0].matched for f in frames[2:])
    assert frames[-1].tracks[0].score == pytest.approx(0.15) and frames[-1].tracks[0].top_score == pytest.approx(0.9)
    # below low_score a detection is not used at all
    frame = t.update(dets(box(124, 100, score=0.05)), T0 + 0.6)
    assert ids_of(frame) == [None] and not frame.tracks[0].matched and frame.tracks[0].score == 0.0


# -- motion ------------------------------------------------------------------------------------

def test_crossing_objects_keep_their_ids():
    """Two people walk past each other (same class; their boxes overlap by IoU 1/3 as they pass)."""
    frames = [dets(box(100 + 10 * i, 100), box(300 - 10 * i, 120)) for i in range(25)]
    result = feed(tracker(), frames)

    def id_at_y(frame, d, y):  # A walks right at y 100, B left at y 120
        return frame.det_track_ids[d.boxes[:, 1].tolist().index(y)]
    a = {id_at_y(f, d, 100.0) for f, d in zip(result[2:], frames[2:])}
    b = {id_at_y(f, d, 120.0) for f, d in zip(result[2:], frames[2:])}
    assert len(a) == len(b) == 1 and a != b and None not in a | b
    assert all(not f.ended for f in result)


def test_an_occluded_object_keeps_its_id_and_is_predicted_along_its_path():
    t = tracker()
    seen = [dets(box(100 + 10 * i, 200)) for i in range(10)]      # 100 px/s at 10 fps
    gap = [dets()] * 8                                            # 0.8 s hidden, lost_s is 2
    back = [dets(box(100 + 10 * i, 200)) for i in range(18, 21)]
    frames = feed(t, seen + gap + back)
    hidden = frames[10:18]
    assert all(len(f.tracks) == 1 and not f.tracks[0].matched and f.tracks[0].detection == -1 for f in hidden)
    # predicted on at close to 100 px/s (the filter's velocity is still converging after 10 frames)
    assert hidden[-1].tracks[0].box[0] == pytest.approx(100 + 10 * 17, abs=10)
    assert [ids_of(f) for f in frames[18:]] == [["t-1"]] * 3
    assert not any(f.ended for f in frames)


def test_a_track_ends_at_the_first_frame_lost_s_after_its_last_match():
    t = tracker(lost_s=2.0)
    frames = feed(t, [dets(box(100, 100))] * 3 + [dets()] * 25)
    ended = [i for i, f in enumerate(frames) if f.ended]
    assert ended == [2 + 20]  # last matched at frame 2, ended 2.0 s (20 frames) later
    gone = frames[22].ended[0]
    assert (gone.id, gone.matched, gone.score, gone.last_time) == ("t-1", False, 0.0, T0 + 0.2)
    assert frames[21].tracks and not frames[22].tracks
    # the object coming back later is a new track
    again = feed(t, [dets(box(100, 100))] * 3, start=T0 + 10)
    assert ids_of(again[-1]) == ["t-2"]


def test_the_lost_time_is_frame_time_not_frames():
    """At 5, 10 and 25 fps a track lost at the same moment ends at the same moment."""
    end_times = []
    for fps in (5.0, 10.0, 25.0):
        t = tracker(lost_s=1.0)
        n_seen = int(fps)  # one second seen, then three hidden
        frames = feed(t, [dets(box(100, 100))] * n_seen + [dets()] * int(3 * fps), fps=fps)
        (end,) = [f for f in frames if f.ended]
        end_times.append(round(end.time - end.ended[0].last_time, 6))
    assert end_times == [1.0, 1.0, 1.0]


def test_feeding_faster_than_real_time_changes_nothing(monkeypatch):
    """The tracker reads no clock: with every clock made to fail, the same frames at the same frame
    times give the same tracks (a file read faster than its rate)."""
    frames = [dets(box(100 + 7 * i, 100), box(300, 50 + 3 * i, cls=CAR)) for i in range(12)]
    expected = [(f.det_track_ids, f.tracks) for f in feed(tracker(), frames)]
    t = tracker()

    def no_clock(*args):
        raise AssertionError("the tracker read a clock")
    for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time_module, name, no_clock)
    assert [(f.det_track_ids, f.tracks) for f in feed(t, frames)] == expected


# -- labels and duplicates ---------------------------------------------------------------------

def test_a_car_flickering_to_truck_keeps_its_id_and_its_label():
    classes = [CAR, CAR, CAR, TRUCK, CAR, TRUCK, CAR, CAR]
    frames = feed(tracker(), [dets(box(100 + 5 * i, 100, cls=c)) for i, c in enumerate(classes)])
    assert {f.det_track_ids[0] for f in frames[2:]} == {"t-1"}
    assert [f.tracks[0].label_id for f in frames[2:]] == [CAR] * 6


def test_the_label_is_the_score_weighted_vote():
    # car at 0.4 three times (1.2), then truck at 0.9 twice (1.8): truck wins at its second frame
    frames = feed(tracker(), [dets(box(100, 100, score=s, cls=c)) for s, c in
                              [(0.4, CAR)] * 3 + [(0.9, TRUCK)] * 2])
    assert [f.tracks[0].label_id for f in frames[2:]] == [CAR, CAR, TRUCK]


def test_one_object_detected_under_two_labels_is_one_track():
    # the car box and a truck box over it (IoU 0.81) in every frame: one track, carried by the car box
    frames = feed(tracker(), [dets(box(100 + 5 * i, 100, size=50, score=0.8, cls=CAR),
                                   (100 + 5 * i, 100, 150 + 5 * i, 145, 0.6, TRUCK)) for i in range(5)])
    assert [ids_of(f) for f in frames] == [[None, None], [None, None]] + [["t-1", None]] * 3
    assert [len(f.tracks) for f in frames] == [0, 0, 1, 1, 1]
    assert sum(len(f.started) for f in frames) == 1
    assert frames[-1].tracks[0].label_id == CAR and frames[-1].tracks[0].detection == 0


def test_the_duplicates_votes_count_and_the_track_shows_the_detection_of_its_label():
    # truck stronger in each frame (0.6 vs car 0.5) but the car box is there twice as often
    frames = []
    t = tracker()
    for i in range(6):
        car = box(100 + 5 * i, 100, size=50, score=0.5, cls=CAR)
        truck = (100 + 5 * i, 100, 150 + 5 * i, 145, 0.6, TRUCK)
        frames.append(t.update(dets(truck, car) if i % 2 == 0 else dets(car), T0 + i / 10))
    # votes: car 3 x 0.5 + ... = 3.0 after six frames; truck 3 x 0.6 = 1.8
    last = frames[-2]  # a frame with both boxes: the truck (index 0) was matched, the car is shown
    assert last.tracks[0].label_id == CAR and last.tracks[0].detection == 1
    # one detection per track carries its id: the one shown; the duplicate stays None, so a
    # consumer counting boxes by track_id sees one box for the one object
    assert last.det_track_ids == (None, last.tracks[0].id)


def test_different_objects_of_different_classes_overlapping_less_stay_apart():
    frames = feed(tracker(), [dets(box(100, 100, size=50, cls=CAR), box(130, 100, size=50, cls=PERSON))] * 4)
    assert sorted(ids_of(frames[-1])) == ["t-1", "t-2"]


# -- lifecycle ---------------------------------------------------------------------------------

def test_reconfigure_keeps_tracks_and_end_all_ends_the_confirmed_ones():
    t = tracker()
    frames = feed(t, [dets(box(100, 100), box(300, 100))] * 3 + [dets(box(100, 100), box(300, 100),
                                                                        box(500, 300))])
    t.reconfigure(TrackingConfig(lost_s=10.0, low_score=0.2))
    assert t.LOW_SCORE == 0.2
    frame = t.update(dets(box(100, 100), box(300, 100), box(500, 300)), T0 + 0.4)
    assert sorted(i for i in frame.det_track_ids if i) == sorted(x.id for x in frames[-1].tracks)
    final = t.end_all(T0 + 0.5)
    assert sorted(x.id for x in final.ended) == ["t-1", "t-2"]  # the third was still tentative
    assert final.tracks == () and final.started == () and final.time == T0 + 0.5
    assert (final.width, final.height) == (640, 480)
    assert t.end_all(T0 + 0.6).ended == ()


def test_track_ids_are_unique_across_restarts_and_trackers():
    first, second = TrackIds(start=T0), TrackIds(start=T0 + 0.001)
    assert first.prefix != second.prefix and first.prefix == base36(int(T0 * 1e6))
    assert [first.next(), first.next()] == [f"{first.prefix}-1", f"{first.prefix}-2"]
    shared = TrackIds(prefix="p")
    a = Tracker(TrackingConfig(min_hits=1), LABELS, ids=shared)
    b = Tracker(TrackingConfig(min_hits=1), LABELS, ids=shared)
    assert a.update(dets(box(1, 1)), T0).det_track_ids + b.update(dets(box(1, 1)), T0).det_track_ids == ("p-1", "p-2")
    assert base36(0) == "0" and base36(36 * 36 - 1) == "zz"


# -- matching ----------------------------------------------------------------------------------

def brute_force(cost: np.ndarray) -> float:
    n, m = cost.shape
    if n > m:
        return brute_force(cost.T)
    return min(sum(cost[i, c] for i, c in enumerate(cols)) for cols in itertools.permutations(range(m), n))


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (3, 2), (4, 4), (5, 3), (3, 6)])
def test_the_solver_finds_the_minimum_assignment(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        cost = rng.random(shape).round(1)  # rounded: ties too
        rows, cols = solve(cost)
        assert len(set(rows.tolist())) == len(rows) == len(set(cols.tolist())) == min(shape)
        assert cost[rows, cols].sum() == pytest.approx(brute_force(cost))


def test_match_takes_only_pairs_within_the_threshold_and_as_many_as_possible():
    cost = np.array([[0.1, 0.2, 0.9],
                     [0.15, 0.95, 0.9],
                     [0.9, 0.9, 0.9],
                     [0.9, 0.9, 0.3]])
    rows, cols = match(cost, 0.5)
    assert list(zip(rows.tolist(), cols.tolist())) == [(0, 1), (1, 0), (3, 2)]
    rng = np.random.default_rng(7)
    for _ in range(30):
        cost = rng.random((4, 5)).round(2)
        rows, cols = match(cost, 0.6)
        assert (cost[rows, cols] <= 0.6).all()
        # the same total as upstream's rule: over-threshold pairs priced at thresh + 1e-4
        priced = np.minimum(cost, 0.6 + 1e-4)
        best = brute_force(priced)
        got = cost[rows, cols].sum() + (0.6 + 1e-4) * (4 - len(rows))
        assert got == pytest.approx(best)
