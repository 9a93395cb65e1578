"""The meters behind every rate and latency figure in status, stats and benchmarks.

One implementation, used by camera readers and the pipeline alike (it sits at the top of the
package so that `sources/` need not import `pipeline/`). Both meters are thread-safe, take an
injectable clock, and allocate nothing per event: status may be asked for at any time, while
`mark()` / `add()` run on the hot path hundreds of times a second.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from typing import Callable

Clock = Callable[[], float]


class RateMeter:
    """Events per second over the last `window_s` seconds, counted in fixed time buckets.

    While the meter is younger than its window, the count is divided by the time actually
    observed, so a camera that started two seconds ago reports its real rate, not two fifths of
    it. Bucketing bounds memory and makes `mark()` O(1) whatever the event rate; the window's
    oldest edge moves in steps of window_s / buckets.
    """

    def __init__(self, window_s: float = 5.0, clock: Clock = time.monotonic, buckets: int = 20):
        if window_s <= 0 or buckets < 1:
            raise ValueError("window_s must be > 0 and buckets >= 1")
        self._width = window_s / buckets
        self._clock = clock
        self._counts: list[float] = [0] * buckets
        self._ids = [-1] * buckets  # which time bucket each ring entry currently counts
        self._lock = threading.Lock()
        self._since = clock()
        self.total: float = 0

    def mark(self, count: float = 1) -> None:
        bucket = math.floor(self._clock() / self._width)
        with self._lock:
            self.total += count
            i = bucket % len(self._counts)
            if self._ids[i] != bucket:
                self._ids[i] = bucket
                self._counts[i] = 0
            self._counts[i] += count

    def rate(self) -> float:
        now = self._clock()
        current = math.floor(now / self._width)
        oldest = current - len(self._counts) + 1
        with self._lock:
            events = sum(c for c, b in zip(self._counts, self._ids) if oldest <= b <= current)
        # The counted buckets cover [oldest * width, now]; never more than the meter has lived.
        span = min(now - oldest * self._width, now - self._since)
        return events / span if span > 0 else 0.0


class LatencyWindow:
    """The last `size` durations (ms), for p50/p99 in status; a ring, so adding allocates nothing."""

    def __init__(self, size: int = 1000):
        self._values = [0.0] * size
        self._count = 0
        self._lock = threading.Lock()

    def add(self, ms: float) -> None:
        with self._lock:
            self._values[self._count % len(self._values)] = ms
            self._count += 1

    def percentile(self, q: float) -> float | None:
        with self._lock:
            n = min(self._count, len(self._values))
            if not n:
                return None
            ordered = sorted(self._values[:n])
        index = min(n - 1, max(0, round(q / 100 * (n - 1))))
        return round(ordered[index], 2)

    def values(self) -> list[float]:
        """A copy of what the window holds (oldest first once it has wrapped), for benchmarks."""
        with self._lock:
            n = min(self._count, len(self._values))
            if self._count <= len(self._values):
                return self._values[:n]
            start = self._count % len(self._values)
            return self._values[start:] + self._values[:start]


class BucketCounts:
    """Cumulative-ready counts over fixed upper bounds, and their sum: what a Prometheus
    histogram needs, which percentile windows cannot give (they forget). `add()` is a bisect
    and two increments under a lock; the exporter reads a snapshot at scrape time."""

    def __init__(self, bounds: tuple[float, ...]):
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError("bounds must be increasing and not empty")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def add(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # the first bound >= value (Prometheus `le`)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[int], float]:
        """Counts per bucket (not cumulative; the last is above every bound) and the sum."""
        with self._lock:
            return list(self._counts), self._sum
