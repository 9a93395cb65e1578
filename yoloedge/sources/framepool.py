"""Frame-sized buffers the cameras of a process share: OpenCV captures convert their frames into them.

An OpenCV capture decodes a frame in `grab()` and converts it to BGR only when asked
(`retrieve(out)`), copying the result into the array it is given. A camera sampled down to a few
frames a second holds its BGR frame only while its sink resizes it (and, when the camera is
watched, copies it for the snapshots): a few milliseconds, on the reader's own thread. An array
per camera would cost a whole frame per camera (6.2 MB at 1080p) for that; taken from a pool for
those moments and given back at once, a handful of buffers serve every camera of the same size.

The pool never makes a reader wait: with no idle buffer of the shape asked for, it allocates one.
A reader whose lossless queue is full holds its buffer until there is room; the pool then simply
has one buffer more in use. What it keeps idle is bounded: per shape, at most as many buffers as
were in use at once at the busiest moment of the current or the previous window (WINDOW_TAKES
takes in all). So a burst -- many cameras holding buffers at once, as cameras started together
and keeping the same frames of the same clip do -- is let go once it has passed, and shapes no
camera asks for any more (a camera removed or changed its resolution) are let go after two windows.

Each buffer is a memory mapping of its own, so one let go is given back to the system at once.
An array from malloc would not be: glibc serves a 6.2 MB request from a thread's arena once a
chunk that size has been freed (its mmap threshold rises with every freed mapping, up to 32 MB),
and then keeps the freed chunk. Measured with 8 cameras started together (`bench memory`): up
to 7 buffers are in use at the first frames, 1 to 4 afterwards; from malloc, the ones no longer
needed stayed resident (25.3 MB per camera for an H.264 clip, against 19.8-21.7 MB with buffers
mapped on their own, which are gone two windows after the burst).
Mappings are not madvised for huge pages, so a buffer is the 4 kB pages its bytes need.

Thread-safe; the lock is a leaf (nothing is called while it is held; allocation happens outside it).
"""

from __future__ import annotations

import mmap
import threading
from dataclasses import dataclass, field

import numpy as np

#: takes (of every shape together) per window of the idle bound; at 8 cameras keeping 5 frames a
#: second each, a window is under a second. A buffer allocated again costs a mapping and its page
#: faults (about a millisecond at 1080p), so a short window costs next to nothing, and a burst's
#: buffers are given back soon after it.
WINDOW_TAKES = 32

Shape = tuple[int, ...]


@dataclass
class _Shelf:
    """The buffers of one shape."""

    idle: list[np.ndarray] = field(default_factory=list)
    in_use: int = 0
    peak: int = 0  # most in use at once in this window
    last_peak: int = 0  # ... in the previous window

    def keep(self) -> int:
        """How many idle buffers to keep."""
        return max(self.peak, self.last_peak)


class FramePool:
    """uint8 buffers by shape (see the module docstring). `take()` lends one, `give()` takes it back."""

    def __init__(self, window_takes: int = WINDOW_TAKES):
        if window_takes < 1:
            raise ValueError("window_takes is at least 1")
        self._window = window_takes
        self._lock = threading.Lock()
        self._shelves: dict[Shape, _Shelf] = {}
        self._takes = 0  # in this window
        self.allocated = 0  # buffers allocated so far, for status and tests
        self.let_go = 0  # buffers given back that were not kept

    def take(self, shape: Shape) -> np.ndarray:
        """A buffer of `shape`: an idle one, else a new one (never waits)."""
        key = tuple(int(v) for v in shape)
        with self._lock:
            shelf = self._shelves.get(key)
            if shelf is None:
                shelf = self._shelves[key] = _Shelf()
            shelf.in_use += 1
            shelf.peak = max(shelf.peak, shelf.in_use)
            buffer = shelf.idle.pop() if shelf.idle else None
            if buffer is None:
                self.allocated += 1
            self._takes += 1
            if self._takes >= self._window:
                self._next_window()
        return buffer if buffer is not None else allocate(key)

    def give(self, buffer: np.ndarray) -> None:
        """Back from use: kept idle for the next take of its shape, or let go (see the module
        docstring). The caller must not touch it afterwards."""
        with self._lock:
            shelf = self._shelves.get(tuple(buffer.shape))
            if shelf is None or shelf.in_use == 0:
                return  # not one of ours
            shelf.in_use -= 1
            if len(shelf.idle) < shelf.keep():
                shelf.idle.append(buffer)
            else:
                self.let_go += 1

    def clear(self) -> int:
        """Let every idle buffer go now (cameras were removed); buffers in use come back as usual.
        Returns how many were let go."""
        with self._lock:
            freed = sum(len(shelf.idle) for shelf in self._shelves.values())
            for shelf in self._shelves.values():
                shelf.idle.clear()
                shelf.peak = shelf.last_peak = shelf.in_use
            self._drop_unused()
            self.let_go += freed
        return freed

    def idle(self, shape: Shape | None = None) -> int:
        """Idle buffers (of `shape`, or of every shape)."""
        with self._lock:
            shelves = self._shelves.values() if shape is None else [self._shelves.get(tuple(shape), _Shelf())]
            return sum(len(shelf.idle) for shelf in shelves)

    def in_use(self) -> int:
        with self._lock:
            return sum(shelf.in_use for shelf in self._shelves.values())

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for shelf in self._shelves.values() for b in shelf.idle)

    def _next_window(self) -> None:
        """Under the lock: this window's peaks become the previous ones; idle buffers over the new
        bound are let go."""
        self._takes = 0
        for shelf in self._shelves.values():
            shelf.last_peak, shelf.peak = shelf.peak, shelf.in_use
            extra = len(shelf.idle) - shelf.keep()
            if extra > 0:
                del shelf.idle[shelf.keep():]
                self.let_go += extra
        self._drop_unused()

    def _drop_unused(self) -> None:
        self._shelves = {key: shelf for key, shelf in self._shelves.items()
                         if shelf.idle or shelf.in_use or shelf.keep()}


def allocate(shape: Shape) -> np.ndarray:
    """A uint8 array of `shape` in a private anonymous mapping of its own: unmapped (its memory
    back to the system) when the last reference to it goes."""
    size = int(np.prod(shape, dtype=np.int64))
    if size <= 0:
        return np.empty(shape, np.uint8)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    return np.frombuffer(mapping, np.uint8).reshape(shape)
