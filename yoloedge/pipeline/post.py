"""Post-processing stage: decode + NMS off the device threads, then hand results on.

One thread per accelerator group drains the workers' inferred batches, turns each frame's outputs
into detections with the shared post-processor, returns the output slot to its worker's ring, and
calls the sink (filters + MQTT) for every frame in order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from ..postprocess import Detections
from .frames import Frame
from .worker import InferredBatch

log = logging.getLogger(__name__)

Sink = Callable[[Frame, Detections, "object"], None]


class PostStage(threading.Thread):
    def __init__(self, name: str, results: "queue.Queue[InferredBatch | None]", sink: Sink):
        super().__init__(name=f"post-{name}", daemon=True)
        self.results = results
        self.sink = sink
        self.errors = 0
        self._idle = threading.Event()
        self._idle.set()

    def run(self) -> None:
        while True:
            item = self.results.get()
            if item is None:  # sentinel from stop()
                break
            self._idle.clear()
            try:
                self._handle(item)
            finally:
                if self.results.empty():
                    self._idle.set()

    def _handle(self, item: InferredBatch) -> None:
        try:
            detections = item.worker.detector.postprocess(item.outputs, item.geometries)
        except Exception:  # noqa: BLE001 - a bad batch is logged and counted, the stage goes on
            self.errors += 1
            log.exception("post-processing failed for a batch of %d frame(s)", len(item.frames))
            return
        finally:
            item.release()
        now = time.monotonic()
        for frame, dets in zip(item.frames, detections):
            frame.timings["postprocessed"] = now
            try:
                self.sink(frame, dets, item.worker.detector)
            except Exception:  # noqa: BLE001 - one frame's publishing error must not stop the rest
                self.errors += 1
                log.exception("publishing frame %d of %s failed", frame.seq, frame.camera,
                              extra={"camera": frame.camera})

    def pending(self) -> int:
        return self.results.qsize() + (0 if self._idle.is_set() else 1)

    def stop(self, timeout: float) -> bool:
        self.results.put(None)
        self.join(timeout)
        return not self.is_alive()
