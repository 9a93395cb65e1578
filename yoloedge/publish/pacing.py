"""How fast a backlog goes out after a reconnect, and which spooled messages went out ahead of it.

After a long broker outage the backlog (the in-memory outbox and the spool) used to go out as
fast as the broker took it: Home Assistant and every other subscriber got an hour of detections in
seconds. The publisher now hands the backlog over through a `TokenBucket` (`mqtt.drain_rate`
messages a second, at most one second's worth at once), while messages published after the
reconnect go out at once, ahead of it (see publish/mqtt.py for the ordering this gives).

`SentAhead` remembers the spool records handed over out of the spool's order (a live message
while an older backlog waits, the newest retained state at a reconnect), so the drain skips them
when it reaches them instead of sending them twice. They are nearly always consecutive (live
messages are appended one after another), so it keeps ranges, not one entry per record.

Neither is thread-safe: the publisher uses both under its `_lock`.
"""

from __future__ import annotations

import bisect
import math
import sys
from typing import Callable

#: what `TokenBucket.available()` says when the rate is unlimited.
UNLIMITED = sys.maxsize
#: a paced drain hands messages over in about this many steps a second, not one at a time.
STEPS_PER_S = 10


class TokenBucket:
    """At most `rate` messages a second on average and `burst` at once; `rate` 0: unlimited.
    The clock is injectable (monotonic seconds), so tests count tokens instead of waiting."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]):
        if rate < 0 or burst < 1:
            raise ValueError(f"invalid token bucket: rate {rate}, burst {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    @property
    def unlimited(self) -> bool:
        return self.rate == 0

    def _refill(self) -> None:
        now = self._clock()
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def available(self) -> int:
        """Whole messages that may go out now."""
        if self.unlimited:
            return UNLIMITED
        self._refill()
        return int(self._tokens)

    def take(self, count: int) -> None:
        """`count` messages went out, of those `available()` granted. Spent from that count, not
        from a refill: the clock may move between the grant and the sending (a round of the drain
        hands messages to paho, then takes them), and a refill in between would charge the old
        grant to the new second's burst."""
        if not self.unlimited and count:
            self._tokens -= count

    def step(self) -> int:
        """How many messages a paced drain waits for before its next step: about a tenth of a
        second's worth, so a slow rate is not a burst a second and a fast one not a wake-up per
        message."""
        return max(1, min(int(self.burst), math.ceil(self.rate / STEPS_PER_S)))

    def wait_s(self, wanted: int) -> float:
        """Seconds until `wanted` messages may go out (0 when they may now)."""
        if self.unlimited:
            return 0.0
        self._refill()
        return max(0.0, (min(wanted, self.burst) - self._tokens) / self.rate)


class SentAhead:
    """Spool sequence numbers handed over before the drain reached them (see the module
    docstring), as sorted, disjoint [start, end) ranges."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, seq: int) -> None:
        if self._ends and self._ends[-1] == seq:  # the usual case: the next live message
            self._ends[-1] = seq + 1
            return
        i = bisect.bisect_right(self._starts, seq)
        if i and self._ends[i - 1] > seq:
            return  # already in
        if i and self._ends[i - 1] == seq:
            self._ends[i - 1] = seq + 1
        else:
            self._starts.insert(i, seq)
            self._ends.insert(i, seq + 1)
            i += 1
        if i < len(self._starts) and self._starts[i] == self._ends[i - 1]:  # now touches the next
            self._ends[i - 1] = self._ends[i]
            del self._starts[i], self._ends[i]

    def passed(self, seq: int) -> bool:
        """The drain reached `seq` (drains go up): True when it was sent ahead. Ranges wholly
        below `seq` are forgotten."""
        while self._ends and self._ends[0] <= seq:
            del self._starts[0], self._ends[0]
        return bool(self._starts) and self._starts[0] <= seq

    def clear(self) -> None:
        """After a lost connection: what was sent ahead and not acknowledged goes again, in order."""
        self._starts.clear()
        self._ends.clear()
