"""The daemon's typed configuration. Built once by `config.loader` and passed down; immutable.

Defaults here are the documented defaults; `etc/yoloedge/yoloedge.yaml` explains every key.

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
    name: str
    polygon: tuple[Point, ...]
    objects: tuple[str, ...] | None = None  # labels that count; None: every label
    inertia: int = DEFAULT_INERTIA
    anchor: Anchor = Anchor.BOTTOM_CENTER


@dataclass(frozen=True)
class LineConfig:
    name: str
    points: tuple[Point, Point]  # A, B
    objects: tuple[str, ...] | None = None
    anchor: Anchor = Anchor.BOTTOM_CENTER


@dataclass(frozen=True)
class TrackingConfig:
    """One camera's tracking (`tracking:` at the top level, overridden key by key per camera)."""

    enabled: bool = True
    min_hits: int = 3        # detections (in a row) before a track is confirmed
    lost_s: float = 2.0      # a confirmed track not matched for this long (frame time) ends
    #: detections at least this confident are matched first, and may start tracks (ByteTrack's
    #: track_thresh; 0.25 as in supervision and Ultralytics, see the README for why not 0.5).
    high_score: float = 0.25
    #: the lowest score used: detections from here up to `high_score` only keep existing tracks
    #: alive (ByteTrack's second association; 0.1 upstream).
    low_score: float = 0.1
    #: first association: a high-score detection matches a track at cost 1 - IoU x score at most
    #: this (ByteTrack's match_thresh, 0.8 upstream).
    match_thresh: float = 0.8



@dataclass(frozen=True)
class AcceleratorConfig:
    """One group of identical devices running the model; one worker thread per device."""

    backend: str = "onnxruntime"  # onnxruntime | ascend | tensorrt | simulated | "package.module:Class"
    devices: tuple[int, ...] = (0,)
    batch: int = 1  # most frames per inference (a dynamic-batch model may run fewer)
    batch_timeout_ms: float = 10.0  # how long a partial batch waits for more frames
    #: an inference running longer than this is abandoned and its device reopened (with backoff).
    inference_timeout_s: float = 10.0
    #: consecutive failed inferences after which the device is released and reopened (with backoff).
    max_consecutive_errors: int = 5
    #: input buffers per device: one executes while the next is filled (2: double buffering).
    input_buffers: int = 2
    #: threads that letterbox frames into the input buffers; 0: one per CPU core, at most 4.
    preprocess_threads: int = 0
    #: most post-processing (decode + NMS + publish) threads; the stage starts with one and adds
    #: more while results queue up. 0: one per CPU core, at most 4.
    post_threads: int = 0
    onnxruntime: OnnxRuntimeConfig = field(default_factory=OnnxRuntimeConfig)
    #: backend-specific settings for other backends (e.g. the `ascend:` section).
    options: Mapping[str, object] = field(default_factory=dict)
    name: str = ""  # for status and logs; defaults to "<backend><index>"


@dataclass(frozen=True)
class CameraConfig:
    name: str
    url: str  # rtsp(s)://, http(s)://, file path or file://, /dev/videoN, image folder, synthetic://
    enabled: bool = True
    #: frames per second to process; None: every frame the source delivers.
    fps: float | None = None
    #: False (files only): process every frame, lossless, as fast as the accelerator allows.
    #: None: True for live sources, and for files pace playback at the file's frame rate.
    realtime: bool | None = None
    loop: bool = False  # files and folders: start again at the end
    classes: tuple[str, ...] | None = None  # publish only these labels
    min_score: float | None = None  # publish only detections at least this confident
    open_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    #: FFmpeg decoder threads for files and network streams; 0: OpenCV's default (one per CPU core,
    #: at most 16). One per camera: many cameras already use every core, and each decoder thread
    #: adds a thread and its own decoded pictures (memory) per camera.
    decode_threads: int = 1
    #: who decodes the video: opencv | gstreamer | jetson | vaapi | nvidia | auto (see
    #: sources.gstlaunch); a `pipeline:` camera is always gstreamer.
    decoder: str = "opencv"
    #: a GStreamer launch string ending in an appsink, given instead of `url` (then url is "").
    pipeline: str | None = None
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    #: consecutive failed connection attempts after which the camera is marked failed; 0: never.
    max_retries: int = 0
    queue_size: int = 2  # frames buffered between reader and accelerator (live: keep latest)
    #: who decodes the JPEGs of an image folder or HTTP MJPEG camera: auto | nvimgcodec | nvjpeg |
    #: cpu (see sources.jpeg); auto: a GPU decoder where one is installed, else OpenCV.
    jpeg_decoder: str = "auto"
    publish_empty: bool = True  # publish frames with no detections
    accelerator: str | None = None  # accelerator name; None: the first
    zones: tuple[ZoneConfig, ...] = ()  # polygons in fractions of the frame (events.zones)
    lines: tuple[LineConfig, ...] = ()  # counting lines A-B in fractions of the frame (events.lines)
    publish: PublishMode = PublishMode.BOTH  # per-frame detections, events (and counts), or both
    #: MiB of event best shots (JPEGs) kept for the camera; the oldest events' go first. 0: none.
    event_snapshots_mb: float = 16.0
    #: the top-level `tracking:` with this camera's own `tracking:` keys over it (config.tracking)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


@dataclass(frozen=True)
class TlsConfig:
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False  # skip hostname verification (testing only)


@dataclass(frozen=True)
class HomeAssistantConfig:
    """Home Assistant MQTT discovery (publish/homeassistant.py); off unless configured."""

    discovery_prefix: str = "homeassistant"  # HA's own default


@dataclass(frozen=True)
class MqttConfig:
    host: str = "localhost"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr or a log line
    tls: TlsConfig | None = None
    topic_prefix: str = "yoloedge"
    qos: int = 1
    client_id: str | None = None  # default: yoloedge-<device_id>
    keepalive_s: int = 30
    #: messages held while the broker is unreachable; beyond this they are dropped and counted.
    queue_limit: int = 10000
    #: the same bound in payload bytes (large messages reach it first).
    queue_limit_bytes: int = 64 * 1024 * 1024
    #: a directory for the durable outbox (publish/spool.py): messages survive a restart during
    #: an outage. None: messages wait in memory only.
    spool_dir: str | None = None
    #: most bytes of spool files; past it the oldest messages are deleted and counted as dropped.
    spool_limit_bytes: int = 256 * 1024 * 1024
    stats_interval_s: float = 10.0
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    #: messages a second at most for the backlog after a reconnect (an outage's queue, the spool of
    #: the previous run), with at most one second's worth at once; new messages and retained state
    #: are not held back. 0: as fast as the broker takes them. See publish/pacing.py.
    drain_rate: float = 100.0
    #: Home Assistant discovery; None (the default): no discovery messages.
    homeassistant: HomeAssistantConfig | None = None


@dataclass(frozen=True)
class HealthConfig:
    #: a camera with no good frame for this long is stalled and reconnected.
    stall_timeout_s: float = 10.0
    #: send WATCHDOG=1 to systemd (when WatchdogSec= is set) while at least one device makes progress.
    watchdog: bool = True
    status_interval_s: float = 5.0


@dataclass(frozen=True)
class ControlConfig:
    socket: str = "/run/yoloedge/control.sock"
    mode: int = 0o660


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP endpoint (`/metrics`, `/api/status`); see `web.server`."""

    #: (host, port) to listen on; None: no HTTP endpoint. Loopback unless `allow_remote`.
    listen: tuple[str, int] | None = ("127.0.0.1", 8480)
    allow_remote: bool = False  # a non-loopback `listen` must be asked for by name
    #: Host names (or addresses) answered besides loopback ones and the listen address; empty:
    #: none, or any under `allow_remote` (see `web.access`)
    allowed_hosts: tuple[str, ...] = ()
    username: str | None = None  # basic auth (remote listeners only); both or neither
    password: str | None = field(default=None, repr=False)  # never in a repr or a log line


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"  # debug | info | warning | error
    #: auto: journald when started by systemd (JOURNAL_STREAM), else stderr.
    target: str = "auto"  # auto | journald | stderr


@dataclass(frozen=True)
class Config:
    device_id: str
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
