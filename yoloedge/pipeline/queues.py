"""Bounded per-camera frame queues with an explicit overflow policy.

* keep-latest (live cameras): a full queue drops its oldest frame, so inference always sees the
  newest picture and a slow accelerator never builds up latency; drops are counted.
* lossless (files with `realtime: false`): a full queue blocks the reader until there is room,
  so every frame is processed exactly once.

All queues of one accelerator share the batcher's lock; a put wakes one preparer through the
batcher's condition (`on_put`), and a blocked lossless reader waits on its queue's own condition,
so taking a frame wakes only that reader. `put` is a `sources.FrameSink`: the reader calls it and knows nothing more.

The queue holds references to the decoded frames, nothing else: a frame is letterboxed only when it
leaves the queue for a batch slot, so a dropped frame costs no pre-processing.
"""

from __future__ import annotations

import collections
import threading
import time

from ..sources.frame import Frame, SinkClosed


class QueueClosed(SinkClosed):
    """Raised by a put on a queue that was closed (the camera is being removed)."""


class FrameQueue:
    def __init__(self, camera: str, maxsize: int, lossless: bool,
                 lock: threading.Lock | None = None, on_put: threading.Condition | None = None):
        if maxsize < 1:
            raise ValueError("queue size must be at least 1")
        self.camera = camera
        self.maxsize = maxsize
        self.lossless = lossless
        self._lock = lock if lock is not None else threading.Lock()
        self._room = threading.Condition(self._lock)  # a lossless reader waits here for room
        self._on_put = on_put
        self._items: collections.deque[Frame] = collections.deque()
        self._closed = False
        self.dropped = 0
        self.put_count = 0

    def put(self, frame: Frame, timeout: float | None = None) -> bool:
        """Queue a frame. Keep-latest never blocks; lossless blocks until room, `timeout`
        (returns False) or close (raises QueueClosed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self.lossless:
                while len(self._items) >= self.maxsize and not self._closed:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._room.wait(remaining)
                if self._closed:
                    raise QueueClosed(self.camera)
            elif self._closed:
                raise QueueClosed(self.camera)
            elif len(self._items) >= self.maxsize:
                self._items.popleft()
                self.dropped += 1
            self._items.append(frame)
            self.put_count += 1
            if self._on_put is not None:
                self._on_put.notify()
            return True

    def get_nowait(self) -> Frame | None:
        """Take the oldest frame (the caller holds the shared lock)."""
        if not self._items:
            return None
        frame = self._items.popleft()
        if self.lossless:
            self._room.notify()  # the blocked reader may continue
        return frame

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._room.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
