"""The router's tracking stage (routing.tracking) on synthetic frames: candidates below the model's
threshold reach the tracker but not the message, track ids land on the right detections, counts
are published at start and events end when the camera is removed."""

from __future__ import annotations

import dataclasses

import numpy as np

from yoloedge.config.schema import CameraConfig
from yoloedge.config.schema import LineConfig
from yoloedge.events import CountsStore
from yoloedge.pipeline.cameras import CameraRuntime
from yoloedge.routing.router import FrameResult, ResultRouter, Sink
from yoloedge.pipeline.slots import SlotMeta
from yoloedge.postprocess import Detections
from yoloedge.routing import FrameKeeper, TrackingStage

LABELS = ("person", "car")


class Collect(Sink):
    name = "collect"

    def __init__(self) -> None:
        self.results: list[FrameResult] = []
        self.batches: list[tuple[str, object]] = []

    def frame(self, result: FrameResult) -> None:
        self.results.append(result)

    def events(self, camera, batch) -> None:
        self.batches.append((camera, batch))


def frame_dets(x: float) -> Detections:
    """A car moving right (confident), and a faint person standing still (0.15: a candidate only)."""
    boxes = np.array([[x, 100, x + 60, 160], [300, 50, 330, 120]], np.float32)
    scores = np.array([0.9, 0.15], np.float32)
    return Detections(boxes, scores, np.array([1, 0], np.int32), 640, 480, confident=scores > 0.25)


def test_candidates_feed_the_tracker_and_ids_land_on_the_published_detections():
    collect = Collect()
    config = CameraConfig(name="gate", url="synthetic://", min_score=0.5,
                          lines=(LineConfig("mid", ((0.5, 0.0), (0.5, 1.0))),))
    cameras = {"gate": CameraRuntime(config, "cpu0", None, None)}
    stage = TrackingStage(CountsStore(None), FrameKeeper(), emit=lambda camera, batch: router.events(camera, batch))
    router = ResultRouter(cameras, sinks=[collect], stages=[stage])
    stage.configure(config, LABELS)
    (camera, first), = collect.batches  # the counts at start: zeros
    assert camera == "gate" and [c.payload["in"] for c in first.counts] == [{}]
    assert router.floor("gate") == 0.1  # the tracker's low score: post-processing keeps candidates down to it
    for seq in range(12):
        meta = SlotMeta(camera="gate", seq=seq, capture_time=1000.0 + seq, capture_mono=float(seq),
                        frame_time=1000.0 + seq * 0.1)
        router.route(meta, frame_dets(100.0 + 30 * seq), "m", LABELS, 0.0, 0.0)
    messages = [r.message for r in collect.results]
    assert all(len(m["detections"]) == 1 and m["detections"][0]["label"] == "car" for m in messages)
    ids = [m["detections"][0]["track_id"] for m in messages]
    assert len({i for i in ids if i is not None}) == 1  # one car, one id from its confirmation on
    assert collect.results[-1].tracks is not None
    events = [m for r in collect.results if r.events is not None for m in r.events.messages]
    assert [e["type"] for e in events if e["type"] != "update"] == ["new"]
    crossed = [c for e in events for c in e["crossings"]]
    assert crossed and crossed[0]["direction"] == "in"  # left to right over a top-to-bottom line

    stage.remove("gate")
    ends = [m for _, batch in collect.batches for m in batch.messages if m["type"] == "end"]
    assert [e["id"] for e in ends] == [ids[-1]]
    assert stage.camera_status("gate") == {"zones": [], "lines": []}


def test_without_candidates_from_post_processing_the_stage_passes_the_frame_on():
    collect = Collect()
    config = CameraConfig(name="gate", url="synthetic://")
    stage = TrackingStage(CountsStore(None))
    router = ResultRouter({"gate": CameraRuntime(config, "cpu0", None, None)}, sinks=[collect],
                          stages=[stage])
    stage.configure(dataclasses.replace(config), LABELS)
    dets = frame_dets(100.0)
    router.route(SlotMeta(camera="gate", seq=0), dataclasses.replace(dets, confident=None), "m", LABELS, 0.0, 0.0)
    (result,) = collect.results
    assert result.track_ids is None and "track_id" not in result.message["detections"][0]


def test_frames_are_kept_for_best_shots_only_where_events_can_have_them():
    from yoloedge.sources.frame import Frame
    from yoloedge.config.schema import TrackingConfig

    keeper = FrameKeeper()
    stage = TrackingStage(CountsStore(None), keeper, emit=lambda camera, batch: None)
    image = np.zeros((48, 64, 3), np.uint8)
    for seq, (name, config) in enumerate([
            ("off", CameraConfig(name="off", url="synthetic://", tracking=TrackingConfig(enabled=False))),
            ("noshots", CameraConfig(name="noshots", url="synthetic://", event_snapshots_mb=0)),
            ("on", CameraConfig(name="on", url="synthetic://"))]):
        sink = keeper.tap(name, lambda f, timeout: True)
        stage.configure(config, LABELS)
        sink(Frame(name, seq, image, 1.7e9, float(seq)), 1.0)
        assert (keeper.find(name, seq, float(seq)) is not None) == (name == "on"), name
