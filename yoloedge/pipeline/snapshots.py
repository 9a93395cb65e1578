"""Each camera's latest processed frame, kept for `yoloedge-ctl snapshot` and the status page.

The frame a camera decodes is reused for the next read, and by the time its detections are
published only the letterboxed model input is left (in a batch slot already refilled). So a frame
is copied on the reader's way in (`tap`), before the pipeline takes it, into something the camera
owns. When post-processing publishes that same frame (same sequence number and capture time) the
copy becomes the camera's snapshot, together with the detections that went out on MQTT. Frames
without a copy pass the store by with one or two comparisons, no lock.

What the copy is depends on whether anyone looks:

* *watched* -- the camera's snapshot was asked for within the last `watch_s` -- the frame is copied
  as it is, at most `copies_per_s` times a second, into one of two frame-sized buffers that swap
  on publication: nothing is allocated per frame, only when a camera's frame size changes, and a
  copy costs about half a millisecond at 1080p;
* otherwise one frame every `idle_interval_s` is kept as a JPEG (`KEEPSAKE_QUALITY`), encoded on
  the reader's thread (about 9 ms at 1080p, once in 10 s), and the two buffers are freed.

Two raw 1080p buffers are 12.4 MB per camera, a third of what a decoded 1080p camera costs in
all; a JPEG keepsake is a few hundred kB. So a camera nobody looks at keeps a snapshot no older
than `idle_interval_s` (and the last one of a camera that ended or went silent) for the price of a
JPEG, and the first request is answered at once from it; from then on, for `watch_s`, the
snapshots are the full-quality frame at most 1/`copies_per_s` old.

A JPEG is made only when one is asked for: the snapshot is copied (or the keepsake decoded) under
the camera's lock, annotated (boxes, labels, one colour per class) and encoded on the asking thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

import cv2
import numpy as np

from ..postprocess import Detections
from ..postprocess.annotate import annotate, encode_jpeg
from ..preprocess.letterbox import as_bgr
from ..sources.frame import Frame, FrameSink

#: copies of a watched camera's frame per second at most: each 1080p copy costs about half a millisecond.
DEFAULT_COPIES_PER_S = 2.0
#: a camera counts as watched for this long after its snapshot was last asked for (the status page
#: asks every few seconds while it is open)
DEFAULT_WATCH_S = 60.0
#: an unwatched camera keeps one frame this often, as a JPEG
DEFAULT_IDLE_INTERVAL_S = 10.0
#: the keepsake is decoded, annotated and encoded again when asked for: a high quality keeps that
#: second generation close to the first (a 1080p street scene: about 0.5 MB)
KEEPSAKE_QUALITY = 95


class SnapshotMiss(str, Enum):
    """Why there is no snapshot to give."""
    UNKNOWN_CAMERA = "unknown_camera"
    NO_FRAME_YET = "no_frame_yet"

    def why(self, quoted_camera: str) -> str:
        """What to tell whoever asked, for the camera named (already quoted for display)."""
        if self is SnapshotMiss.UNKNOWN_CAMERA:
            return f"no camera named {quoted_camera}"
        return f"camera {quoted_camera} has no processed frame yet"


@dataclass(frozen=True)
class Snapshot:
    """One annotated, encoded frame and what was published for it."""
    camera: str
    seq: int
    capture_time: float  # wall clock, as the MQTT message's `ts`
    width: int
    height: int
    detections: list[dict]  # as in the MQTT message
    jpeg: bytes


class _CameraCopy:
    """A camera's copies. The reader thread alone writes `next_copy_mono` and `raw`; a request
    alone writes `watched_until`; everything else is guarded by `lock`."""

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.next_copy_mono = float("-inf")  # reader thread only
        self.raw = False  # reader thread only: the last copy was a raw one (the camera was watched)
        self.watched_until = float("-inf")  # asking threads only
        self.staging: np.ndarray | None = None  # a raw copy waiting for its publication
        self.pending_jpeg: bytes | None = None  # a keepsake waiting for its publication
        self.pending_key: tuple[int, float] = (-1, 0.0)  # (seq, capture_mono) of the waiting copy
        self.shown: np.ndarray | None = None  # the snapshot, raw; or
        self.shown_jpeg: bytes | None = None  # the snapshot, a keepsake
        self.seq = -1
        self.capture_time = 0.0
        self.detections: Detections | None = None
        self.labels: Sequence[str] = ()
        self.allocations = 0  # raw buffers allocated: 1-2 per frame size and watch, never per frame

    def raw_bytes(self) -> int:
        """Memory held in raw frame copies (not the keepsakes)."""
        with self.lock:
            return sum(b.nbytes for b in (self.staging, self.shown) if b is not None)


class SnapshotStore:
    def __init__(self, copies_per_s: float = DEFAULT_COPIES_PER_S, clock: Callable[[], float] = time.monotonic,
                 watch_s: float = DEFAULT_WATCH_S, idle_interval_s: float = DEFAULT_IDLE_INTERVAL_S):
        self.interval_s = 1.0 / copies_per_s if copies_per_s > 0 else float("inf")
        self.watch_s = watch_s
        self.idle_interval_s = idle_interval_s
        self._clock = clock
        self._cameras: dict[str, _CameraCopy] = {}  # replaced whole, never changed in place

    # -- cameras -----------------------------------------------------------------------------
    def add(self, camera: str) -> None:
        if camera not in self._cameras:
            self._cameras = {**self._cameras, camera: _CameraCopy(camera)}

    def forget(self, camera: str) -> None:
        self._cameras = {name: c for name, c in self._cameras.items() if name != camera}

    def known(self, camera: str) -> bool:
        return camera in self._cameras

    def tap(self, camera: str, sink: FrameSink) -> FrameSink:
        """`sink` with a bounded-rate copy of each frame taken first (see the module docstring):
        copied before the pipeline sees the frame, or its detections could be published before
        the copy is tagged and never match it."""
        self.add(camera)

        def tapped(frame: Frame, timeout_s: float) -> bool:
            self.offer(frame)
            return sink(frame, timeout_s)

        return tapped

    # -- the pipeline's side -----------------------------------------------------------------
    def offer(self, frame: Frame) -> None:
        """Reader thread: copy the frame if this camera's next copy is due -- at once when the
        camera has just become watched."""
        cam = self._cameras.get(frame.camera)
        if cam is None:
            return
        now = self._clock()
        watched = now < cam.watched_until
        if now < cam.next_copy_mono and (cam.raw or not watched):
            return
        cam.raw = watched
        cam.next_copy_mono = now + (self.interval_s if watched else self.idle_interval_s)
        if watched:
            self._copy_raw(cam, frame)
        else:
            self._keep_jpeg(cam, frame)

    @staticmethod
    def _copy_raw(cam: _CameraCopy, frame: Frame) -> None:
        image = frame.host_image()
        with cam.lock:
            buffer = cam.staging
            if buffer is None or buffer.shape != image.shape or buffer.dtype != image.dtype:
                buffer = cam.staging = np.empty_like(image)
                cam.allocations += 1
            np.copyto(buffer, image)
            cam.pending_jpeg = None
            cam.pending_key = (frame.seq, frame.capture_mono)

    @staticmethod
    def _keep_jpeg(cam: _CameraCopy, frame: Frame) -> None:
        """Unwatched: the raw buffer waiting for a copy is freed at once; the raw snapshot stays
        until this keepsake replaces it, so that there is never a moment without one."""
        with cam.lock:
            cam.staging = None
        keepsake = encode_jpeg(frame.host_image(), KEEPSAKE_QUALITY)
        if keepsake is None:  # a frame OpenCV cannot encode (an odd channel count): no keepsake of it
            return
        with cam.lock:
            cam.pending_jpeg = keepsake
            cam.pending_key = (frame.seq, frame.capture_mono)

    def published(self, camera: str, seq: int, capture_mono: float, capture_time: float,
                  detections: Detections, labels: Sequence[str]) -> None:
        """Post-processing: frame `seq` was published with `detections`; if it is the frame
        copied last, it becomes the camera's snapshot (a swap or a reference, no copy)."""
        cam = self._cameras.get(camera)
        if cam is None or cam.pending_key[0] != seq:
            return
        with cam.lock:
            if cam.pending_key != (seq, capture_mono):
                return
            if cam.pending_jpeg is not None:
                cam.shown_jpeg, cam.pending_jpeg = cam.pending_jpeg, None
                cam.shown = None
            elif cam.staging is not None:
                cam.staging, cam.shown = cam.shown, cam.staging
                cam.shown_jpeg = None
            else:
                return
            cam.pending_key = (-1, 0.0)
            cam.seq, cam.capture_time = seq, capture_time
            cam.detections, cam.labels = detections, labels

    # -- on request --------------------------------------------------------------------------
    def latest(self, camera: str) -> Snapshot | SnapshotMiss:
        """The camera's latest processed frame with its boxes drawn, encoded now. Asking makes
        the camera watched for `watch_s`: its next frames are copied in full."""
        cam = self._cameras.get(camera)
        if cam is None:
            return SnapshotMiss.UNKNOWN_CAMERA
        cam.watched_until = self._clock() + self.watch_s
        with cam.lock:
            if (cam.shown is None and cam.shown_jpeg is None) or cam.detections is None:
                return SnapshotMiss.NO_FRAME_YET
            image = cam.shown.copy() if cam.shown is not None else None
            keepsake = cam.shown_jpeg
            seq, capture_time, dets, labels = cam.seq, cam.capture_time, cam.detections, cam.labels
        if image is None:
            image = cv2.imdecode(np.frombuffer(keepsake or b"", np.uint8), cv2.IMREAD_UNCHANGED)
            if image is None:
                raise RuntimeError(f"camera {camera}: its keepsake JPEG does not decode")
        image = annotate(as_bgr(image), dets, labels)
        jpeg = encode_jpeg(image)
        if jpeg is None:
            raise RuntimeError(f"camera {camera}: JPEG encoding of a {image.shape} frame failed")
        return Snapshot(camera, seq, capture_time, int(image.shape[1]), int(image.shape[0]),
                        dets.to_dicts(labels), jpeg)

    def latest_jpeg(self, camera: str) -> bytes | None:
        """The annotated JPEG, or None (unknown camera, or no frame processed yet: see `latest`)."""
        snap = self.latest(camera)
        return snap.jpeg if isinstance(snap, Snapshot) else None

    def allocations(self, camera: str) -> int:
        cam = self._cameras.get(camera)
        return cam.allocations if cam is not None else 0

    def raw_bytes(self, camera: str) -> int:
        """Bytes the camera holds in raw frame copies: 0 while nobody watches it."""
        cam = self._cameras.get(camera)
        return cam.raw_bytes() if cam is not None else 0

