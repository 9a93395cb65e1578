"""Fills batches across the cameras of one accelerator group, fairly and with a timeout.

Device workers call `next_batch`; it returns as soon as the batch is full, or `timeout_s` after
the first frame arrived, whichever comes first, so a lone camera is never held back waiting for
company. Cameras are visited round-robin from a rotating start, one frame per camera per round,
so a fast camera cannot starve a slow one.
"""

from __future__ import annotations

import threading
import time

from .frames import Frame
from .queues import FrameQueue


class Batcher:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self._queues: dict[str, FrameQueue] = {}
        self._start = 0

    def add_camera(self, camera: str, maxsize: int, lossless: bool) -> FrameQueue:
        with self.cond:
            if camera in self._queues:
                raise ValueError(f"camera {camera!r} already has a queue")
            queue = FrameQueue(camera, maxsize, lossless, self.cond)
            self._queues[camera] = queue
            return queue

    def remove_camera(self, camera: str) -> int:
        """Close and forget a camera's queue; returns how many queued frames were discarded."""
        with self.cond:
            queue = self._queues.pop(camera, None)
            if queue is None:
                return 0
            left = len(queue)
        queue.close()
        return left

    def depth(self) -> int:
        with self.cond:
            return sum(len(q) for q in self._queues.values())

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def next_batch(self, max_frames: int, stop: threading.Event, idle_wait_s: float = 0.5) -> list[Frame]:
        """Up to `max_frames` frames; [] when nothing arrived within `idle_wait_s` or on stop."""
        batch: list[Frame] = []
        with self.cond:
            if not self._any_frame():
                self.cond.wait(idle_wait_s)
            if stop.is_set() or not self._any_frame():
                return batch
            deadline = time.monotonic() + self.timeout_s
            while len(batch) < max_frames:
                took = self._take_round(batch, max_frames)
                if len(batch) >= max_frames or stop.is_set():
                    break
                if not took:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.cond.wait(remaining)
        return batch

    def _any_frame(self) -> bool:
        return any(len(q) for q in self._queues.values())

    def _take_round(self, batch: list[Frame], max_frames: int) -> bool:
        queues = list(self._queues.values())
        if not queues:
            return False
        took = False
        n = len(queues)
        for k in range(n):
            if len(batch) >= max_frames:
                break
            frame = queues[(self._start + k) % n].get_nowait()
            if frame is not None:
                batch.append(frame)
                took = True
        self._start = (self._start + 1) % n
        return took
