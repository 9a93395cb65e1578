"""Home Assistant's objects-in-view sensors of a camera fed to several models (issue 19): the sink
(routing.sinks.homeassistant) on real FrameResults, with the real registry and renderer
(publish.homeassistant); only the MQTT client is a recorder of what it was handed. Every
value_template is rendered with Jinja2 (what HA renders with) on the payload really produced."""

from __future__ import annotations

import json

import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from yoloedge.config.schema import CameraConfig, HomeAssistantConfig
from yoloedge.pipeline.cameras import CameraRuntime
from yoloedge.postprocess import Detections
from yoloedge.publish.homeassistant import OBJECTS_MIN_INTERVAL_S, Discovery, Message, Renderer
from yoloedge.publish.topics import Topics
from yoloedge.routing.router import FrameResult
from yoloedge.routing.sinks.homeassistant import HomeAssistantSink

COCO, FACES = ("person", "car"), ("face",)
JINJA = ImmutableSandboxedEnvironment()
OBJECTS = "yt/edge1/cameras/door/objects"


class Recorder:
    """What the sink uses of `MqttPublisher`: the registry, the renderer, and the hand-over."""

    def __init__(self) -> None:
        self.discovery = Discovery("edge1", "1.0", "m")
        self.homeassistant = Renderer(HomeAssistantConfig(), Topics("yt", "edge1"), self.discovery)
        self.sent: list[tuple[Message, bool]] = []

    def publish_discovery(self, messages: list[Message], removal: bool = False) -> None:
        self.sent.extend((m, removal) for m in messages)

    def configs(self) -> dict[str, dict]:
        """The retained config of each entity now (an empty one removes it), by unique id."""
        out: dict[str, dict] = {}
        for message, _ in self.sent:
            if not message.topic.endswith("/config"):
                continue
            uid = message.topic.split("/")[-2]
            if message.payload:
                out[uid] = json.loads(message.payload)
            else:
                out.pop(uid, None)
        return out

    def objects(self) -> list[bytes]:
        return [m.payload for m, _ in self.sent if m.topic == OBJECTS]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def result(runtime: CameraRuntime, model: str, class_ids: list[int], seq: int = 0) -> FrameResult:
    n = len(class_ids)
    boxes = np.tile(np.array([[10, 10, 50, 50]], np.float32), (n, 1))
    dets = Detections(boxes, np.full(n, 0.9, np.float32), np.array(class_ids, np.int32), 640, 480)
    return FrameResult(camera="door", seq=seq, capture_time=1000.0 + seq, capture_mono=float(seq),
                       frame_time=1000.0 + seq, taken_mono=0.0, started_mono=0.0, inferred_mono=0.0,
                       routed_mono=0.0, detections=dets, labels=COCO if model == "coco" else FACES,
                       model=model, runtime=runtime)


def render(template: str, payload: bytes) -> str:
    return JINJA.from_string(template).render(value=payload.decode(), value_json=json.loads(payload))


def sink_for(config: CameraConfig) -> tuple[HomeAssistantSink, Recorder, Clock]:
    recorder, clock = Recorder(), Clock()
    sink = HomeAssistantSink(lambda: recorder, clock)  # type: ignore[arg-type, return-value]
    sink.camera_added(config)
    return sink, recorder, clock


def test_a_camera_with_one_model_keeps_todays_entities_and_payloads():
    config = CameraConfig(name="door", url="synthetic://")
    seen = []
    for models in ((), ("coco",)):  # old callers' runtime, and one named model
        sink, recorder, clock = sink_for(config)
        runtime = CameraRuntime(config, "cpu0", None, None, models=models)
        sink.frame(result(runtime, "coco", [0, 0, 1]))
        clock.t += OBJECTS_MIN_INTERVAL_S
        sink.frame(result(runtime, "coco", [0]))
        seen.append(([(m.topic, m.payload) for m, _ in recorder.sent]))
        configs = recorder.configs()
        person = configs["yoloedge__edge1__door__objects_person"]
        assert person["name"] == "door person" and person["state_topic"] == OBJECTS
        assert [json.loads(p) for p in recorder.objects()] == [{"person": 2, "car": 1}, {"person": 1, "car": 0}]
        assert render(person["value_template"], recorder.objects()[-1]) == "1"
    assert seen[0] == seen[1]


def test_two_models_get_a_sensor_per_model_and_label_each_counting_its_own_frames():
    config = CameraConfig(name="door", url="synthetic://")
    sink, recorder, clock = sink_for(config)
    runtime = CameraRuntime(config, "cpu0", None, None, models=("coco", "faces"))
    sink.frame(result(runtime, "coco", [0, 0], seq=0))
    sink.frame(result(runtime, "faces", [0], seq=0))  # new label: announced, counts go out at once
    clock.t += OBJECTS_MIN_INTERVAL_S
    sink.frame(result(runtime, "coco", [0], seq=1))  # coco sees one person now; faces still its face
    configs = recorder.configs()
    assert set(configs) == {"yoloedge__edge1__door__streaming", "yoloedge__edge1__door__fps",
                            "yoloedge__edge1__door__coco__objects_person",
                            "yoloedge__edge1__door__faces__objects_face"}
    person = configs["yoloedge__edge1__door__coco__objects_person"]
    face = configs["yoloedge__edge1__door__faces__objects_face"]
    assert (person["name"], face["name"]) == ("door coco person", "door faces face")
    assert [json.loads(p) for p in recorder.objects()] == [
        {"coco": {"person": 2}, "faces": {}}, {"coco": {"person": 2}, "faces": {"face": 1}},
        {"coco": {"person": 1}, "faces": {"face": 1}}]
    last = recorder.objects()[-1]
    assert (render(person["value_template"], last), render(face["value_template"], last)) == ("1", "1")
    assert render(face["value_template"], recorder.objects()[0]) == "0"  # before faces' first frame
    # stopped: zeros for every model at once
    from yoloedge.sources.state import CameraState
    sink.camera_state("door", CameraState.STOPPED, None, 0.0)
    assert json.loads(recorder.objects()[-1]) == {"coco": {"person": 0}, "faces": {"face": 0}}
    # a reconnect republishes the same entities and the last counts
    again = {m.topic: m.payload for m in recorder.homeassistant.everything()}
    assert {t.split("/")[-2] for t in again if t.endswith("/config")} == set(configs)
    assert json.loads(again[OBJECTS]) == {"coco": {"person": 0}, "faces": {"face": 0}}


def test_classes_give_each_model_the_sensors_of_the_classes_it_has():
    config = CameraConfig(name="door", url="synthetic://", classes=("person", "face"))
    sink, recorder, _ = sink_for(config)
    assert set(recorder.configs()) >= {"yoloedge__edge1__door__objects_person",
                                       "yoloedge__edge1__door__objects_face"}  # one model's, as today
    runtime = CameraRuntime(config, "cpu0", None, None, models=("coco", "faces"))
    sink.frame(result(runtime, "faces", [0]))
    configs = recorder.configs()
    objects = sorted(uid for uid in configs if "objects" in uid)
    assert objects == ["yoloedge__edge1__door__faces__objects_face"]  # the old layout's went
    removed = {m.topic.split("/")[-2] for m, removal in recorder.sent if removal}
    assert removed == {"yoloedge__edge1__door__objects_person", "yoloedge__edge1__door__objects_face"}
    sink.frame(result(runtime, "coco", []))  # coco has person, not face; no car (not in classes)
    objects = sorted(uid for uid in recorder.configs() if "objects" in uid)
    assert objects == ["yoloedge__edge1__door__coco__objects_person", "yoloedge__edge1__door__faces__objects_face"]
    # back to one model (a reload): the per-model sensors go, today's come back
    sink.frame(result(CameraRuntime(config, "cpu0", None, None, models=("coco",)), "coco", [0]))
    objects = sorted(uid for uid in recorder.configs() if "objects" in uid)
    assert objects == ["yoloedge__edge1__door__objects_face", "yoloedge__edge1__door__objects_person"]
    assert json.loads(recorder.objects()[-1]) == {"person": 1, "face": 0}


def test_per_model_ids_are_stable_and_distinct_from_every_other_entity():
    reg = Discovery("edge1", "1.0", "m")
    renderer = Renderer(HomeAssistantConfig(), Topics("yt", "edge1"), reg)
    reg.set_camera("door", None)
    reg.set_counters("door", ["objects"], ["in"])
    reg.set_models("door", ("line_in", "objects", "a b", "a_b"))
    for model in ("line_in", "objects", "a b", "a_b"):
        reg.count("door", ["in", "out", "person"], 0.0, model, ("in", "out", "person"))
    reg.set_camera("single", None)
    reg.count("single", ["in", "person"], 0.0)
    uids = [json.loads(m.payload)["unique_id"] for m in renderer.everything() if m.topic.endswith("/config")]
    assert len(uids) == len(set(uids)) == 2 + 1 + 2 + 4 * 3 + 2 + 2
    assert uids == [json.loads(m.payload)["unique_id"] for m in renderer.everything() if m.topic.endswith("/config")]
