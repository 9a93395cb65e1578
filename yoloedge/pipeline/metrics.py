"""Small thread-safe meters for status: event rates and latency percentiles over a window."""

from __future__ import annotations

import collections
import threading
import time


class RateMeter:
    """Events per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 5.0, clock=time.monotonic):
        self._window = window_s
        self._clock = clock
        self._times: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()
        self.total = 0

    def mark(self, count: int = 1) -> None:
        now = self._clock()
        with self._lock:
            self.total += count
            for _ in range(count):
                self._times.append(now)
            self._trim(now)

    def rate(self) -> float:
        now = self._clock()
        with self._lock:
            self._trim(now)
            return len(self._times) / self._window

    def _trim(self, now: float) -> None:
        cutoff = now - self._window
        while self._times and self._times[0] < cutoff:
            self._times.popleft()


class LatencyWindow:
    """The last `size` durations (ms), for p50/p99 in status."""

    def __init__(self, size: int = 1000):
        self._values: collections.deque[float] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, ms: float) -> None:
        with self._lock:
            self._values.append(ms)

    def percentile(self, q: float) -> float | None:
        with self._lock:
            if not self._values:
                return None
            ordered = sorted(self._values)
        index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
        return round(ordered[index], 2)
