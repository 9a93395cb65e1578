"""The daemon's typed configuration. Built once by `config.loader` and passed down; immutable.

Defaults here are the documented defaults; what each key means, and its type and bounds, is its
`fields.Key` in the section's table (docs/configuration.md is generated from both, and
`etc/yoloedge/yoloedge.yaml` lists every key).

Coordinates of zones and lines are fractions of the frame's width and height (x right, y down), so
a zone drawn on a snapshot survives a change of the camera's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from .catalogue import BACKEND_NAMES
from .model import ModelConfig, OnnxRuntimeConfig

#: the built-in backends (`config.catalogue` describes each).
BACKENDS = BACKEND_NAMES

Point = tuple[float, float]


class Anchor(str, Enum):
    """The point of a box that is in a zone or crosses a line: where an object stands on the
    ground (the bottom centre) unless the zone or line asks for the box's centre."""

    BOTTOM_CENTER = "bottom_center"
    CENTER = "center"


class PublishMode(str, Enum):
    """What a camera publishes on MQTT: per-frame detections, events (and counts), or both."""

    EVENTS = "events"
    DETECTIONS = "detections"
    BOTH = "both"

    @property
    def detections(self) -> bool:
        return self is not PublishMode.EVENTS

    @property
    def events(self) -> bool:
        return self is not PublishMode.DETECTIONS


#: zone `inertia` when the config gives none: frames inside (and outside) before a track enters
#: (leaves) the zone.
DEFAULT_INERTIA = 3


@dataclass(frozen=True)
class ZoneConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.zones.ZONE_FIELDS`."""

    name: str
    polygon: tuple[Point, ...]
    objects: tuple[str, ...] | None = None
    inertia: int = DEFAULT_INERTIA
    anchor: Anchor = Anchor.BOTTOM_CENTER


@dataclass(frozen=True)
class LineConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.zones.LINE_FIELDS`."""

    name: str
    points: tuple[Point, Point]  # A, B
    objects: tuple[str, ...] | None = None
    anchor: Anchor = Anchor.BOTTOM_CENTER


@dataclass(frozen=True)
class TrackingConfig:
    """One camera's tracking (`tracking:` at the top level, overridden key by key per camera).

    Each field is a key: its meaning, type and bounds are its Key in
    `config.tracking.TRACKING_FIELDS`.
    """

    enabled: bool = True
    min_hits: int = 3
    lost_s: float = 2.0
    high_score: float = 0.25
    low_score: float = 0.1
    match_thresh: float = 0.8



def default_name(backend: str, index: int) -> str:
    """`onnxruntime0`, `ascend1`, or the lower-cased class name for a plugin (`fpgabackend2`).
    The one rule: the daemon names an accelerator a `Config` built in code left unnamed with it
    too, so status and camera references agree."""
    return f"{backend.split(':')[-1].lower()}{index}"


@dataclass(frozen=True)
class AcceleratorConfig:
    """One group of identical devices running its models; one worker thread per device.

    The fields are keys (their meaning, type and bounds: `config.accelerators.COMMON_FIELDS` and
    `BACKEND_FIELDS`), except the two that hold a backend's own settings: `onnxruntime` (the ONNX
    Runtime keys, `config.ort`) and `options` (another backend's section, e.g. `ascend:`, or a
    custom backend's `options:`).
    """

    backend: str = "onnxruntime"
    devices: tuple[int, ...] = (0,)
    batch: int = 1
    batch_timeout_ms: float = 10.0
    inference_timeout_s: float = 10.0
    max_consecutive_errors: int = 5
    input_buffers: int = 2
    preprocess_threads: int = 0
    post_threads: int = 0
    onnxruntime: OnnxRuntimeConfig = field(default_factory=OnnxRuntimeConfig)
    options: Mapping[str, object] = field(default_factory=dict)
    name: str = ""  # the loader names an unnamed one "<backend><index>"
    #: names of the models this group loads; None: every model (`Config.group_models`)
    models: tuple[str, ...] | None = None


@dataclass(frozen=True)
class CameraConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.cameras.CAMERA_FIELDS`."""

    name: str
    url: str  # "" for a `pipeline:` camera
    enabled: bool = True
    fps: float | None = None
    realtime: bool | None = None
    loop: bool = False
    classes: tuple[str, ...] | None = None
    min_score: float | None = None
    open_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    decode_threads: int = 1
    decoder: str = "opencv"
    pipeline: str | None = None
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    max_retries: int = 0
    queue_size: int = 2
    jpeg_decoder: str = "auto"
    publish_empty: bool = True
    accelerator: str | None = None
    zones: tuple[ZoneConfig, ...] = ()
    lines: tuple[LineConfig, ...] = ()
    publish: PublishMode = PublishMode.BOTH
    event_snapshots_mb: float = 16.0
    #: the top-level `tracking:` with this camera's own `tracking:` keys over it (config.tracking)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: names of the models this camera's frames go to; None: every model its group loads
    #: (`Config.camera_models`)
    models: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TlsConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.TLS_FIELDS`."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class HomeAssistantConfig:
    """Home Assistant MQTT discovery (publish/homeassistant.py); off unless configured.

    Each field is a key: its meaning, type and bounds are its Key in
    `config.loader.HOMEASSISTANT_FIELDS`.
    """

    discovery_prefix: str = "homeassistant"


@dataclass(frozen=True)
class MqttConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.MQTT_FIELDS`."""

    host: str = "localhost"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr or a log line
    tls: TlsConfig | None = None
    topic_prefix: str = "yoloedge"
    qos: int = 1
    client_id: str | None = None
    keepalive_s: int = 30
    queue_limit: int = 10000
    queue_limit_bytes: int = 64 * 1024 * 1024
    spool_dir: str | None = None
    spool_limit_bytes: int = 256 * 1024 * 1024
    stats_interval_s: float = 10.0
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    drain_rate: float = 100.0
    homeassistant: HomeAssistantConfig | None = None


@dataclass(frozen=True)
class HealthConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.HEALTH_FIELDS`."""

    stall_timeout_s: float = 10.0
    watchdog: bool = True
    status_interval_s: float = 5.0


@dataclass(frozen=True)
class ControlConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.CONTROL_FIELDS`."""

    socket: str = "/run/yoloedge/control.sock"
    mode: int = 0o660


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP endpoint (`/metrics`, `/api/status`); see `web.server`.

    Each field is a key: its meaning, type and bounds are its Key in `config.http.HTTP_FIELDS`.
    """

    listen: tuple[str, int] | None = ("127.0.0.1", 8480)
    allow_remote: bool = False
    allowed_hosts: tuple[str, ...] = ()
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr or a log line


@dataclass(frozen=True)
class LoggingConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.LOGGING_FIELDS`."""

    level: str = "info"
    target: str = "auto"


@dataclass(frozen=True)
class Config:
    """Each field is a key: its meaning, type and bounds are its Key in `config.loader.TOP_FIELDS`."""

    device_id: str
    #: the first (or only) model: what single-model tools (detect, verify, bench) use
    model: ModelConfig
    accelerators: tuple[AcceleratorConfig, ...]
    cameras: tuple[CameraConfig, ...] = ()
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    #: tracking defaults for every camera (each CameraConfig.tracking has them merged in)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    shutdown_timeout_s: float = 10.0
    #: the file this was loaded from (for status and reload)
    source: str = ""
    #: every model, in the order written (`models:`; a single `model:` is the one)
    models: tuple[ModelConfig, ...] = ()

    def __post_init__(self) -> None:
        if not self.models:
            object.__setattr__(self, "models", (self.model,))

    def group_models(self, accelerator: str) -> tuple[ModelConfig, ...]:
        """The models the accelerator group `accelerator` loads, in `models:` order. An unnamed
        group (a Config built in code) answers to its `default_name`. KeyError: no such group, or
        the group names a model that is not in `models` (the loader refuses both)."""
        group = self._group(accelerator)
        if group.models is None:
            return self.models
        missing = [name for name in group.models if name not in {model.name for model in self.models}]
        if missing:
            raise KeyError(f"accelerator {accelerator!r} names models that are not configured: {', '.join(missing)}")
        return tuple(model for model in self.models if model.name in group.models)

    def camera_models(self, camera: CameraConfig) -> tuple[ModelConfig, ...]:
        """The models `camera`'s frames go to, in `models:` order (a subset of its group's); none
        for a camera of a Config without accelerators (one built in code: nothing runs it).
        KeyError: its group is unknown, or it names a model its group does not load."""
        if camera.accelerator is None and not self.accelerators:
            return ()
        group = camera.accelerator or self.group_names()[0]
        loaded = self.group_models(group)
        if camera.models is None:
            return loaded
        missing = [name for name in camera.models if name not in {model.name for model in loaded}]
        if missing:
            raise KeyError(f"camera {camera.name!r} names models accelerator {group!r} does not load: "
                           f"{', '.join(missing)}")
        return tuple(model for model in loaded if model.name in camera.models)

    def group_names(self) -> list[str]:
        """Each accelerator's name; the loader names every one, a Config built in code may leave
        it empty (then it is its `default_name`)."""
        return [a.name or default_name(a.backend, i) for i, a in enumerate(self.accelerators)]

    def _group(self, name: str) -> AcceleratorConfig:
        for group, accelerator in zip(self.group_names(), self.accelerators):
            if group == name:
                return accelerator
        raise KeyError(f"no accelerator named {name!r}")
