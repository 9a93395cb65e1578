"""The tracker on the demo clip: IDF1 and identity switches against the clip's ground-truth tracks,
and against a reference ByteTrack (supervision 0.26.1's) given the same detections.

The detections come from the project's own detector on the demo model, with every candidate down
to the tracker's LOW_SCORE (as the router asks post-processing for), once per session. Frame times
are Unix seconds (a 2026 start, the clip's 10 fps), so float precision is what the daemon sees.

supervision is a test-only dependency: scripts/setup-env.sh installs it without its declared
requirements (they name opencv-python, the GUI build, which would replace opencv-python-headless's
cv2), and the dev extra brings what its ByteTrack import needs. Outside CI its absence skips the
comparison (YOLOEDGE_REQUIRE_REFERENCE=1, set by .ci/run, makes it a failure).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from conftest import skip_unless_required
from mot_eval import Scores, evaluate
from yoloedge.config import ModelConfig
from yoloedge.demo import LABELS, MODEL, TRUTH, clip_path
from yoloedge.postprocess import Detections
from yoloedge.config.schema import TrackingConfig
from yoloedge.tracking import Tracker, TrackIds

pytest.importorskip("scipy", reason="scipy (the dev extra) computes the MOT scores' optimal pairings")

START = 1_780_000_000.0  # frame times as a daemon sees them: Unix seconds


@pytest.fixture(scope="session")
def truth() -> dict:
    return json.loads(TRUTH.read_text())


@pytest.fixture(scope="session")
def demo_detections() -> list[Detections]:
    """Every frame's candidates down to the tracker's low threshold, from the demo model."""
    import cv2

    from yoloedge.pipeline.detector import open_detector

    low = Tracker(TrackingConfig(), []).LOW_SCORE
    cap = cv2.VideoCapture(str(clip_path()))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    detector = open_detector(ModelConfig(path=str(MODEL), labels=str(LABELS), conf=low), max_batch=10)
    try:
        result = []
        for i in range(0, len(frames), 10):
            result += detector.detect(frames[i:i + 10])
    finally:
        detector.close()
    return result


def truth_frames(truth: dict) -> list[list]:
    return [[(o["track"], o["box"], bool(o["difficult"])) for o in frame["objects"]] for frame in truth["frames"]]


def frame_times(truth: dict) -> list[float]:
    return [START + i / truth["fps"] for i in range(len(truth["frames"]))]


def ours(detections: list[Detections], times: list[float], config: TrackingConfig | None = None) -> list:
    """Per frame (track_id, box) of every confirmed track matched in the frame: the tracker's output,
    one box per track (what supervision returns too)."""
    tracker = Tracker(config or TrackingConfig(), LABELS.read_text().split(), ids=TrackIds(prefix="t"))
    out = []
    for dets, time in zip(detections, times):
        frame = tracker.update(dets, time)
        out.append([(t.id, t.box) for t in frame.tracks if t.matched])
    return out


def ours_published(detections: list[Detections], times: list[float], min_score: float) -> list:
    """Per frame (track_id, box) of every detection the daemon would publish (score >= model.conf)
    with a track id: a duplicate under a second label carries its track's id too."""
    tracker = Tracker(TrackingConfig(), LABELS.read_text().split(), ids=TrackIds(prefix="t"))
    out = []
    for dets, time in zip(detections, times):
        frame = tracker.update(dets, time)
        out.append([(tid, box) for tid, box, score in zip(frame.det_track_ids, dets.boxes.tolist(),
                                                          dets.scores.tolist())
                    if tid is not None and score >= min_score])
    return out


def supervision_tracks(detections: list[Detections], fps: float, **options) -> list:
    import supervision as sv

    tracker = sv.ByteTrack(frame_rate=int(fps), **options)
    out = []
    for dets in detections:
        result = tracker.update_with_detections(sv.Detections(
            xyxy=dets.boxes.astype(np.float32).reshape(-1, 4), confidence=dets.scores.astype(np.float32),
            class_id=dets.class_ids.astype(int)))
        out.append([(int(tid), box) for tid, box in zip(result.tracker_id, result.xyxy.tolist())])
    return out


def report(name: str, scores: Scores) -> str:
    return (f"{name}: IDF1 {scores.idf1:.4f} (IDTP {scores.idtp} of {scores.truth_boxes} truth / "
            f"{scores.predicted_boxes} predicted), ID switches {scores.id_switches}, "
            f"FN {scores.false_negatives}, FP {scores.false_positives}")


def test_ours_on_the_demo_ground_truth(demo_detections, truth):
    scores = evaluate(truth_frames(truth), ours(demo_detections, frame_times(truth)))
    print("\n" + report("yoloedge", scores))
    assert scores.idf1 >= 0.95, report("yoloedge", scores)
    assert scores.id_switches == 0, report("yoloedge", scores)


def test_the_same_frame_times_give_the_same_tracks_at_any_feed_rate(demo_detections, truth):
    """What is fed decides, not when: the tracker reads no clock, so the clip fed in one burst (as a
    file read faster than real time is) gives what it gives at the clip's pace; and the frame times
    decide the lost time, not the frame count: the same clip at twice the frame rate with lost_s
    halved loses tracks at the same frames."""
    times = frame_times(truth)
    assert ours(demo_detections, times) == ours(demo_detections, list(times))
    short = TrackingConfig(lost_s=0.5)
    fast = [START + (t - START) / 2 for t in times]
    assert ([[i for i, _ in f] for f in ours(demo_detections, times, short)]
            == [[i for i, _ in f] for f in ours(demo_detections, fast, replace(short, lost_s=0.25))])


#: ours against the reference at the same confirmation: our min_hits counts detections, supervision's
#: minimum_consecutive_frames the updates after the first (its default 1 confirms at the second).
PAIRS = [(3, 2), (2, 1)]


def test_at_least_as_good_as_supervision_bytetrack(demo_detections, truth):
    try:
        import supervision  # noqa: F401
    except ImportError:
        skip_unless_required("supervision 0.26.1 (the reference ByteTrack) is not installed: "
                             "source scripts/setup-env.sh; ensure_venv dev", "YOLOEDGE_REQUIRE_REFERENCE")
    gt = truth_frames(truth)
    times = frame_times(truth)
    lines = []
    for min_hits, consecutive in PAIRS:
        mine = evaluate(gt, ours(demo_detections, times, TrackingConfig(min_hits=min_hits)))
        theirs = evaluate(gt, supervision_tracks(demo_detections, truth["fps"],
                                                 minimum_consecutive_frames=consecutive))
        lines += [report(f"yoloedge min_hits={min_hits}", mine),
                  report(f"supervision minimum_consecutive_frames={consecutive}", theirs)]
        assert mine.idf1 >= theirs.idf1 and mine.id_switches <= theirs.id_switches, "\n".join(lines)
    conf = ModelConfig(path="").conf
    lines.append(report(f"yoloedge defaults, published detections (score >= {conf})",
                        evaluate(gt, ours_published(demo_detections, times, conf))))
    print("\n" + "\n".join(lines))
