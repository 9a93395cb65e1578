"""How long to wait before trying again: one rule for everything that retries.

A camera that cannot be reached, a device that failed or hung, a device call that keeps failing:
each retries after `first_s`, multiplied by `factor` with every failure in a row up to `max_s`,
and starts again from `first_s` once what it retried worked for `reset_after_s`. Quick after a
one-off fault, never a tight loop against something that stays broken. `jitter` spreads the
delays by that fraction either way (cameras behind one recorder must not reconnect in step); its
random source is injectable, so tests can pin it.
"""

from __future__ import annotations

import math
import random


class Backoff:
    """The delays of one retrying thing. Not thread-safe: one owner calls it."""

    def __init__(self, first_s: float, max_s: float, *, factor: float = 2.0,
                 reset_after_s: float = math.inf, jitter: float = 0.0, rng: random.Random | None = None):
        if first_s < 0 or max_s < 0 or factor < 1 or not 0 <= jitter < 1:
            raise ValueError(f"invalid backoff: first {first_s}, max {max_s}, factor {factor}, jitter {jitter}")
        self.first_s = first_s
        self.max_s = max_s
        self.factor = factor
        self.reset_after_s = reset_after_s
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._level = 0

    def next_delay(self, healthy_for_s: float | None = None) -> float:
        """The wait before the next try, after a failure; `healthy_for_s` is how long it had worked
        before this failure (None: it never did), and a long enough run starts the delays over."""
        if healthy_for_s is not None and healthy_for_s >= self.reset_after_s:
            self._level = 0
        base = min(self.max_s, self.first_s * self.factor ** self._level)
        if base < self.max_s:
            self._level += 1
        if not self.jitter:
            return base
        return max(0.0, base * self._rng.uniform(1 - self.jitter, 1 + self.jitter))

    def reset(self) -> None:
        """It worked: the next failure waits `first_s` again."""
        self._level = 0
