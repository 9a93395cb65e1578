"""A camera's way into the pipeline: the sink its reader calls, on the reader's own thread.

It does the first half of the letterbox there -- the resize to the size the frame takes in the
model input -- into one of a small ring of model-sized buffers owned by the camera, and queues
that. So a 1080p camera keeps one decoded frame (the decoder's, reused for every read) plus a few
0.7 MB pictures, instead of queueing 6.2 MB frames; and the resize, the costliest part of the
letterbox, runs in parallel on the camera threads (cv2.resize releases the GIL). The preparers
finish the letterbox (pad, colour order, scale) straight into the batch slots.

A ring buffer is in use from the resize until a preparer has placed it, or until a keep-latest
queue drops it; then it comes back (`release`). The ring is sized for the worst case -- every
queue slot full, every preparer placing one of this camera's pictures, one being resized -- so
taking one never waits; should it ever run dry anyway, it grows by one, counted in `grown`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ..preprocess import Geometry, Resizer
from ..sources.frame import Frame
from .queues import FrameQueue


@dataclass(slots=True, eq=False)
class Resized:
    """A camera's resized picture waiting for a batch slot; reused for frame after frame."""

    owner: CameraIntake
    camera: str = ""
    seq: int = -1
    capture_time: float = 0.0
    capture_mono: float = 0.0
    image: np.ndarray | None = None  # BGR uint8 (new_h, new_w, 3): the buffer of this ring entry
    geometry: Geometry | None = None

    def release(self) -> None:
        """Placed in a batch slot (or dropped): the buffer may take the next frame."""
        self.owner.release(self)


class CameraIntake:
    def __init__(self, queue: FrameQueue, resizer: Resizer, ring: int):
        self.queue = queue
        self.resizer = resizer
        self._free: collections.deque[Resized] = collections.deque(Resized(self) for _ in range(ring))
        self._ring = ring
        self.grown = 0
        queue.on_drop = self.release

    def __call__(self, frame: Frame, timeout_s: float) -> bool:
        """The camera's `FrameSink`: resize, then queue (a full lossless queue: False, no work done)."""
        if self.queue.lossless and not self.queue.wait_for_room(timeout_s):
            return False
        item = self._take()
        item.image, item.geometry = self.resizer.resize(frame.image, item.image)
        item.camera, item.seq = frame.camera, frame.seq
        item.capture_time, item.capture_mono = frame.capture_time, frame.capture_mono
        self.queue.put(item, timeout_s)
        return True

    def _take(self) -> Resized:
        try:
            return self._free.pop()
        except IndexError:
            self.grown += 1
            return Resized(self)

    def release(self, item: Resized) -> None:
        self._free.append(item)

    def buffers(self) -> int:
        """Picture buffers allocated so far (the entries free now that have one, and those in use)."""
        free = list(self._free)
        idle = sum(1 for item in free if item.image is not None)
        return idle + self._ring - len(free) + self.grown

    @staticmethod
    def ring_size(queue_size: int, preparers: int) -> int:
        """Every queue entry, one per preparer placing, one being resized."""
        return queue_size + preparers + 1
