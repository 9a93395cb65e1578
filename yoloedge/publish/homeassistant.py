"""Home Assistant MQTT discovery: the retained `config` messages that make the appliance, its
cameras and what they see appear in Home Assistant without any YAML there.

Why it looks like this:

* One HA device per appliance (identifiers from `device_id`), and per camera a `binary_sensor`
  (streaming), a `sensor` of the camera's frame rate and one `sensor` per label of objects in
  view: the labels the camera's `classes` lists, or, without `classes`, each label the first
  time the camera publishes it (a model has 80 labels; 80 empty sensors per camera help nobody).
* Per zone a `sensor` of the tracked objects inside it now, and per line and direction a
  `sensor` of the crossings (all labels summed; the payload has them per label as attributes):
  they read the retained counts topics `cameras/<camera>/zones/<zone>` and `.../lines/<line>`.
* Every entity reads a topic the daemon already keeps up to date, so discovery adds one topic
  only: the retained `cameras/<camera>/objects` ({label: count}), published when the counts
  change, at most once per OBJECTS_MIN_INTERVAL_S per camera (a change held back goes out with
  the first frame after that; a camera that stops streaming publishes zeros at once).
  streaming reads the retained camera `state`; the frame rate reads the periodic `stats`.
* A camera fed to several models (`Discovery.set_models`, from the frames' `runtime.models`) has
  its label sensors per model instead: one per model and label (`<camera> <model> <label>`, the
  unique id `...__<camera>__<model>__objects_<label>`), the labels its `classes` lists that the
  model has, or without `classes` each the first time the model publishes it; its `objects`
  payload is then `{model: {label: count}}`, each model's from its latest frame. A camera with one
  model keeps the entities and payload above; a camera that goes from one to several (a reload)
  has the sensors of the old layout removed.
* Availability is the retained `status` topic; its Last Will says offline, a clean stop says
  stopped: the template maps everything but online to offline, which HA understands.
* Discovery topics follow HA's advice for entities with a unique_id: the object id is the
  unique_id and there is no node id. Ids are built from names squeezed into [A-Za-z0-9_-];
  a name that had to be squeezed gets a short hash of itself, so "cam 1" and "cam_1" stay apart,
  and "__" separates the parts (`safe_id` never makes one), so no two entities share an id.
* The registry (`Discovery`) outlives MQTT clients: a reload that changes the MQTT settings
  replaces the client, and the new one must still know every camera and label seen. The client
  republishes every config on each (re)connect (the broker may have lost its retained messages)
  and an empty retained config for each entity of a camera that a reload removed.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Sequence, Union

from ..config.schema import HomeAssistantConfig
from .topics import Topics

#: QoS of the discovery configs: retained and few, they must arrive once a connection stands.
DISCOVERY_QOS = 1
#: the objects-in-view counts of one camera go out at most this often (seconds).
OBJECTS_MIN_INTERVAL_S = 1.0
MANUFACTURER = "yoloedge"
#: the `state` a streaming camera's retained state message carries (the value of the camera-state
#: enum on the sink side; publish knows no camera states: a test checks the two agree).
STREAMING_STATE = "streaming"
#: what the entities' availability template renders for anything but "online".
_AVAILABLE, _NOT_AVAILABLE = "online", "offline"
_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")

#: what a label sensor counts: a label (a camera with one model), or (model, label)
LabelKey = Union[str, tuple[str, str]]


class Component(str, Enum):
    """The HA entity platforms used (the second level of a discovery topic)."""

    BINARY_SENSOR = "binary_sensor"
    SENSOR = "sensor"

    def __str__(self) -> str:
        return self.value


def safe_id(text: str) -> str:
    """`text` as part of an HA object id: [A-Za-z0-9_-] without "__" (the separator of the
    parts) or a leading or trailing "_"; a name that had to change gets a hash of itself."""
    slug = _UNSAFE.sub("_", text).strip("_")
    if slug == text:
        return slug
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return f"{slug}_{digest}" if slug else digest


def _jinja_string(text: str) -> str:
    """A Jinja string literal for `text` (JSON's escapes are a subset of Jinja's)."""
    return json.dumps(text, ensure_ascii=True)


@dataclass
class _Camera:
    classes: tuple[str, ...] | None
    seen: list[str] = field(default_factory=list)  # without classes: labels in first-seen order
    published: dict | None = None  # the counts last handed to the client
    published_at: float | None = None
    #: not streaming (stopped, stalled, ...): the counts stay at zero until it streams again, or
    #: a frame still in flight when the camera stopped (a slow accelerator draining at shutdown)
    #: would publish its counts after the zeros and leave them standing.
    idle: bool = False
    zones: tuple[str, ...] = ()  # its zones and lines (sensors of their counts)
    lines: tuple[str, ...] = ()
    #: the models its frames go to, when several (per-model sensors); () or one: one set
    models: tuple[str, ...] = ()
    per_model: dict[str, list[str]] = field(default_factory=dict)  # labels with a sensor, per model
    latest: dict[str, dict[str, int]] = field(default_factory=dict)  # per model: its last frame's

    @property
    def labels(self) -> list[LabelKey]:
        if len(self.models) > 1:
            return [(model, label) for model in self.models for label in self.per_model.get(model, ())]
        return list(self.classes) if self.classes is not None else list(self.seen)

    def zeros(self) -> dict:
        """The counts with nothing in view (per model when several)."""
        if len(self.models) > 1:
            return {model: dict.fromkeys(self.per_model.get(model, ()), 0) for model in self.models}
        return dict.fromkeys(self.labels, 0)


@dataclass(frozen=True)
class Message:
    """One retained message to publish: a config (JSON), an empty removal, or counts."""

    topic: str
    payload: bytes


class Discovery:
    """The cameras and labels the appliance announces, and the last objects-in-view counts.

    Thread-safe: post-processing threads count objects while the MQTT thread renders configs on
    a reconnect. `_lock` is a leaf lock (nothing is called while holding it).
    """

    def __init__(self, device_id: str, version: str, model: str):
        self.device_id = device_id
        self.version = version
        self.model = model
        self._lock = threading.Lock()
        self._cameras: dict[str, _Camera] = {}

    # ------------------------------------------------------------------ registry

    def set_camera(self, camera: str, classes: Sequence[str] | None) -> list[LabelKey]:
        """Register (or re-register, new settings) `camera`; returns the labels it no longer has."""
        wanted = tuple(classes) if classes is not None else None
        with self._lock:
            old = self._cameras.get(camera)
            if old is not None and old.classes == wanted:
                return []
            before = old.labels if old is not None else []
            self._cameras[camera] = new = _Camera(wanted)
            if old is not None:
                new.zones, new.lines, new.models = old.zones, old.lines, old.models
                new.per_model = {m: [label for label in labels if wanted is None or label in wanted]
                                 for m, labels in old.per_model.items()}
            return [label for label in before if label not in new.labels]

    def set_models(self, camera: str, models: Sequence[str]) -> tuple[bool, list[LabelKey]]:
        """The models `camera`'s frames go to (checked on every frame: cheap when unchanged):
        (whether its sensors changed, the label sensors it no longer has). Several models give
        per-model sensors, announced as each model's labels come (see `count`)."""
        wanted = tuple(models) if len(models) > 1 else ()
        with self._lock:
            cam = self._cameras.get(camera)
            if cam is None or cam.models == wanted:
                return False, []
            before = cam.labels
            cam.models = wanted
            cam.per_model = {m: labels for m, labels in cam.per_model.items() if m in wanted}
            cam.latest = {m: counts for m, counts in cam.latest.items() if m in wanted}
            cam.published = cam.published_at = None
            after = cam.labels
            return True, [label for label in before if label not in after]

    def set_counters(self, camera: str, zones: Sequence[str], lines: Sequence[str]
                     ) -> tuple[list[str], list[str]]:
        """The camera's zones and lines now; returns those it no longer has (their sensors go)."""
        with self._lock:
            cam = self._cameras.get(camera)
            if cam is None:
                return [], []
            gone = ([z for z in cam.zones if z not in zones], [line for line in cam.lines if line not in lines])
            cam.zones, cam.lines = tuple(zones), tuple(lines)
            return gone

    def counters(self, camera: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        with self._lock:
            cam = self._cameras.get(camera)
            return ((), ()) if cam is None else (cam.zones, cam.lines)

    def remove_camera(self, camera: str) -> list[LabelKey] | None:
        """Forget `camera`; returns its labels, or None when it was not registered."""
        with self._lock:
            gone = self._cameras.pop(camera, None)
        return None if gone is None else gone.labels

    def labels(self, camera: str) -> list[LabelKey] | None:
        with self._lock:
            cam = self._cameras.get(camera)
            return None if cam is None else cam.labels

    def cameras(self) -> list[str]:
        with self._lock:
            return list(self._cameras)

    # ------------------------------------------------------------------ objects in view

    def count(self, camera: str, labels_in_frame: Iterable[str], now: float, model: str = "",
              model_labels: Sequence[str] = ()) -> tuple[list[LabelKey], dict | None]:
        """One frame's labels -> (labels seen for the first time, counts to publish or None).

        Counts cover every label the camera has a sensor for (zero included), so each sensor's
        template finds its key. They are due when they differ from the last published ones and
        OBJECTS_MIN_INTERVAL_S has passed since then. A camera of several models (`set_models`)
        counts `model`'s frame (`model_labels`: the model's labels, which its `classes` are
        taken from) into that model's part, the others' standing as last counted.
        """
        with self._lock:
            cam = self._cameras.get(camera)
            if cam is None:
                return [], None
            frame = list(labels_in_frame)
            if len(cam.models) > 1:
                if model not in cam.models:
                    return [], None
                new, counts = self._count_model(cam, model, frame, model_labels)
            else:
                new, counts = self._count_camera(cam, frame)
            if cam.idle or counts == cam.published or (
                    cam.published_at is not None and not new
                    and now - cam.published_at < OBJECTS_MIN_INTERVAL_S):
                return new, None
            cam.published, cam.published_at = counts, now
            return new, counts

    @staticmethod
    def _count_camera(cam: _Camera, frame: list[str]) -> tuple[list[LabelKey], dict]:
        new: list[LabelKey] = []
        if cam.classes is None:
            for label in frame:
                if label not in cam.seen and label not in new:
                    new.append(label)
            cam.seen.extend(label for label in new if isinstance(label, str))
        counts = dict.fromkeys(cam.labels, 0)
        for label in frame:
            if label in counts:
                counts[label] += 1
        return new, counts

    @staticmethod
    def _count_model(cam: _Camera, model: str, frame: list[str], model_labels: Sequence[str]
                     ) -> tuple[list[LabelKey], dict]:
        known = cam.per_model.setdefault(model, [])
        if cam.classes is not None:
            candidates = [label for label in cam.classes if label in model_labels]
        else:
            candidates = frame
        fresh = [label for label in dict.fromkeys(candidates) if label not in known]
        known.extend(fresh)
        mine = dict.fromkeys(known, 0)
        for label in frame:
            if label in mine:
                mine[label] += 1
        cam.latest[model] = mine
        counts = {m: dict(cam.latest.get(m) or dict.fromkeys(cam.per_model.get(m, ()), 0)) for m in cam.models}
        return [(model, label) for label in fresh], counts

    def clear_counts(self, camera: str, now: float) -> dict | None:
        """All zeros, when the camera stopped streaming and the last counts were not zeros; no
        counts are due from then on until `resume_counts`."""
        with self._lock:
            cam = self._cameras.get(camera)
            if cam is None:
                return None
            cam.idle = True
            zeros = cam.zeros()
            cam.latest = {}
            if cam.published is None or cam.published == zeros:
                return None
            cam.published, cam.published_at = zeros, now
            return zeros

    def resume_counts(self, camera: str) -> None:
        """The camera streams again: its frames' counts are due again."""
        with self._lock:
            cam = self._cameras.get(camera)
            if cam is not None:
                cam.idle = False

    def last_counts(self, camera: str) -> dict | None:
        with self._lock:
            cam = self._cameras.get(camera)
            return None if cam is None or cam.published is None else json.loads(json.dumps(cam.published))


class Renderer:
    """Builds the discovery messages for one MQTT client's settings (prefix, topics)."""

    def __init__(self, config: HomeAssistantConfig, topics: Topics, discovery: Discovery):
        self.config = config
        self.topics = topics
        self.discovery = discovery
        self._node = safe_id(topics.device_id)

    def device(self) -> dict:
        d = self.discovery
        return {"identifiers": [f"yoloedge__{self._node}"], "name": f"yoloedge {d.device_id}",
                "manufacturer": MANUFACTURER, "model": d.model, "sw_version": d.version}

    def availability(self) -> list[dict]:
        return [{"topic": self.topics.status,
                 "value_template": f"{{{{ '{_AVAILABLE}' if value_json.state == '{_AVAILABLE}' "
                                   f"else '{_NOT_AVAILABLE}' }}}}",
                 "payload_available": _AVAILABLE, "payload_not_available": _NOT_AVAILABLE}]

    def unique_id(self, camera: str, entity: str) -> str:
        return f"yoloedge__{self._node}__{safe_id(camera)}__{entity}"

    def config_topic(self, component: Component, unique_id: str) -> str:
        return f"{self.config.discovery_prefix}/{component}/{unique_id}/config"

    def entities(self, camera: str, labels: Sequence[LabelKey], with_camera: bool = True,
                 counters: tuple[Sequence[str], Sequence[str]] | None = None) -> list[tuple[Component, str, dict]]:
        """(component, unique_id, config) of `camera`'s label sensors for `labels`, and of its
        other entities when `with_camera` (its zones' and lines' sensors: `counters`, default the
        registry's)."""
        cam = _jinja_string(camera)
        streaming = STREAMING_STATE
        out: list[tuple[Component, str, dict]] = [
            (Component.BINARY_SENSOR, self.unique_id(camera, "streaming"), {
                "name": f"{camera} streaming", "device_class": "running",
                "state_topic": self.topics.camera_state(camera),
                "value_template": f"{{{{ 'ON' if value_json.state == '{streaming}' else 'OFF' }}}}",
                "payload_on": "ON", "payload_off": "OFF"}),
            (Component.SENSOR, self.unique_id(camera, "fps"), {
                "name": f"{camera} fps", "unit_of_measurement": "fps",
                "state_class": "measurement", "entity_category": "diagnostic",
                "state_topic": self.topics.stats,
                "value_template": f"{{{{ value_json.cameras | selectattr('name', 'eq', {cam}) "
                                  f"| map(attribute='fps_in') | first | default(none) }}}}"}),
        ] if with_camera else []
        if with_camera:
            zones, lines = counters if counters is not None else self.discovery.counters(camera)
            out.extend(self.counter_entities(camera, zones, lines))
        for key in labels:
            if isinstance(key, tuple):
                out.append(self._model_label_entity(camera, *key))
                continue
            label = key
            out.append((Component.SENSOR, self.unique_id(camera, f"objects_{safe_id(label)}"), {
                "name": f"{camera} {label}", "unit_of_measurement": "objects",
                "state_class": "measurement", "icon": "mdi:eye",
                "state_topic": self.topics.camera_objects(camera),
                "value_template": f"{{{{ value_json[{_jinja_string(label)}] | default(0) }}}}"}))
        return out

    def _model_label_entity(self, camera: str, model: str, label: str) -> tuple[Component, str, dict]:
        """A camera of several models: the sensor of `label` as `model` sees it."""
        part = f"(value_json[{_jinja_string(model)}] | default({{}}))"
        return (Component.SENSOR, self.unique_id(camera, f"{safe_id(model)}__objects_{safe_id(label)}"), {
            "name": f"{camera} {model} {label}", "unit_of_measurement": "objects",
            "state_class": "measurement", "icon": "mdi:eye",
            "state_topic": self.topics.camera_objects(camera),
            "value_template": f"{{{{ {part}[{_jinja_string(label)}] | default(0) }}}}"})

    def counter_entities(self, camera: str, zones: Sequence[str], lines: Sequence[str]
                         ) -> list[tuple[Component, str, dict]]:
        """A sensor per zone (objects inside now) and per line and direction (crossings)."""
        out: list[tuple[Component, str, dict]] = []
        for zone in zones:
            out.append((Component.SENSOR, self.unique_id(camera, f"zone_{safe_id(zone)}"), {
                "name": f"{camera} {zone} objects", "unit_of_measurement": "objects",
                "state_class": "measurement", "icon": "mdi:vector-polygon",
                "state_topic": self.topics.counts(camera, "zone", zone),
                "value_template": "{{ value_json.objects.values() | sum }}",
                "json_attributes_topic": self.topics.counts(camera, "zone", zone)}))
        for line in lines:
            for direction in ("in", "out"):
                out.append((Component.SENSOR, self.unique_id(camera, f"line_{safe_id(line)}__{direction}"), {
                    "name": f"{camera} {line} {direction}", "unit_of_measurement": "objects",
                    "state_class": "total", "icon": "mdi:transit-transfer",
                    "state_topic": self.topics.counts(camera, "line", line),
                    "value_template": f"{{{{ value_json['{direction}'].values() | sum }}}}",
                    "json_attributes_topic": self.topics.counts(camera, "line", line),
                    "json_attributes_template": f"{{{{ value_json['{direction}'] | tojson }}}}"}))
        return out

    def counter_removals(self, camera: str, zones: Sequence[str], lines: Sequence[str]) -> list[Message]:
        return [Message(self.config_topic(component, uid), b"")
                for component, uid, _ in self.counter_entities(camera, zones, lines)]

    def configs(self, camera: str, labels: Sequence[LabelKey], with_camera: bool = True) -> list[Message]:
        """The retained discovery configs of `camera`'s entities (see `entities`)."""
        common = {"device": self.device(), "availability": self.availability(),
                  "origin": {"name": MANUFACTURER, "sw_version": self.discovery.version}}
        return [Message(self.config_topic(component, uid),
                        _encode({**entity, "unique_id": uid, **common}))
                for component, uid, entity in self.entities(camera, labels, with_camera)]

    def label_configs(self, camera: str, labels: Sequence[LabelKey]) -> list[Message]:
        """The configs of the label sensors for `labels` only (labels seen for the first time)."""
        return self.configs(camera, labels, with_camera=False)

    def removals(self, camera: str, labels: Sequence[LabelKey], whole_camera: bool,
                 counters: tuple[Sequence[str], Sequence[str]] = ((), ())) -> list[Message]:
        """Empty retained configs: the label sensors of `labels`, and all of the camera's
        entities when `whole_camera` (its zones and lines: `counters`, the registry has let go)."""
        return [Message(self.config_topic(component, uid), b"")
                for component, uid, _ in self.entities(camera, labels, whole_camera, counters)]

    def objects(self, camera: str, counts: dict) -> Message:
        return Message(self.topics.camera_objects(camera), _encode(counts))

    def everything(self) -> list[Message]:
        """Every config and the last counts: what a (re)connect publishes."""
        out: list[Message] = []
        for camera in self.discovery.cameras():
            labels = self.discovery.labels(camera)
            if labels is None:
                continue  # removed meanwhile
            out.extend(self.configs(camera, labels))
            counts = self.discovery.last_counts(camera)
            if counts is not None:
                out.append(self.objects(camera, counts))
        return out


def _encode(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
