"""The recent events of each camera and each event's best shot, for reading them back.

The router hands every event message it publishes to `EventLog.record` and, when an event's
snapshot gets better, the frame it still holds to `EventLog.best_shot`. `GET /api/events`,
`GET /api/events/{id}/snapshot.jpg`, `yoloedge-ctl events` and the status page read them here;
nothing of it goes through MQTT.

What is kept, per camera:

* the latest message of each of its last `max_events` events (older events are forgotten whole);
* one JPEG per event, with the event's box and its label and score drawn: the best shot so far.
  All of a camera's JPEGs together stay within its byte budget (`cameras[].event_snapshots_mb`,
  16 MiB by default: some 35-55 1080p shots, see `bench micro`); past it the shots of the oldest events go first.

A JPEG costs a frame copy (the box is drawn on the copy: the frame itself is shared with the
other sinks) and an encoding, 7-23 ms at 1080p (`bench micro`), so an event is encoded at most once per
`ENCODE_INTERVAL_S` of frame time: a better candidate within that second of the last encoding is
not encoded, and the next one after it is. Only the encoded bytes are kept, never the frame, its
copy or a reference to either: a frame is a pooled buffer the next read overwrites.

Thread-safety and lock order: one lock, `EventLog._lock`, guards every table; no other lock is
taken under it, and it is never held while drawing or encoding (the router's thread would wait
for a reader otherwise, and the other way round).
"""

from __future__ import annotations

import collections
import threading
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..config.schema import CameraConfig
from ..control.protocol import quoted_name

if TYPE_CHECKING:
    import numpy as np

MIB = 1024 * 1024
#: a camera's JPEG budget unless configured: `cameras[].event_snapshots_mb`'s default
DEFAULT_BUDGET_BYTES = int(CameraConfig.event_snapshots_mb * MIB)
#: events remembered per camera (their latest message each: about 1 KiB)
DEFAULT_MAX_EVENTS = 200
#: an event's best shot is encoded at most once per this much frame time
ENCODE_INTERVAL_S = 1.0
#: `recent()` returns this many events unless asked for fewer or more, and at most MAX_LIMIT
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
#: the longest event id looked up (ids are a start time and a counter: a few dozen characters)
MAX_ID_CHARS = 256


@dataclass
class _Event:
    """One event's latest message and best shot; changed only under `EventLog._lock`."""

    camera: str
    order: int  # when it was first seen, across cameras: newest first is highest first
    message: dict | None = None  # None until its first message (a best shot came first)
    jpeg: bytes | None = None
    shot: dict | None = None  # frame_time, score, box and bytes of `jpeg`
    encoded_at: float | None = None  # frame time of the last encoding begun


@dataclass
class _Camera:
    budget: int
    events: collections.OrderedDict[str, _Event] = field(default_factory=collections.OrderedDict)
    shot_bytes: int = 0


class EventLog:
    """See the module docstring. `max_events`: per camera; `budget_bytes`: for cameras that were
    never `configure`d."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES, max_events: int = DEFAULT_MAX_EVENTS):
        self.default_budget = budget_bytes
        self.max_events = max_events
        self._lock = threading.Lock()
        self._cameras: dict[str, _Camera] = {}
        self._where: dict[str, _Event] = {}  # event id -> its entry, for `snapshot(id)`
        self._order = 0
        self.encoded = 0  # JPEGs made
        self.skipped = 0  # candidates within ENCODE_INTERVAL_S of their event's last encoding
        self.evicted = 0  # shots dropped for the budget

    # -- cameras -----------------------------------------------------------------------------
    def configure(self, camera: str, budget_bytes: int) -> None:
        """The camera's JPEG budget (a reload may change it; a smaller one drops shots at once)."""
        with self._lock:
            cam = self._camera(camera)
            cam.budget = budget_bytes
            self._fit(cam, keep=None)

    def configure_camera(self, camera: CameraConfig) -> None:
        """`configure` with the camera's `event_snapshots_mb`."""
        self.configure(camera.name, int(camera.event_snapshots_mb * MIB))

    def forget_camera(self, camera: str) -> None:
        """A camera removed by a reload: its events and shots go."""
        with self._lock:
            cam = self._cameras.pop(camera, None)
            if cam is not None:
                for event_id, event in cam.events.items():
                    if self._where.get(event_id) is event:
                        del self._where[event_id]

    # -- the router's side -------------------------------------------------------------------
    def record(self, message: dict) -> None:
        """An event message (new, update or end) as it was published. The log keeps it as the
        event's latest: the caller must not change it afterwards."""
        event_id, camera = message.get("id"), message.get("camera")
        if not isinstance(event_id, str) or not isinstance(camera, str):
            raise ValueError(f"an event message needs string \"id\" and \"camera\", got {event_id!r}, {camera!r}")
        with self._lock:
            self._event(camera, event_id).message = message

    def best_shot(self, camera: str, event_id: str, image: np.ndarray,
                  box: tuple[float, float, float, float], score: float, frame_time: float,
                  scale: float = 1.0) -> None:
        """`image` (the frame, valid only during this call; `scale` times the source's size, `box`
        in source pixels) is the event's best so far: keep it as a JPEG with `box` drawn, unless
        the event was encoded less than ENCODE_INTERVAL_S of frame time ago (a frame time before
        the last one, after a clock step, is encoded)."""
        with self._lock:
            event = self._event(camera, event_id)
            last = event.encoded_at
            if last is not None and last <= frame_time < last + ENCODE_INTERVAL_S:
                self.skipped += 1
                return
            if self._cameras[camera].budget <= 0:
                return
            event.encoded_at = frame_time
            label = event.message.get("label") if event.message is not None else None
        drawn_box = (box[0] * scale, box[1] * scale, box[2] * scale, box[3] * scale)
        jpeg = _jpeg(_drawn(image, drawn_box, score, label if isinstance(label, str) else "object"))
        shot = {"frame_time": frame_time, "score": round(float(score), 6),
                "box": [round(float(v), 2) for v in box], "bytes": len(jpeg)}
        with self._lock:
            self.encoded += 1
            cam = self._cameras.get(camera)
            if cam is None or cam.events.get(event_id) is not event or event.encoded_at != frame_time:
                return  # forgotten meanwhile, or a later shot was begun
            cam.shot_bytes += len(jpeg) - (len(event.jpeg) if event.jpeg is not None else 0)
            event.jpeg, event.shot = jpeg, shot
            self._fit(cam, keep=event)

    # -- readers -----------------------------------------------------------------------------
    def recent(self, camera: str | None = None, limit: int = DEFAULT_LIMIT) -> list[dict]:
        """The latest message of the newest `limit` events (of `camera`, or of every camera),
        newest first, each with `"jpeg"`: its kept shot's frame_time, score, box and bytes, or
        null (none yet, or dropped for the budget)."""
        with self._lock:
            if camera is None:
                events = [e for cam in self._cameras.values() for e in cam.events.values()]
            else:
                cam = self._cameras.get(camera)
                events = list(cam.events.values()) if cam is not None else []
            events = sorted((e for e in events if e.message is not None), key=lambda e: -e.order)[:max(0, limit)]
            return [{**(e.message or {}), "jpeg": dict(e.shot) if e.shot is not None else None} for e in events]

    def snapshot(self, event_id: str) -> bytes | None:
        with self._lock:
            event = self._where.get(event_id)
            return event.jpeg if event is not None else None

    def stats(self) -> dict:
        """For the daemon's status: events and shots kept, bytes against each budget, JPEGs made,
        candidates skipped by the rate limit and shots dropped for the budget."""
        with self._lock:
            cameras = {name: {"events": sum(1 for e in cam.events.values() if e.message is not None),
                              "snapshots": sum(1 for e in cam.events.values() if e.jpeg is not None),
                              "snapshot_bytes": cam.shot_bytes, "budget_bytes": cam.budget}
                       for name, cam in self._cameras.items()}
            return {"cameras": cameras, "encoded": self.encoded, "skipped": self.skipped, "evicted": self.evicted}

    # -- under the lock ----------------------------------------------------------------------
    def _camera(self, camera: str) -> _Camera:
        cam = self._cameras.get(camera)
        if cam is None:
            cam = self._cameras[camera] = _Camera(self.default_budget)
        return cam

    def _event(self, camera: str, event_id: str) -> _Event:
        cam = self._camera(camera)
        event = cam.events.get(event_id)
        if event is None:
            self._order += 1
            event = cam.events[event_id] = _Event(camera, self._order)
            self._where[event_id] = event
            while len(cam.events) > self.max_events:
                old_id, old = cam.events.popitem(last=False)
                cam.shot_bytes -= len(old.jpeg) if old.jpeg is not None else 0
                if self._where.get(old_id) is old:
                    del self._where[old_id]
        return event

    def _fit(self, cam: _Camera, keep: _Event | None) -> None:
        """Drop the oldest events' shots until the camera is within its budget; `keep` last
        (a single shot larger than the whole budget is not kept either)."""
        for event in [*(e for e in cam.events.values() if e is not keep), *([keep] if keep is not None else [])]:
            if cam.shot_bytes <= cam.budget:
                return
            if event.jpeg is not None:
                cam.shot_bytes -= len(event.jpeg)
                event.jpeg = event.shot = None
                self.evicted += 1


def _drawn(image: np.ndarray, box: tuple[float, float, float, float], score: float, label: str) -> np.ndarray:
    """A copy of `image` (BGR) with the box and "label score" drawn as on the latest frame; the
    colour follows the label (one per label name, stable across restarts)."""
    # Imported here: `yoloedge-ctl` reads this module's request checks and must not load OpenCV.
    import numpy as np

    from ..postprocess import Detections
    from ..postprocess.annotate import PALETTE, annotate
    from ..preprocess.letterbox import as_bgr

    canvas = as_bgr(image)
    if canvas is image:
        canvas = image.copy()
    colour_id = zlib.crc32(label.encode("utf-8")) % len(PALETTE)
    one = Detections(np.array([box], np.float32), np.array([score], np.float32),
                     np.array([colour_id], np.int32), int(canvas.shape[1]), int(canvas.shape[0]))
    return annotate(canvas, one, [label] * (colour_id + 1))


def _jpeg(image: np.ndarray) -> bytes:
    from ..postprocess.annotate import encode_jpeg

    jpeg = encode_jpeg(image)
    if jpeg is None:
        raise RuntimeError(f"JPEG encoding of a {image.shape} frame failed")
    return jpeg


# -- reading back: shared by HTTP and the control socket ---------------------------------------

def valid_event_id(text: str) -> bool:
    """An id as the events module makes them: printable, no spaces, no path separators; never
    `.` or `..`. Ids are only ever looked up in a table, so this is about clear answers, not files."""
    return (0 < len(text) <= MAX_ID_CHARS and text not in (".", "..")
            and all(c.isprintable() and not c.isspace() and c not in "/\\" for c in text))


def read_limit(value: object) -> int | None:
    """`limit` of a request: a whole number 1..MAX_LIMIT (absent: DEFAULT_LIMIT); None when bad."""
    if value is None:
        return DEFAULT_LIMIT
    if isinstance(value, str):
        value = int(value) if value.isascii() and value.isdigit() and len(value) <= 6 else None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LIMIT:
        return None
    return value


def events_reply(log: EventLog, camera: object, limit: object, known: Callable[[str], bool]) -> dict:
    """`{"cmd": "events"}` and `GET /api/events`: the recent events, newest first; `reason`
    `unknown_camera` for a camera that is not configured (ctl's exit code, HTTP's 404)."""
    count = read_limit(limit)
    if count is None:
        return {"ok": False, "reason": "bad_request", "error": f'"limit" must be a whole number from 1 to {MAX_LIMIT}'}
    if camera is not None and not isinstance(camera, str):
        return {"ok": False, "reason": "bad_request", "error": '"camera" must be a camera name or null'}
    if camera is not None and not known(camera):
        return {"ok": False, "reason": "unknown_camera", "error": f"no camera named {quoted_name(camera)}"}
    return {"ok": True, "camera": camera, "events": log.recent(camera, count)}
