"""Preparers: the threads that letterbox frames straight into the devices' input buffers.

This is the host work that used to sit on the device thread and kept the card idle while it ran
(decode -> letterbox -> run, serially). Here a small pool per accelerator group takes frames from
the camera queues and writes them into slots of the open input buffer while the device executes
another one. `cv2.resize` and NumPy's conversions release the GIL, so the pool uses every core.

Each preparer owns its `Letterboxer` (its canvas and plane buffers are allocated once and are not
shared), so nothing is allocated per frame. A frame that cannot be letterboxed (an unsupported
pixel format) leaves its slot empty: the batch still runs, and the frame is counted and logged.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from ..preprocess import Letterboxer
from .batcher import Batcher

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
        self.prepared = 0
        self.failures = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        take, filled, letterbox = self.batcher.take, self.batcher.filled, self.letterbox
        stop = self._stop_event
        while not stop.is_set():
            job = take(stop)
            if job is None:
                continue
            frame, buffer, slot, taken = job
            try:
                geometry = letterbox(frame.image, buffer.array[slot])
            except Exception as exc:  # noqa: BLE001 - a bad frame must not stop the pool
                geometry = None
                self.failures += 1
                self.on_failure(frame.camera, frame.seq, exc)
            filled(buffer, slot, frame, geometry, taken)
            self.prepared += 1

    def stop(self) -> None:
        self._stop_event.set()
