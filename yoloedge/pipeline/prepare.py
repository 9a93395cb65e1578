"""Preparers: the threads that finish the letterbox straight into the devices' input buffers.

This is the host work that used to sit on the device thread and kept the card idle while it ran
(decode -> letterbox -> run, serially). The resize already happened on the camera's reader thread
(`intake`); a small pool per accelerator group takes the resized pictures from the camera queues,
fairly, and writes them padded, in the model's channel order and scale, into slots of the open
input buffer while the device executes another one. OpenCV and NumPy release the GIL for this,
so the pool uses every core.

Each preparer owns its `Letterboxer` (its canvas and plane buffers are allocated once and are not
shared), so nothing is allocated per frame. A picture that cannot be placed leaves its slot empty:
the batch still runs, and the frame is counted and logged.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from ..preprocess import Geometry, Letterboxer
from ..sources.frame import DevicePicture
from ..threads import lower_priority
from .batcher import Batcher
from .slots import BatchBuffer

log = logging.getLogger(__name__)

#: the pool size when the configuration leaves it to us: one per core, a few at most (beyond that
#: they only contend for the cores the decoders and the runtime also need)
MAX_AUTO_THREADS = 4


def auto_threads(configured: int) -> int:
    return configured if configured > 0 else max(1, min(MAX_AUTO_THREADS, os.cpu_count() or 1))


class Preparer(threading.Thread):
    def __init__(self, name: str, batcher: Batcher, letterboxer: Letterboxer,
                 on_failure: Callable[[str, int, Exception], None]):
        super().__init__(name=name, daemon=True)
        self.batcher = batcher
        self.letterbox = letterboxer
        self.on_failure = on_failure
        self._stop_event = threading.Event()

    def run(self) -> None:
        lower_priority()  # host work: the device worker comes first (see yoloedge.threads)
        take, filled, letterbox = self.batcher.take, self.batcher.filled, self.letterbox
        stop = self._stop_event
        while not stop.is_set():
            job = take(stop)
            if job is None:
                continue
            item, buffer, slot, taken = job
            geometry = None
            try:
                if item.picture is not None:
                    geometry = _place_on_device(item.picture, buffer, slot, letterbox)
                elif buffer.device_slots is not None:
                    raise ValueError("the model takes pictures the card decoded (decoder: dvpp), not host frames")
                elif item.image is not None and item.geometry is not None:
                    geometry = letterbox.place(item.image, item.geometry, buffer.array[slot])
            except Exception as exc:  # noqa: BLE001 - a bad picture must not stop the pool
                self.on_failure(item.camera, item.seq, exc)
            filled(buffer, slot, item, geometry, taken)  # copies what it needs of the item ...
            item.release()  # ... which may then take the camera's next frame
            # Not kept until the next job: after its camera was removed the entry's picture
            # must be freed now, not when (if ever) another camera's frame comes along.
            del job, item, buffer

    def stop(self) -> None:
        self._stop_event.set()


def _place_on_device(picture: DevicePicture, buffer: BatchBuffer, slot: int, letterbox: Letterboxer) -> Geometry:
    """A picture on the card, letterboxed by the card into the slot's device memory."""
    if buffer.device_slots is None:
        raise ValueError(f"a picture decoded on {picture.device} cannot go into host input buffers (the model "
                         f"takes host frames: convert it with `yoloedge convert atc --aipp yuv420sp`)")
    address, slot_bytes = buffer.device_slots
    return picture.letterbox_into(address + slot * slot_bytes, letterbox.width, letterbox.height)
