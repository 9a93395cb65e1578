"""The result router (routing.router): each sink on its own, in frame order, errors counted."""

from __future__ import annotations

import numpy as np

from yoloedge.config.schema import CameraConfig
from yoloedge.pipeline.cameras import CameraRuntime
from yoloedge.routing.router import FrameResult, ResultRouter, Sink, Stage
from yoloedge.pipeline.slots import SlotMeta
from yoloedge.postprocess import Detections
from yoloedge.sources.state import CameraState

LABELS = ("person", "car")


class Recorder(Sink):
    def __init__(self, name: str):
        self.name = name
        self.frames: list[tuple[str, int, int]] = []
        self.states: list[tuple[str, CameraState]] = []

    def frame(self, result: FrameResult) -> None:
        self.frames.append((result.camera, result.seq, len(result.detections)))

    def camera_state(self, camera, state, reason, now) -> None:
        self.states.append((camera, state))


class Broken(Sink):
    name = "broken"

    def frame(self, result: FrameResult) -> None:
        raise OSError(f"disk full at frame {result.seq}")

    def camera_state(self, camera, state, reason, now) -> None:
        raise RuntimeError("no state either")


def _dets(scores: list[float], classes: list[int]) -> Detections:
    n = len(scores)
    boxes = np.tile(np.array([[10, 10, 50, 80]], np.float32), (n, 1))
    return Detections(boxes, np.array(scores, np.float32), np.array(classes, np.int32), 640, 480)


def _router(sinks, stages=(), **camera) -> ResultRouter:
    config = CameraConfig(name="gate", url="synthetic://", **camera)
    cameras = {"gate": CameraRuntime(config, "cpu0", None, None)}
    return ResultRouter(cameras, sinks=sinks, stages=stages, clock=lambda: 100.0,
                        wall_clock=lambda: 1.7e9)


def _meta(seq: int, camera: str = "gate") -> SlotMeta:
    return SlotMeta(camera=camera, seq=seq, capture_time=1.7e9 + seq, capture_mono=90.0 + seq, taken_mono=90.5 + seq)


def test_a_raising_sink_is_counted_and_every_other_sink_still_gets_every_frame():
    before, after = Recorder("before"), Recorder("after")
    router = _router([before, Broken(), after])
    for seq in range(5):
        router.route(_meta(seq), _dets([0.9], [0]), "yolo", LABELS, 95.0, 96.0)
    router.camera_state("gate", CameraState.STREAMING, None)
    expected = [("gate", seq, 1) for seq in range(5)]
    assert before.frames == expected and after.frames == expected
    assert after.states == [("gate", CameraState.STREAMING)]
    assert router.errors("broken") == 6 and router.errors("after") == 0
    stats = router.stats()
    assert stats["broken"]["errors"] == 6 and stats["broken"]["last_error"] == "RuntimeError: no state either"
    assert stats["before"] == {"errors": 0, "last_error": None}


def test_sinks_see_the_cameras_filters_applied_and_frames_of_removed_cameras_are_dropped():
    sink = Recorder("r")
    router = _router([sink], classes=("car",), min_score=0.5)
    router.route(_meta(0), _dets([0.9, 0.8, 0.4], [0, 1, 1]), "yolo", LABELS, 95.0, 96.0)
    router.route(_meta(1, camera="gone"), _dets([0.9], [1]), "yolo", LABELS, 95.0, 96.0)
    assert sink.frames == [("gate", 0, 1)]


class Tagger(Stage):
    """Gives every detection a track id, as the tracking stage does."""

    name = "tagger"

    def process(self, result: FrameResult) -> FrameResult:
        import dataclasses
        ids = tuple(f"t{i}" if i % 2 == 0 else None for i in range(len(result.detections)))
        return dataclasses.replace(result, track_ids=ids)


class BrokenStage(Stage):
    name = "broken_stage"

    def process(self, result: FrameResult) -> FrameResult:
        raise ValueError("bad zone")


def test_a_failing_stage_is_counted_and_the_frame_still_reaches_the_sinks_with_the_other_stages_work():
    seen: list[dict] = []

    class Messages(Sink):
        name = "messages"

        def frame(self, result: FrameResult) -> None:
            seen.append(result.message)

    router = _router([Messages()], stages=[BrokenStage(), Tagger()])
    router.route(_meta(3), _dets([0.9, 0.7], [0, 1]), "yolo", LABELS, 95.0, 96.0)
    assert router.errors("broken_stage") == 1
    [message] = seen
    assert [d["track_id"] for d in message["detections"]] == ["t0", None]
    assert [d["label"] for d in message["detections"]] == ["person", "car"]
    assert message["frame"] == 3 and message["model"] == "yolo"
