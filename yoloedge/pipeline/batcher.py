"""Turns the cameras' frames into batches in the devices' own input buffers, fairly and in time.

Three kinds of threads meet here, under one lock:

* camera readers put their frames, already resized to the model (see `intake`), into their
  camera's bounded queue (`queues.FrameQueue`);
* preparers (`prepare.Preparer`) `take()` a picture together with a free slot of the *open*
  input buffer, finish its letterbox there without the lock, and report it `filled()`;
* device workers take a sealed buffer (`poll`, through their `scheduler.Scheduler`) and run it,
  then `release()` it for refilling.

Every device gives the batcher its input sets (at least two), so one batch is filled while
another executes and the device need not wait for the host. One buffer is open at a time; it is
sealed when full, or by its idle worker once `timeout_s` has passed since its first frame (a lone
camera is never held back waiting for company). Sealing hands out a *ticket*: post-processing
publishes batches in ticket order, so every camera's frames go out in the order they were read,
whichever device ran them.

Frames are taken from the cameras round-robin, one per camera per turn, so a fast camera cannot
starve a slow one when slots are scarce; a full keep-latest queue meanwhile drops its oldest frame.

A device that fails or hangs takes its buffers out (`remove_buffers`), so new frames go only to
the other devices of the group, which count them as `rebalanced` (per camera and per device) while
a sibling is down (`set_down`). The batches it had sealed are given up, their tickets skipped:
moving one to another device would deadlock, because that device may already have run later
tickets whose output sets now wait in post-processing for this older one, and it cannot run the
older one until an output set comes back. With no device left, frames wait in the cameras'
bounded queues, where a keep-latest queue drops (and counts) its oldest.

Conditions (all on `lock`): `_work` wakes preparers (a frame or room appeared), `_batches` wakes
workers (a buffer was sealed, completed, or opened), each queue's own condition wakes its blocked
lossless reader.

Pinned cameras: a camera whose pictures already live in one card's memory (`decoder: dvpp`: the
card's VDEC decoded them) is pinned to that device (`add_camera(device=...)`): its frames go only
into that device's buffers. Each device may then have a buffer open at once (`_open`, by device),
so a pinned camera never waits for another card's batch to fill; unpinned frames take any open
buffer, else the least loaded device's. A pinned camera's frames wait in its queue while its
device is down (another card cannot read its memory).

Several models: each model of a group has its own batcher (its own camera queues, buffers and
tickets), and the batchers of one group share one `BatchSignal` (`lock` and `_batches`), so a
device worker serving several models waits on one condition for whichever model has a batch
(`scheduler.Scheduler`, which asks each batcher with `poll`).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Callable, Sequence

import numpy as np

from ..preprocess import Geometry
from .intake import Resized
from .queues import FrameQueue
from .slots import BatchBuffer

#: how long `remove_buffers` waits for preparers still writing into a leaving device's buffers;
#: a buffer still not written after it is returned unready, and its device memory is never freed
FILL_WAIT_S = 5.0


class BatchSignal:
    """The lock and the "a batch may be ready" condition that the batchers of one group share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches = threading.Condition(self.lock)


class Batcher:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 signal: BatchSignal | None = None):
        self.timeout_s = timeout_s
        self._clock = clock
        self.signal = signal or BatchSignal()
        self.lock = self.signal.lock
        self._work = threading.Condition(self.lock)
        self._batches = self.signal.batches
        self._queues: dict[str, FrameQueue] = {}
        self._order: list[FrameQueue] = []  # round-robin order of the queues
        self._next = 0  # where the next round-robin turn starts
        self._free: collections.deque[BatchBuffer] = collections.deque()
        self._open: dict[str, BatchBuffer] = {}  # device -> its open buffer
        self._sealed: dict[str, collections.deque[BatchBuffer]] = {}
        self._running: dict[str, int] = {}
        self._tickets = itertools.count()
        self._closed = False
        self._device_of: dict[str, str] = {}  # buffer owner -> the device it belongs to
        self._down: set[str] = set()  # devices failed or restarting
        self._rebalanced_camera: collections.Counter[str] = collections.Counter()
        self._rebalanced_device: collections.Counter[str] = collections.Counter()

    # -- cameras ---------------------------------------------------------------------------------
    def add_camera(self, camera: str, maxsize: int, lossless: bool, device: str | None = None) -> FrameQueue:
        """A camera's queue; `device`: the only device whose buffers take its frames (pinned)."""
        with self.lock:
            if camera in self._queues:
                raise ValueError(f"camera {camera!r} already has a queue")
            queue = FrameQueue(camera, maxsize, lossless, self.lock, self._work)
            queue.device = device
            self._queues[camera] = queue
            self._order.append(queue)
            return queue

    def remove_camera(self, camera: str) -> int:
        """Close and forget a camera's queue; returns how many queued frames were discarded."""
        with self.lock:
            queue = self._queues.pop(camera, None)
            if queue is None:
                return 0
            self._order.remove(queue)
        return queue.close()

    def pending(self) -> int:
        """Frames taken in but not yet handed to a device: queued, or in an open or sealed buffer."""
        with self.lock:
            waiting = sum(b.claimed for q in self._sealed.values() for b in q)
            return sum(len(q) for q in self._order) + waiting + sum(b.claimed for b in self._open.values())

    # -- devices ---------------------------------------------------------------------------------
    def add_buffers(self, owner: str, arrays: list[np.ndarray], device: str | None = None,
                    device_slots: Sequence[tuple[int, int]] | None = None) -> None:
        """A device's input sets join the pool (its worker has opened the backend). `owner` names
        this opening of the device: buffers of an earlier one never come back into the pool.
        `device_slots`: per set, its device memory (address, bytes per slot) for inputs filled on
        the card (`Backend.device_inputs`)."""
        buffers = [BatchBuffer(owner, i, a, device_slots[i] if device_slots else None)
                   for i, a in enumerate(arrays)]
        with self.lock:
            self._sealed[owner] = collections.deque()
            self._running[owner] = 0
            self._device_of[owner] = device or owner
            self._free.extend(buffers)
            self._work.notify_all()

    def remove_buffers(self, owner: str) -> list[BatchBuffer]:
        """A device leaves (its worker stops, fails or hangs). Returns its buffers that still held
        frames, whose tickets the caller must give up so post-processing does not wait for them."""
        with self.lock:
            self._free = collections.deque(b for b in self._free if b.owner != owner)
            for current in [b for b in self._open.values() if b.owner == owner]:
                if current.claimed:
                    self._seal(current)
                else:
                    del self._open[self._device_of[owner]]
            lost = list(self._sealed.pop(owner, ()))
            self._running.pop(owner, None)
            self._device_of.pop(owner, None)
            # A preparer may still be writing a claimed slot: the memory must not be freed before
            # it is done. Sealed, the buffer wakes us once it is complete.
            deadline = time.monotonic() + FILL_WAIT_S
            while any(not b.ready for b in lost) and (remaining := deadline - time.monotonic()) > 0:
                self._batches.wait(remaining)
            self._work.notify_all()
            self._batches.notify_all()
            return lost

    def set_down(self, device: str, down: bool) -> None:
        """`device` failed or restarts (True) or serves again (False): while any is down, the
        frames the others take are counted as rebalanced."""
        with self.lock:
            if down:
                self._down.add(device)
            else:
                self._down.discard(device)

    def _count_rebalanced(self, camera: str, buffer: BatchBuffer) -> None:
        self._rebalanced_camera[camera] += 1
        self._rebalanced_device[self._device_of.get(buffer.owner, buffer.owner)] += 1

    def rebalanced_to(self, device: str) -> int:
        """Frames `device` took on while a sibling was down."""
        with self.lock:
            return self._rebalanced_device[device]

    def rebalanced_of(self, camera: str) -> int:
        """Frames of `camera` that went to another device while one was down."""
        with self.lock:
            return self._rebalanced_camera[camera]

    def close(self) -> None:
        """Wake everyone for shutdown: preparers and workers return None from now on."""
        with self.lock:
            self._closed = True
            self._work.notify_all()
            self._batches.notify_all()

    # -- preparers -------------------------------------------------------------------------------
    def take(self, stop: threading.Event, idle_wait_s: float = 0.5
             ) -> tuple[Resized, BatchBuffer, int, float] | None:
        """The next picture (round-robin over cameras) and the slot to letterbox it into:
        (picture, buffer, slot, taken_mono). None when stopping, or after `idle_wait_s` of nothing."""
        with self.lock:
            waited = False
            while not (stop.is_set() or self._closed):
                found = self._next_frame()
                if found is not None:
                    frame, buffer = found
                    if self._down and self._queues[frame.camera].device is None:  # pinned: never moved
                        self._count_rebalanced(frame.camera, buffer)
                    return frame, buffer, self._claim(buffer), self._clock()
                if waited:
                    return None
                waited = not self._work.wait(idle_wait_s)
            return None

    def filled(self, buffer: BatchBuffer, slot: int, frame: Resized, geometry: Geometry | None,
               taken_mono: float) -> None:
        """A preparer wrote `frame` into `slot` (geometry None: it failed; the slot stays empty)."""
        meta = buffer.metas[slot]
        meta.camera, meta.seq = frame.camera, frame.seq
        meta.capture_time, meta.capture_mono, meta.taken_mono = frame.capture_time, frame.capture_mono, taken_mono
        meta.frame_time = frame.frame_time
        meta.geometry = geometry
        with self.lock:
            buffer.filled += 1
            if buffer.ready:
                self._batches.notify_all()

    def _next_frame(self) -> tuple[Resized, BatchBuffer] | None:
        """The next camera's frame (round-robin) that has a buffer to go into, and that buffer."""
        n = len(self._order)
        for k in range(n):
            queue = self._order[(self._next + k) % n]
            if not len(queue):
                continue
            buffer = self._buffer_for(queue.device)
            if buffer is None:
                continue
            frame = queue.get_nowait()
            if frame is not None:
                self._next = (self._next + k + 1) % n
                return frame, buffer
        return None

    def _buffer_for(self, device: str | None) -> BatchBuffer | None:
        """An open buffer for a frame (of any device, or of `device` for a pinned camera), else
        a free one opened: of the least loaded device (sealed + running batches), oldest first."""
        if device is not None:
            current = self._open.get(device)
            if current is not None:
                return current
            free = [b for b in self._free if self._device_of.get(b.owner) == device]
        else:
            if self._open:
                return next(iter(self._open.values()))
            free = [b for b in self._free if self._device_of.get(b.owner) not in self._open]
        if not free:
            return None
        best = min(free, key=lambda b: len(self._sealed[b.owner]) + self._running[b.owner])
        self._free.remove(best)
        self._open[self._device_of[best.owner]] = best
        return best

    def _claim(self, buffer: BatchBuffer) -> int:
        slot = buffer.claimed
        buffer.claimed += 1
        if slot == 0:
            buffer.opened_mono = self._clock()
            self._batches.notify_all()  # an idle worker starts its batch timeout now
        if buffer.claimed == buffer.capacity:
            self._seal(buffer)
        return slot

    def _seal(self, buffer: BatchBuffer) -> None:
        buffer.sealed = True
        buffer.ticket = next(self._tickets)
        self._sealed[buffer.owner].append(buffer)
        device = self._device_of.get(buffer.owner)
        if device is not None and self._open.get(device) is buffer:
            del self._open[device]
        self._batches.notify_all()

    # -- workers ---------------------------------------------------------------------------------
    def poll(self, owner: str, stop: threading.Event, idle_wait_s: float = 0.5) -> BatchBuffer | float | None:
        """The next batch for the device `owner`, without waiting (callers hold `lock`; the device's
        `scheduler.Scheduler` waits): a sealed buffer whose slots are all written, or how long to
        wait on the signal before asking again, or None: nothing more comes for `owner` (the
        batcher is closed, or `stop` is set and this device has nothing sealed or open). Seals the
        open buffer of this device once its batch timeout is over."""
        while not self._closed:
            sealed = self._sealed.get(owner)
            if sealed is None:
                return None
            if sealed and sealed[0].ready:
                self._running[owner] += 1
                return sealed.popleft()
            current = self._open.get(self._device_of.get(owner, owner))
            if not sealed and current is not None and current.owner == owner and current.claimed:
                wait = current.opened_mono + self.timeout_s - self._clock()
                if wait <= 0:
                    self._seal(current)
                    continue
                return float(wait)
            if stop.is_set() and not sealed:
                return None
            return float(idle_wait_s)
        return None

    def release(self, buffer: BatchBuffer) -> None:
        """The device has read the buffer (the run returned, or failed): it may be refilled."""
        with self.lock:
            buffer.reset()
            if buffer.owner in self._running:
                self._running[buffer.owner] -= 1
                self._free.append(buffer)
            self._work.notify_all()
