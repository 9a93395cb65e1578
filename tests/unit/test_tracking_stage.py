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


# -- one camera, two models ------------------------------------------------------------------------

COCO, FACES = ("person", "car"), ("face",)


def model_result(runtime: CameraRuntime, model: str, seq: int, x: float, class_id: int) -> FrameResult:
    """Frame `seq`'s result from `model`, as the router builds it: one confident box at `x`
    (every model of the camera sees the same object at the same place)."""
    boxes = np.array([[x, 300, x + 60, 420]], np.float32)
    scores = np.array([0.9], np.float32)
    candidates = Detections(boxes, scores, np.array([class_id], np.int32), 640, 480, confident=scores > 0.25)
    return FrameResult(camera="door", seq=seq, capture_time=1000.0 + seq, capture_mono=float(seq),
                       frame_time=1000.0 + seq * 0.1, taken_mono=0.0, started_mono=0.0, inferred_mono=0.0,
                       routed_mono=0.0, detections=dataclasses.replace(candidates, confident=None),
                       labels=COCO if model == "coco" else FACES, model=model, runtime=runtime,
                       candidates=candidates, shown=np.array([0]))


def test_two_models_of_one_camera_track_apart_name_their_model_and_sum_their_counts():
    from yoloedge.config.schema import ZoneConfig
    from yoloedge.sources.frame import Frame

    config = CameraConfig(name="door", url="synthetic://",
                          zones=(ZoneConfig("left", ((0.0, 0.0), (0.5, 0.0), (0.5, 1.0), (0.0, 1.0))),),
                          lines=(LineConfig("mid", ((0.5, 0.0), (0.5, 1.0))),))
    runtime = CameraRuntime(config, "cpu0", None, None, models=("coco", "faces"))
    keeper = FrameKeeper()
    emitted: list[object] = []
    stage = TrackingStage(CountsStore(None), keeper, emit=lambda camera, batch: emitted.append(batch))
    reader = keeper.tap("door", lambda f, timeout: True)
    stage.configure(config, {"coco": COCO, "faces": FACES})
    image = np.zeros((480, 640, 3), np.uint8)
    out: list[FrameResult] = []

    def route(model: str, seq: int) -> None:
        result = stage.process(model_result(runtime, model, seq, 100.0 + 30 * seq, 1 if model == "coco" else 0))
        out.append(result)
        if result.events is not None and result.events.best:  # the event log encodes it now
            assert result.image is not None, f"{model} frame {seq}: its best shot's frame was let go"
        stage.done(result)

    for seq in range(12):  # the faces model runs one frame behind the coco one
        reader(Frame("door", seq, image, 1000.0 + seq, float(seq)), 1.0)
        route("coco", seq)
        if seq:
            route("faces", seq - 1)
    route("faces", 11)

    ids = {model: {i for r in out if r.model == model for i in r.track_ids or () if i is not None}
           for model in ("coco", "faces")}
    assert len(ids["coco"]) == 1 and len(ids["faces"]) == 1, ids  # one object each: one track each
    assert not ids["coco"] & ids["faces"]  # the same place, yet never one track across models
    messages = [m for r in out if r.events is not None for m in r.events.messages]
    new = {m["model"]: m for m in messages if m["type"] == "new"}
    assert set(new) == {"coco", "faces"} and len(messages) == len({(m["id"], m["type"], m["frame_time"])
                                                                   for m in messages})
    assert (new["coco"]["label"], new["faces"]["label"]) == ("car", "face")
    assert {new["coco"]["id"]} == ids["coco"] and {new["faces"]["id"]} == ids["faces"]
    assert all(list(m)[:6] == ["v", "type", "id", "camera", "model", "label"] for m in messages)
    zone_payloads = [c.payload for r in out if r.events is not None for c in r.events.counts if c.name == "left"]
    # each model's objects inside add up: one model's frame does not zero the other's
    assert any(p["objects"] == {"car": 1, "face": 1} for p in zone_payloads)
    status = stage.camera_status("door")
    assert status["lines"][0]["in"] == {"car": 1, "face": 1} and status["lines"][0]["out"] == {"car": 0, "face": 0}
    assert status["zones"][0]["entered"] == {"car": 1, "face": 1}
    assert status["zones"][0]["objects"] == {"car": 0, "face": 0}  # both went right, out of the zone
    (_, counts), = stage.counts()
    assert [c.payload.get("in") for c in counts if c.name == "mid"] == [{"car": 1, "face": 1}]
    assert all(keeper.find("door", seq, float(seq)) is None for seq in range(12))  # both done: all gone

    stage.remove("door")
    ends = {m["model"]: m["id"] for batch in emitted for m in batch.messages if m["type"] == "end"}
    assert ends == {"coco": new["coco"]["id"], "faces": new["faces"]["id"]}


def test_a_reload_that_drops_a_model_ends_its_events_and_keeps_the_others_tracks():
    config = CameraConfig(name="door", url="synthetic://")
    runtime = CameraRuntime(config, "cpu0", None, None, models=("coco", "faces"))
    emitted: list[object] = []
    stage = TrackingStage(CountsStore(None), emit=lambda camera, batch: emitted.append(batch))
    stage.configure(config, {"coco": COCO, "faces": FACES})
    out = [stage.process(model_result(runtime, model, seq, 100.0 + 10 * seq, 1 if model == "coco" else 0))
           for seq in range(5) for model in ("coco", "faces")]
    opened = {m["model"]: m["id"] for r in out for m in r.events.messages if m["type"] == "new"}
    assert set(opened) == {"coco", "faces"}
    stage.configure(config, {"coco": COCO})  # faces no longer fed to this camera
    ended = [m for batch in emitted for m in batch.messages if m["type"] == "end"]
    assert [(m["model"], m["id"]) for m in ended] == [("faces", opened["faces"])]
    later = stage.process(model_result(runtime, "coco", 5, 150.0, 1))
    assert later.track_ids == (opened["coco"],)  # coco's track went on through the reload
    assert stage.process(model_result(runtime, "faces", 5, 150.0, 0)).track_ids is None  # not tracked now


def test_one_named_model_gives_todays_events_with_the_model_named():
    config = CameraConfig(name="door", url="synthetic://", lines=(LineConfig("mid", ((0.5, 0.0), (0.5, 1.0))),))
    runs = []
    for labels in (COCO, {"coco": COCO}):  # as configured before issue 19, and by model name
        stage = TrackingStage(CountsStore(None))
        stage.configure(config, labels)
        runtime = CameraRuntime(config, "cpu0", None, None, models=("coco",))
        out = [stage.process(model_result(runtime, "coco", seq, 100.0 + 30 * seq, 1)) for seq in range(12)]
        stage.remove("door", forget=False)
        runs.append(([m for r in out for m in r.events.messages], stage))
    (before, _), (named, _) = runs
    assert before and all("model" not in m for m in before) and all(m["model"] == "coco" for m in named)
    strip = [{k: (v.split("-")[1] if k == "id" else v) for k, v in m.items() if k != "model"} for m in named]
    assert strip == [{k: (v.split("-")[1] if k == "id" else v) for k, v in m.items()} for m in before]


def test_two_models_routed_on_their_own_threads_at_once_count_and_release_everything():
    import threading
    from yoloedge.sources.frame import Frame

    config = CameraConfig(name="door", url="synthetic://", lines=(LineConfig("mid", ((0.5, 0.0), (0.5, 1.0))),))
    runtime = CameraRuntime(config, "cpu0", None, None, models=("coco", "faces"))
    keeper = FrameKeeper(depth=64)
    stage = TrackingStage(CountsStore(None), keeper)
    reader = keeper.tap("door", lambda f, timeout: True)
    stage.configure(config, {"coco": COCO, "faces": FACES})
    image = np.zeros((48, 64, 3), np.uint8)
    for seq in range(40):
        reader(Frame("door", seq, image, 1000.0 + seq, float(seq)), 1.0)
    failures: list[BaseException] = []

    def post(model: str, class_id: int) -> None:
        try:
            for seq in range(40):
                stage.done(stage.process(model_result(runtime, model, seq, 100.0 + 12 * seq, class_id)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)

    threads = [threading.Thread(target=post, args=("coco", 1)), threading.Thread(target=post, args=("faces", 0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures and not any(t.is_alive() for t in threads)
    assert stage.camera_status("door")["lines"][0]["in"] == {"car": 1, "face": 1}
    assert all(keeper.find("door", seq, float(seq)) is None for seq in range(40))
    assert keeper.stats("door")["frames_kept"] == 40


def test_a_zone_counting_another_models_label_is_no_typo_but_a_label_no_model_has_is(caplog):
    from yoloedge.config.schema import ZoneConfig

    square = ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0))
    config = CameraConfig(name="door", url="synthetic://",
                          zones=(ZoneConfig("faces", square, objects=("face",)),
                                 ZoneConfig("typo", square, objects=("fase",))))
    stage = TrackingStage(CountsStore(None))
    with caplog.at_level("WARNING"):
        stage.configure(config, {"coco": COCO, "faces": FACES})
    warned = [r.getMessage() for r in caplog.records if "never count" in r.getMessage()]
    assert warned and all("'fase'" in w for w in warned), warned
