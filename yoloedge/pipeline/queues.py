"""Bounded per-camera queues with an explicit overflow policy.

* keep-latest (live cameras): a full queue drops its oldest entry, so inference always sees the
  newest picture and a slow accelerator never builds up latency; drops are counted, and the
  dropped entry is handed to `on_drop` (its buffer goes back to the camera's ring);
* lossless (files with `realtime: false`): a full queue blocks the reader until there is room,
  so every frame is processed exactly once.

All queues of one accelerator share the batcher's lock; a put wakes one preparer through the
batcher's condition (`on_put`), and a blocked lossless reader waits on its queue's own condition,
so taking an entry wakes only that reader. The queue does not care what its entries are: the
daemon queues each camera's resized pictures (see `intake`).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from ..sources.frame import SinkClosed


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
        #: called with an entry a keep-latest queue dropped (outside no lock: keep it short)
        self.on_drop: Callable[[Any], None] | None = None
        self._items: collections.deque[Any] = collections.deque()
        self._closed = False
        self.dropped = 0
        self.put_count = 0
        #: the device whose buffers alone take this camera's frames (`Batcher.add_camera`), or None
        self.device: str | None = None

    def put(self, item: Any, timeout: float | None = None) -> bool:
        """Queue an entry. Keep-latest never blocks; lossless blocks until room, `timeout`
        (returns False) or close (raises QueueClosed)."""
        dropped = None
        with self._lock:
            if self.lossless and not self._wait_for_room(timeout):
                return False
            if self._closed:
                raise QueueClosed(self.camera)
            if len(self._items) >= self.maxsize:  # keep-latest only: lossless waited for room
                dropped = self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            self.put_count += 1
            if self._on_put is not None:
                self._on_put.notify()
        if dropped is not None and self.on_drop is not None:
            self.on_drop(dropped)
        return True

    def wait_for_room(self, timeout: float | None) -> bool:
        """Lossless: wait until a put would not block; False after `timeout`. Raises QueueClosed."""
        with self._lock:
            if not self._wait_for_room(timeout):
                return False
            if self._closed:
                raise QueueClosed(self.camera)
            return True

    def _wait_for_room(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._items) >= self.maxsize and not self._closed:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._room.wait(remaining)
        return True

    def get_nowait(self) -> Any:
        """Take the oldest entry, or None (the caller holds the shared lock)."""
        if not self._items:
            return None
        item = self._items.popleft()
        if self.lossless:
            self._room.notify()  # the blocked reader may continue
        return item

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> int:
        """Refuse further puts and let go of the entries still queued (the camera is being
        removed: nobody will take them, and each holds a picture); returns how many there were."""
        with self._lock:
            self._closed = True
            discarded = len(self._items)
            self._items.clear()
            self.on_drop = None
            self._room.notify_all()
        return discarded

    @property
    def closed(self) -> bool:
        return self._closed
