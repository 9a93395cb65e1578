"""A camera's way into the pipeline: the sink its reader calls, on the reader's own thread.

It does the first half of the letterbox there -- the resize to the size the frame takes in the
model input -- into one of a small ring of model-sized buffers owned by the camera, and queues
that. So a 1080p camera holds its decoded frame only for this call (a buffer lent from the
cameras' shared pool, `sources.framepool`) and keeps a few 0.7 MB pictures, instead of queueing
6.2 MB frames; and the resize, the costliest part of the
letterbox, runs in parallel on the camera threads (cv2.resize releases the GIL). The preparers
finish the letterbox (pad, colour order, scale) straight into the batch slots.

A ring buffer is in use from the resize until a preparer has placed it, or until a keep-latest
queue drops it; then it comes back (`release`). The ring is sized for the worst case -- every
queue slot full, every preparer placing one of this camera's pictures, one being resized -- so
taking one never waits; should it ever run dry anyway, it grows by one, counted in `grown`.

Nothing here forms a reference cycle, so a removed camera's ring is freed the moment the camera
is dropped, not whenever the cyclic garbage collector next runs (a reload that removes 64
cameras would otherwise keep their 64 rings, hundreds of MB, until then): an entry knows its
intake only weakly, and the queue gives a dropped entry back through the entry itself rather
than through a bound method of the intake.
"""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass

import numpy as np

from ..preprocess import Geometry, Resizer
from ..sources.frame import DevicePicture, Frame
from .queues import FrameQueue


@dataclass(slots=True, eq=False)
class Resized:
    """A camera's resized picture waiting for a batch slot; reused for frame after frame."""

    #: weak: the intake holds its ring, and a strong link back would make every entry a cycle
    owner: weakref.ref[CameraIntake]
    camera: str = ""
    seq: int = -1
    capture_time: float = 0.0
    capture_mono: float = 0.0
    frame_time: float = 0.0  # `Frame.time`: what tracking runs on
    image: np.ndarray | None = None  # BGR uint8 (new_h, new_w, 3): the buffer of this ring entry
    geometry: Geometry | None = None
    #: a picture on the card (`decoder: dvpp`) instead of `image`: letterboxed there by the
    #: preparer, which also decides the geometry; given back to its own ring with this entry
    picture: DevicePicture | None = None

    def release(self) -> None:
        """Placed in a batch slot (or dropped): the buffer may take the next frame. An entry
        whose camera was removed meanwhile is simply let go. A device picture goes back to its
        ring either way."""
        picture, self.picture = self.picture, None
        if picture is not None:
            picture.release()
        owner = self.owner()
        if owner is not None:
            owner.release(self)


class CameraIntake:
    def __init__(self, queue: FrameQueue, resizer: Resizer, ring: int):
        self.queue = queue
        self.resizer = resizer
        self._ref = weakref.ref(self)
        self._free: collections.deque[Resized] = collections.deque(Resized(self._ref) for _ in range(ring))
        self._ring = ring
        self.grown = 0
        self._closed = False
        queue.on_drop = Resized.release  # not self.release: the queue must not keep the intake alive

    def __call__(self, frame: Frame, timeout_s: float) -> bool:
        """The camera's `FrameSink`: resize, then queue (a full lossless queue: False, no work done)."""
        if self.queue.lossless and not self.queue.wait_for_room(timeout_s):
            return False
        item = self._take()
        if frame.picture is not None:  # on the card: the preparer letterboxes it there
            frame.picture.hold()
            item.picture, item.geometry = frame.picture, None
        else:
            item.image, item.geometry = self.resizer.resize(frame.image, item.image)
        item.camera, item.seq = frame.camera, frame.seq
        item.capture_time, item.capture_mono = frame.capture_time, frame.capture_mono
        item.frame_time = frame.time
        self.queue.put(item, timeout_s)
        return True

    def _take(self) -> Resized:
        try:
            return self._free.pop()
        except IndexError:
            self.grown += 1
            return Resized(self._ref)

    def release(self, item: Resized) -> None:
        if not self._closed:
            self._free.append(item)

    def close(self) -> None:
        """The camera is removed: let go of the ring now. A capture thread still blocked in a
        frozen camera's read keeps its reader, and through the reader's sink this intake, until
        the read returns (up to a few read timeouts); the pictures need not wait for it. Entries
        still on their way (a preparer placing one) are let go when they come back."""
        self._closed = True
        self._free.clear()

    def buffers(self) -> int:
        """Picture buffers allocated so far (the entries free now that have one, and those in use)."""
        free = list(self._free)
        idle = sum(1 for item in free if item.image is not None)
        return idle + self._ring - len(free) + self.grown

    @staticmethod
    def ring_size(queue_size: int, preparers: int) -> int:
        """Every queue entry, one per preparer placing, one being resized."""
        return queue_size + preparers + 1
