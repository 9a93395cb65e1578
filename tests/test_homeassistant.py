"""Home Assistant MQTT discovery, end to end: a real daemon, real mosquitto, the shared model and
video. The discovery payloads are checked against Home Assistant's documented keys (tables
below), and every state topic they name is read back and its value_template rendered with
Jinja2 (what HA renders templates with) on what the daemon really published."""

from __future__ import annotations

import json
import re
import signal
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from broker import Received, Subscriber
from daemon_harness import write_config
import test_daemon
from test_daemon import base_config, topic
from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import HomeAssistantConfig
from yoloedge.publish.homeassistant import OBJECTS_MIN_INTERVAL_S, Discovery, Renderer, safe_id
from yoloedge.publish.topics import Topics

# -- Home Assistant's documented discovery keys ---------------------------------------------------
# From the Home Assistant documentation (home-assistant.io):
#   /integrations/mqtt/ "MQTT Discovery": the topic is <discovery_prefix>/<component>/[<node_id>/]
#   <object_id>/config; node_id and object_id only of [a-zA-Z0-9_-]; "best practice for entities
#   with a unique_id is to set <object_id> to unique_id and omit the <node_id>"; an empty retained
#   payload on the config topic removes the entity. The `device` mapping only works with a
#   unique_id, and needs at least one of `identifiers` or `connections`.
#   /integrations/binary_sensor.mqtt/ and /integrations/sensor.mqtt/: `state_topic` is the one
#   required key; `availability` is a list whose entries require `topic` (payload_available
#   defaults to "online", payload_not_available to "offline").
REQUIRED_KEYS = {
    "binary_sensor": {"state_topic"},
    "sensor": {"state_topic"},
}
#: what this appliance needs besides: entities in HA's device registry, and availability.
REQUIRED_FOR_DEVICE_REGISTRY = {"unique_id", "device", "availability"}
DEVICE_ONE_OF = {"identifiers", "connections"}
AVAILABILITY_REQUIRED = {"topic"}
# The documented options of each platform (anything else is refused by HA's schema).
COMMON_OPTIONS = {
    "availability", "availability_mode", "availability_template", "availability_topic", "device",
    "device_class", "enabled_by_default", "encoding", "entity_category", "entity_picture",
    "expire_after", "force_update", "icon", "json_attributes_template", "json_attributes_topic",
    "name", "object_id", "default_entity_id", "payload_available", "payload_not_available", "qos",
    "state_topic", "unique_id", "value_template", "origin", "platform",
}
DOCUMENTED_OPTIONS = {
    "binary_sensor": COMMON_OPTIONS | {"off_delay", "payload_off", "payload_on"},
    "sensor": COMMON_OPTIONS | {"last_reset_value_template", "options", "state_class",
                                "suggested_display_precision", "unit_of_measurement"},
}
DEVICE_OPTIONS = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer",
                  "model", "model_id", "name", "serial_number", "suggested_area", "sw_version",
                  "via_device"}
AVAILABILITY_OPTIONS = {"payload_available", "payload_not_available", "topic", "value_template"}
ORIGIN_REQUIRED, ORIGIN_OPTIONS = {"name"}, {"name", "sw_version", "support_url"}
ENTITY_CATEGORIES = {"config", "diagnostic"}  # a sensor may not be "config", see below
STATE_CLASSES = {"measurement", "total", "total_increasing"}
BINARY_SENSOR_DEVICE_CLASSES_USED = {"running"}  # one of HA's binary sensor device classes
OBJECT_ID = re.compile(r"[a-zA-Z0-9_-]+")

# the daemon fixtures of test_daemon.py (the NOTIFY_SOCKET and a daemon killed after the test)
notify = test_daemon.notify
start_daemon = test_daemon.start_daemon

VIDEO = "indoor_people_480p_mpeg4.avi"
JINJA = ImmutableSandboxedEnvironment()


def render(template: str, payload: bytes) -> str:
    """A value_template as HA renders it: `value` is the payload text, `value_json` its JSON."""
    text = payload.decode("utf-8")
    return JINJA.from_string(template).render(value=text, value_json=json.loads(text))


def check_discovery_payload(msg: Received, prefix: str) -> dict:
    """The config against the tables above; returns it parsed. (Retained is checked with a
    subscriber that comes later: a live subscriber gets every message without the flag.)"""
    parts = msg.topic.split("/")
    assert msg.topic.startswith(prefix + "/") and parts[-1] == "config", msg.topic
    component, object_id = parts[-3], parts[-2]
    assert component in REQUIRED_KEYS, msg.topic
    config = json.loads(msg.payload)
    assert OBJECT_ID.fullmatch(object_id), object_id
    assert REQUIRED_KEYS[component] <= set(config), (msg.topic, config)
    assert REQUIRED_FOR_DEVICE_REGISTRY <= set(config), (msg.topic, config)
    assert set(config) <= DOCUMENTED_OPTIONS[component], set(config) - DOCUMENTED_OPTIONS[component]
    assert config["unique_id"] == object_id
    device = config["device"]
    assert set(device) <= DEVICE_OPTIONS and device.keys() & DEVICE_ONE_OF, device
    assert config["availability"], "availability must list at least one topic"
    for entry in config["availability"]:
        assert AVAILABILITY_REQUIRED <= set(entry) <= AVAILABILITY_OPTIONS, entry
    assert ORIGIN_REQUIRED <= set(config["origin"]) <= ORIGIN_OPTIONS
    if "entity_category" in config:
        assert config["entity_category"] in ENTITY_CATEGORIES
        assert not (component == "sensor" and config["entity_category"] == "config")
    if "state_class" in config:
        assert config["state_class"] in STATE_CLASSES
    if component == "binary_sensor" and "device_class" in config:
        assert config["device_class"] in BINARY_SENSOR_DEVICE_CLASSES_USED
    return config


def configs(sub: Subscriber, prefix: str) -> dict[str, dict]:
    """The current discovery configs by topic (the last message on each; removals drop it)."""
    out: dict[str, dict] = {}
    for msg in sub.messages():
        if msg.topic.startswith(prefix + "/"):
            if msg.payload:
                out[msg.topic] = check_discovery_payload(msg, prefix)
            else:
                out.pop(msg.topic, None)
    return out


def entity(found: dict[str, dict], component: str, name: str) -> dict:
    matches = [c for t, c in found.items() if f"/{component}/" in t and c["name"] == name]
    assert len(matches) == 1, (component, name, sorted(c["name"] for c in found.values()))
    return matches[0]


def last(sub: Subscriber, topic_name: str) -> Received:
    msgs = [m for m in sub.messages(topic_name) if m.payload]
    assert msgs, f"nothing published on {topic_name}"
    return msgs[-1]


def ha_config(tmp_path, models, broker, cameras, homeassistant=True) -> dict:
    return base_config(tmp_path, models, broker, cameras, mqtt={"homeassistant": homeassistant})


def cameras(media: Path) -> list[dict]:
    video = str(media / VIDEO)
    return [{"name": "door", "url": video, "loop": True, "fps": 4, "classes": ["person", "dog"]},
            {"name": "yard", "url": video, "loop": True, "fps": 4}]


# -- end to end -----------------------------------------------------------------------------------

def test_discovery_states_and_removal_by_reload(tmp_path, models, media, mosquitto, subscriber,
                                                subscriber_factory, notify, start_daemon):
    config = ha_config(tmp_path, models, mosquitto, cameras(media))
    daemon, path = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)

    # Per camera: streaming, fps and one sensor per listed class (door) or label seen (yard).
    def ready(_) -> bool:
        names = {c["name"] for c in configs(subscriber, "homeassistant").values()}
        return {"door streaming", "door fps", "door person", "door dog", "yard streaming",
                "yard fps", "yard person"} <= names
    assert subscriber.wait_for(ready, 30), daemon.log
    found = configs(subscriber, "homeassistant")
    assert len({c["unique_id"] for c in found.values()}) == len(found)
    devices = {json.dumps(c["device"], sort_keys=True) for c in found.values()}
    assert len(devices) == 1, "one device per appliance"
    device = found[next(iter(found))]["device"]
    assert device["manufacturer"] == "yoloedge" and device["model"] == "yolov8n_coco_int8.onnx"
    assert device["sw_version"] and "edge1" in device["identifiers"][0]
    door_labels = {c["name"] for t, c in found.items() if "__door__objects_" in t}
    assert door_labels == {"door person", "door dog"}, "classes, not what is seen, for door"

    # The retained configs are what a late subscriber (Home Assistant starting up) gets.
    late = subscriber_factory(mosquitto, ("homeassistant/#",))
    assert late.wait_for(lambda ms: len(ms) >= len(found), 10)
    assert all(m.retain for m in late.messages())

    # Availability: the retained status renders to online.
    for config_ in found.values():
        (avail,) = config_["availability"]
        assert render(avail["value_template"], last(subscriber, avail["topic"]).payload) == \
            avail["payload_available"] == "online"

    # streaming: the camera's retained state renders to payload_on.
    streaming = entity(found, "binary_sensor", "door streaming")
    assert subscriber.wait_for(lambda ms: ms and json.loads(ms[-1].payload)["state"] == "streaming",
                               20, topic=streaming["state_topic"])
    assert render(streaming["value_template"], last(subscriber, streaming["state_topic"]).payload) \
        == streaming["payload_on"]

    # fps: the stats message renders to this camera's frame rate, a number.
    fps = entity(found, "sensor", "yard fps")
    assert subscriber.wait_for(lambda ms: len(ms) >= 3, 10, topic=fps["state_topic"])
    value = render(fps["value_template"], last(subscriber, fps["state_topic"]).payload)
    assert float(value) > 0, value
    yard_stats = [c for c in json.loads(last(subscriber, fps["state_topic"]).payload)["cameras"]
                  if c["name"] == "yard"]
    assert float(value) == yard_stats[0]["fps_in"]

    # Objects in view: every counts message equals the labels of a detection message the camera
    # published just before it, and each label sensor renders its count.
    person = entity(found, "sensor", "door person")
    objects_topic = person["state_topic"]
    assert subscriber.wait_for(lambda ms: len(ms) >= 2, 20, topic=objects_topic)
    check_counts(subscriber, "door", objects_topic, {"person", "dog"})
    yard_objects = entity(found, "sensor", "yard person")["state_topic"]
    check_counts(subscriber, "yard", yard_objects, None)
    counts = json.loads(last(subscriber, objects_topic).payload)
    assert render(person["value_template"], last(subscriber, objects_topic).payload) == \
        str(counts["person"])
    assert render(entity(found, "sensor", "door dog")["value_template"],
                  last(subscriber, objects_topic).payload) == "0"

    # A reload that removes yard publishes empty retained configs for all of its entities.
    yard_topics = {t for t, c in configs(subscriber, "homeassistant").items()
                   if c["name"].startswith("yard ")}
    config["cameras"] = [c for c in config["cameras"] if c["name"] != "yard"]
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=20, count=2)
    assert subscriber.wait_for(lambda _: not yard_topics & set(configs(subscriber, "homeassistant")),
                               10), daemon.log
    # Empty and retained: the broker deletes the retained configs, a new subscriber gets none.
    fresh = subscriber_factory(mosquitto, ("homeassistant/#",))
    assert fresh.wait_for(lambda ms: len(ms) >= len(found) - len(yard_topics), 10)
    assert not {m.topic for m in fresh.messages()} & yard_topics, "removed entities are gone"

    # A clean stop: availability renders offline, streaming off, nothing left in view.
    assert daemon.stop() == 0
    (avail,) = person["availability"]
    assert render(avail["value_template"], last(subscriber, avail["topic"]).payload) == \
        avail["payload_not_available"]
    assert render(streaming["value_template"], last(subscriber, streaming["state_topic"]).payload) \
        == streaming["payload_off"]
    assert json.loads(last(subscriber, objects_topic).payload) == {"person": 0, "dog": 0}


def check_counts(sub: Subscriber, camera: str, objects_topic: str, labels: set[str] | None) -> None:
    """Each counts message = the label counts of one of the camera's last detection messages
    before it (post-processing threads may publish the next frame in between), over the labels
    the camera has sensors for (all labels seen so far, without classes)."""
    detections_topic = topic("cameras", camera, "detections")
    recent: list[Counter] = []
    seen: set[str] = set()
    checked = 0
    for msg in sub.messages():
        if msg.topic == detections_topic:
            frame = Counter(d["label"] for d in msg.json()["detections"])
            seen |= set(frame)
            recent = (recent + [frame])[-3:]
        elif msg.topic == objects_topic and msg.payload:
            counts = msg.json()
            keys = labels if labels is not None else seen
            assert set(counts) == keys, (counts, keys)
            assert any(counts == {k: frame.get(k, 0) for k in keys} for frame in recent), \
                (counts, recent)
            checked += 1
    assert checked, f"no counts for {camera}"


def test_disabled_by_default_then_turned_on_by_reload(tmp_path, models, media, mosquitto, subscriber,
                                                      notify, start_daemon):
    config = base_config(tmp_path, models, mosquitto, cameras(media)[:1])
    daemon, path = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda ms: len(ms) >= 5, 20, topic=topic("cameras", "door", "detections"))
    assert subscriber.wait_for(lambda ms: ms, 5, topic=topic("stats"))
    published = {m.topic for m in subscriber.messages()}
    assert not [t for t in published if t.startswith("homeassistant/") or t.endswith("/objects")]

    # The cameras were registered while discovery was off: a reload that turns it on (a new
    # MQTT client) announces them without restarting them.
    config["mqtt"]["homeassistant"] = True
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=20, count=2)
    assert subscriber.wait_for(lambda _: {"door streaming", "door fps", "door person", "door dog"}
                               <= {c["name"] for c in configs(subscriber, "homeassistant").values()},
                               15), daemon.log
    assert subscriber.wait_for(lambda ms: ms, 15, topic=topic("cameras", "door", "objects"))
    assert daemon.stop() == 0


def test_custom_prefix_and_republish_after_broker_restart(tmp_path, models, media, mosquitto,
                                                          subscriber, subscriber_factory, notify,
                                                          start_daemon):
    config = ha_config(tmp_path, models, mosquitto, cameras(media)[:1],
                       homeassistant={"discovery_prefix": "site1/ha"})
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda _: len(configs(subscriber, "site1/ha")) == 4, 30), daemon.log
    assert not [m for m in subscriber.messages() if m.topic.startswith("homeassistant/")]
    expected = set(configs(subscriber, "site1/ha"))

    # mosquitto without persistence forgets every retained message: the daemon publishes them
    # again when it reconnects, so a subscriber that comes after the restart still finds them.
    mosquitto.restart()
    after = subscriber_factory(mosquitto, ("site1/ha/#", topic("cameras", "door", "objects")))
    assert after.wait_for(lambda _: set(configs(after, "site1/ha")) == expected, 30), daemon.log
    assert after.wait_for(lambda ms: ms, 10, topic=topic("cameras", "door", "objects"))
    assert daemon.stop() == 0


# -- the parts, without a daemon ------------------------------------------------------------------

def test_objects_counts_are_rate_limited_and_new_labels_announced():
    reg = Discovery("edge1", "1.0", "m.onnx")
    reg.set_camera("cam", None)
    assert reg.count("cam", ["person", "person"], 100.0) == (["person"], {"person": 2})
    assert reg.count("cam", ["person"], 100.1) == ([], None)  # changed, but too soon
    assert reg.count("cam", ["person", "car"], 100.2) == (["car"], {"person": 1, "car": 1})
    assert reg.count("cam", ["car"], 100.2 + OBJECTS_MIN_INTERVAL_S) == ([], {"person": 0, "car": 1})
    assert reg.count("cam", ["car"], 200.0) == ([], None)  # unchanged: nothing to publish
    assert reg.clear_counts("cam", 200.1) == {"person": 0, "car": 0}
    assert reg.clear_counts("cam", 200.2) is None
    assert reg.count("unknown", ["person"], 1.0) == ([], None)


def test_a_frame_in_flight_after_the_camera_stopped_leaves_the_zeros_standing():
    """At shutdown the accelerator may publish frames for seconds after the camera's "stopped"
    zeros; their counts must not follow the zeros (they would stay retained on the broker)."""
    reg = Discovery("edge1", "1.0", "m.onnx")
    reg.set_camera("cam", ["person", "dog"])
    assert reg.count("cam", ["person", "person"], 100.0) == ([], {"person": 2, "dog": 0})
    assert reg.clear_counts("cam", 101.0) == {"person": 0, "dog": 0}
    assert reg.count("cam", ["person", "person"], 105.0) == ([], None)
    reg.resume_counts("cam")  # streaming again
    assert reg.count("cam", ["person"], 106.0) == ([], {"person": 1, "dog": 0})


def test_classes_change_and_removal_name_the_entities_to_delete():
    reg = Discovery("edge1", "1.0", "m.onnx")
    assert reg.set_camera("cam", ["person", "car"]) == []
    assert reg.set_camera("cam", ["person"]) == ["car"]
    assert reg.remove_camera("cam") == ["person"]
    assert reg.remove_camera("cam") is None
    renderer = Renderer(HomeAssistantConfig(), Topics("yt", "edge1"), reg)
    removals = renderer.removals("cam", ["person"], whole_camera=True)
    assert len(removals) == 3 and all(m.payload == b"" for m in removals)
    assert len(renderer.removals("cam", ["person"], whole_camera=False)) == 1


def test_ids_are_topic_safe_stable_and_distinct():
    names = ["cam 1", "cam_1", "cam__1", "_cam", "Tür", "a/b", "cam-1", "x" * 10]
    ids = [safe_id(n) for n in names]
    assert len(set(ids)) == len(ids)
    assert all(OBJECT_ID.fullmatch(i) and "__" not in i for i in ids)
    assert ids == [safe_id(n) for n in names], "stable"
    reg = Discovery("edge 1", "1.0", "m.onnx")
    reg.set_camera("a", ["fps"])
    reg.set_camera("a_objects", None)
    renderer = Renderer(HomeAssistantConfig("ha"), Topics("yt", "edge1"), reg)
    uids = [json.loads(m.payload)["unique_id"] for m in renderer.everything()]
    assert len(set(uids)) == len(uids) == 5


def test_odd_label_renders_from_the_objects_payload():
    reg = Discovery("edge1", "1.0", "m.onnx")
    label = "traffic \"light\" 'x'"
    reg.set_camera("cam", [label])
    renderer = Renderer(HomeAssistantConfig(), Topics("yt", "edge1"), reg)
    (sensor,) = [json.loads(m.payload) for m in renderer.label_configs("cam", [label])]
    _, counts = reg.count("cam", [label, label], 0.0)
    assert render(sensor["value_template"], renderer.objects("cam", counts).payload) == "2"


def test_zone_and_line_sensors_sum_their_retained_counts_and_go_with_them():
    reg = Discovery("edge1", "1.0", "m.onnx")
    reg.set_camera("gate", ["car"])
    assert reg.set_counters("gate", ["yard"], ["gate line"]) == ([], [])
    renderer = Renderer(HomeAssistantConfig(), Topics("yt", "edge1"), reg)
    configs = {json.loads(m.payload)["name"]: json.loads(m.payload) for m in renderer.configs("gate", ["car"])}
    zone, inbound, outbound = configs["gate yard objects"], configs["gate gate line in"], configs["gate gate line out"]
    assert zone["state_topic"] == "yt/edge1/cameras/gate/zones/yard"
    assert inbound["state_topic"] == outbound["state_topic"] == "yt/edge1/cameras/gate/lines/gate line"
    line = json.dumps({"v": 1, "in": {"car": 3, "truck": 1}, "out": {"car": 2}, "since": 1.0}).encode()
    assert render(inbound["value_template"], line) == "4" and render(outbound["value_template"], line) == "2"
    inside = json.dumps({"v": 1, "objects": {"person": 2, "car": 1}, "entered": {"person": 9}, "since": 1.0})
    assert render(zone["value_template"], inside.encode()) == "3"
    assert reg.set_counters("gate", [], ["gate line"]) == (["yard"], [])
    (gone,) = renderer.counter_removals("gate", ["yard"], [])
    assert gone.topic.endswith(f"/{zone['unique_id']}/config") and gone.payload == b""
    assert len({json.loads(m.payload)["unique_id"] for m in renderer.everything()}) == 5  # 2 + car + in + out


# -- configuration --------------------------------------------------------------------------------

def load_mqtt(tmp_path: Path, text: str):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"never opened by the loader")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge-01\nmodel:\n  path: {model}\nmqtt:\n"
                    + textwrap.indent(text, "  "))
    return load_config(str(path), {}).mqtt, path


@pytest.mark.parametrize("text, expected", [
    ("host: localhost\n", None),
    ("homeassistant: false\n", None),
    ("homeassistant: true\n", HomeAssistantConfig("homeassistant")),
    ("homeassistant:\n  discovery_prefix: site1/ha\n", HomeAssistantConfig("site1/ha")),
    ("homeassistant: {}\n", HomeAssistantConfig("homeassistant")),
])
def test_homeassistant_setting(tmp_path, text, expected):
    mqtt, _ = load_mqtt(tmp_path, text)
    assert mqtt.homeassistant == expected


@pytest.mark.parametrize("text, key, fragment", [
    ("homeassistant: yes please\n", "mqtt.homeassistant", "must be true, false or a mapping"),
    ("homeassistant:\n  discovery_prefix: ha/#\n", "mqtt.homeassistant.discovery_prefix", "'#'"),
    ("homeassistant:\n  prefix: ha\n", "mqtt.homeassistant.prefix", "unknown key"),
])
def test_bad_homeassistant_setting_names_file_line_and_key(tmp_path, text, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_mqtt(tmp_path, text)
    issue = info.value.issues[0]
    assert issue.key_path == key and issue.line in (5, 6) and fragment in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "yoloedge.yaml"))


def test_the_streaming_sensor_reads_the_camera_state_the_sinks_publish():
    """publish knows no camera states: its streaming value must be the enum's, as published."""
    from yoloedge.publish.homeassistant import STREAMING_STATE
    from yoloedge.sources.state import CameraState
    assert STREAMING_STATE == str(CameraState.STREAMING)
