"""Which of a device's models runs next.

A device worker serves every model of its group (see `groups`): each model has its own batcher,
and one device runs one batch at a time. The scheduler asks the models' batchers in turn, starting
after the one served last, and runs the first batch that is ready; so a model with batches always
waiting cannot starve another (each gets at least every n-th run of the device while it has work),
and the device never idles while any model has a batch. With nothing ready it waits on the signal
the group's batchers share (a seal, a completed slot, an opened buffer), at most until the nearest
batch timeout.

Thread: the device worker's own (one scheduler per opening of a device). Lock: the batchers'
shared `BatchSignal.lock`, taken here around the polls and the wait.
"""

from __future__ import annotations

import threading
from typing import Sequence

from .batcher import Batcher
from .slots import BatchBuffer


class Scheduler:
    def __init__(self, batchers: Sequence[Batcher], owner: str):
        if not batchers:
            raise ValueError("a device serves at least one model")
        signal = batchers[0].signal
        if any(b.signal is not signal for b in batchers):
            raise ValueError("the batchers of one device must share one BatchSignal")
        self._batchers = tuple(batchers)
        self._signal = signal
        self._owner = owner
        self._turn = 0  # the model asked first next time
        self.runs = [0] * len(batchers)  # batches handed out per model

    def ready_batch(self, stop: threading.Event) -> tuple[int, BatchBuffer] | None:
        """(model index, its ready batch) if one is ready now, else None; never waits (a
        pipelining worker asks while a batch is on the device, and completes that one otherwise)."""
        count = len(self._batchers)
        with self._signal.lock:
            for k in range(count):
                index = (self._turn + k) % count
                got = self._batchers[index].poll(self._owner, stop)
                if isinstance(got, BatchBuffer):
                    self._turn = (index + 1) % count
                    self.runs[index] += 1
                    return index, got
        return None

    def next_batch(self, stop: threading.Event, idle_wait_s: float = 0.5) -> tuple[int, BatchBuffer] | None:
        """(model index, its ready batch); None once no model will get more for this device."""
        count = len(self._batchers)
        with self._signal.lock:
            while True:
                waits: list[float] = []
                for k in range(count):
                    index = (self._turn + k) % count
                    got = self._batchers[index].poll(self._owner, stop, idle_wait_s)
                    if isinstance(got, BatchBuffer):
                        self._turn = (index + 1) % count
                        self.runs[index] += 1
                        return index, got
                    if got is not None:
                        waits.append(got)
                if not waits:
                    return None
                self._signal.batches.wait(min(waits))
