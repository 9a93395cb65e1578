"""Full frames held from the reader until their result, for the cameras whose events may want a
best shot.

By the time a frame's detections reach the router its full image is gone: the reader's buffer is
lent to the next read once the camera's sink returns, and only the letterboxed model input went
on (see `sources.framepool`, `pipeline.intake`). An event's best shot is decided only then,
after tracking, so a frame that might become one has to be kept from the reader's side.

A camera is *wanted* while the tracking stage saw objects in its last frame (candidates or live
tracks): only then can a frame become a best shot. A lossless file (`realtime: false`) is wanted
whenever its events have snapshots: its reader runs ahead of the router by more frames than an
event needs to be confirmed, so frames offered before the router saw the first object could be
the ones an event's best shot falls on. While wanted, the reader copies each frame into
one of `depth` frame-sized buffers the camera owns (allocated once per frame size, never per
frame; a 1080p copy costs about half a millisecond); the router finds it by (seq, capture time)
and lets it and every older one go once the frame's sinks have run. A camera fed to several
models (`models`) gets one result per frame and model, each model's in its own frame order but
not in step with one another: a kept frame goes once every model of the camera is done with it
(each model's `done` lets go of its frames up to that one), so the slower model's best shot still
finds its frame; the camera is wanted while any of its models saw objects. With every buffer held by
frames still in flight, a live camera's frame is not kept (counted in `missed`): its best shot, if
it was one, is skipped, and the next one is taken. A lossless file (`realtime: false`) has more
frames in flight than buffers, and nothing to lose by waiting (its reader waits for the queue
anyway): its reader waits for a buffer to come back, so every frame is kept. The reader hands a
frame over in slices of its sink's timeout (to honour stop); a slice that found no buffer returns
False so the reader offers the same frame again, and a frame already kept is not kept twice. A
camera not wanted for `FREE_AFTER_S` frees its buffers.

A kept frame is scaled down to fit SHOT_MAX_SIDE pixels on its long side (960x540 from 1080p or
4K), enough for an event's picture: full 1080p copies cost a camera up to 18.7 MB while objects
are in view, 1280x720 ones still 4.6 MB per camera measured (`bench memory`, 8 cameras), against
the 20-30 MB a decoded 1080p camera costs in all (docs/benchmarks.md, "Memory per camera").

Memory: up to `depth` pictures per camera while objects are in view (1.6 MB each from 1080p;
usually one or two are in flight at once), none otherwise.

Threads: the reader thread offers, the router's threads (one per model's post-processing) find
and release; `_Kept.lock` guards a camera's slots, its models and what each saw last (a leaf).
The table of cameras is replaced whole, read without a lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import cv2
import numpy as np

from ..sources.frame import Frame, FrameSink

#: frames held at once per camera: a live camera has about its queue (2) plus the frame being
#: inferred in flight between the reader and the router
DEFAULT_DEPTH = 3
#: a camera without objects this long frees its buffers
FREE_AFTER_S = 10.0
#: the long side of a kept picture, at most (larger frames are scaled down to it)
SHOT_MAX_SIDE = 960


def kept_shape(shape: tuple[int, ...], max_side: int = SHOT_MAX_SIDE) -> tuple[int, ...]:
    """The shape a frame of `shape` is kept at: scaled to fit `max_side`, aspect kept."""
    height, width = shape[0], shape[1]
    scale = min(1.0, max_side / max(width, height, 1))
    if scale >= 1.0:
        return shape
    return (max(1, round(height * scale)), max(1, round(width * scale)), *shape[2:])


@dataclass
class _Slot:
    buffer: np.ndarray | None = None
    key: tuple[int, float] | None = None  # (seq, capture_mono) of the frame it holds; None: free
    waiting: set[str] = field(default_factory=set)  # models not yet done with it (several models)


@dataclass
class _Kept:
    slots: list[_Slot]
    wait: bool = False  # a lossless camera: the reader waits for a free buffer
    #: the models the camera's frames go to (`models`); fewer than two: the first `done` frees
    models: frozenset[str] = frozenset()
    lock: threading.Lock = field(default_factory=threading.Lock)
    freed: threading.Condition = field(init=False)
    #: router thread writes, reader thread reads; a camera starts wanted (objects may be in
    #: view), its first frames' results say whether it stays so
    wanted: bool = True
    in_view: dict[str, bool] = field(default_factory=dict)  # per model: objects in its last frame
    unwanted_since: float = 0.0  # reader thread only
    kept: int = 0
    missed: int = 0
    allocations: int = 0

    def __post_init__(self) -> None:
        self.freed = threading.Condition(self.lock)


class FrameKeeper:
    def __init__(self, depth: int = DEFAULT_DEPTH, clock: Callable[[], float] = time.monotonic):
        self.depth = depth
        self._clock = clock
        self._cameras: dict[str, _Kept] = {}

    def add(self, camera: str, wait: bool = False) -> None:
        if camera not in self._cameras:
            self._cameras = {**self._cameras, camera: _Kept([_Slot() for _ in range(self.depth)], wait)}

    def models(self, camera: str, models: Sequence[str]) -> None:
        """The models `camera`'s frames go to (when it is configured, and on every reload): a kept
        frame goes once each of them is `done` with it. A model no longer listed is done with
        every frame it held."""
        kept = self._cameras.get(camera)
        if kept is None:
            return
        with kept.lock:
            kept.models = frozenset(models)
            kept.in_view = {m: v for m, v in kept.in_view.items() if m in kept.models or not m}
            for slot in kept.slots:
                slot.waiting &= kept.models
                if slot.key is not None and not slot.waiting and len(kept.models) > 1:
                    slot.key = None
            kept.freed.notify_all()

    def forget(self, camera: str) -> None:
        self._cameras = {name: kept for name, kept in self._cameras.items() if name != camera}

    def tap(self, camera: str, sink: FrameSink, wait: bool = False) -> FrameSink:
        """`sink` with the frame kept first when the camera is wanted; `wait` (lossless files):
        for a free buffer, within the sink's timeout."""
        self.add(camera, wait)

        def tapped(frame: Frame, timeout_s: float) -> bool:
            return self.offer(frame, timeout_s) and sink(frame, timeout_s)

        return tapped

    # -- the reader's side -------------------------------------------------------------------
    def offer(self, frame: Frame, timeout_s: float = 0.0) -> bool:
        """Keep `frame` if its camera is wanted. False only for a lossless camera that found no
        free buffer within `timeout_s`: offer the same frame again (a live camera's frame is
        counted as missed instead)."""
        kept = self._cameras.get(frame.camera)
        if kept is None:
            return True
        if not kept.wanted:
            self._maybe_free(kept)
            return True
        kept.unwanted_since = 0.0
        image, key = frame.host_image(), (frame.seq, frame.capture_mono)
        with kept.lock:
            if any(s.key == key for s in kept.slots):
                return True  # kept by an earlier slice; the sink refused it then
            slot = next((s for s in kept.slots if s.key is None), None)
            if slot is None and kept.wait:
                if timeout_s > 0:
                    kept.freed.wait_for(lambda: any(s.key is None for s in kept.slots), timeout_s)
                slot = next((s for s in kept.slots if s.key is None), None)
                if slot is None:
                    return False
            if slot is None:
                kept.missed += 1
                return True
            shape = kept_shape(image.shape)
            if slot.buffer is None or slot.buffer.shape != shape or slot.buffer.dtype != image.dtype:
                slot.buffer = np.empty(shape, image.dtype)
                kept.allocations += 1
            if shape == image.shape:
                np.copyto(slot.buffer, image)
            else:
                cv2.resize(image, (shape[1], shape[0]), dst=slot.buffer, interpolation=cv2.INTER_AREA)
            slot.key = key
            slot.waiting.clear()  # reused, as the buffer is: nothing allocated per kept frame
            if len(kept.models) > 1:
                slot.waiting.update(kept.models)
            kept.kept += 1
        return True

    def _maybe_free(self, kept: _Kept) -> None:
        now = self._clock()
        if not kept.unwanted_since:
            kept.unwanted_since = now
            return
        if now - kept.unwanted_since < FREE_AFTER_S:
            return
        with kept.lock:
            for slot in kept.slots:
                if slot.key is None:
                    slot.buffer = None

    # -- the router's side -------------------------------------------------------------------
    def want(self, camera: str, snapshots: bool, in_view: bool, model: str | None = None) -> None:
        """Whether `camera`'s next frames are kept: its events take snapshots, and objects are in
        view of any of its models (a lossless camera: always, see the module's docstring).
        `model` None (the camera is (re)configured): it starts over, wanted while `in_view`."""
        kept = self._cameras.get(camera)
        if kept is None:
            return
        with kept.lock:  # the models' results come on their own threads
            if model is None:
                kept.in_view = {}
                kept.wanted = snapshots and (in_view or kept.wait)
                return
            kept.in_view[model] = in_view
            kept.wanted = snapshots and (kept.wait or any(kept.in_view.values()))

    def find(self, camera: str, seq: int, capture_mono: float) -> np.ndarray | None:
        """Frame `seq` of `camera` (scaled to SHOT_MAX_SIDE), valid until `done` for it; None when
        not kept."""
        kept = self._cameras.get(camera)
        if kept is None:
            return None
        with kept.lock:
            for slot in kept.slots:
                if slot.key == (seq, capture_mono):
                    return slot.buffer
        return None

    def done(self, camera: str, capture_mono: float, model: str = "") -> None:
        """`model`'s result of the frame captured at `capture_mono` is routed: it and every older
        frame go (frames dropped in the pipeline never reach the router), once every model of the
        camera is done with them. A model the camera is not known to have (one model, or `models`
        not set) frees them at once, as a single model does: a frame is never held for a result
        that cannot come."""
        kept = self._cameras.get(camera)
        if kept is None:
            return
        with kept.lock:
            several = len(kept.models) > 1 and model in kept.models
            for slot in kept.slots:
                if slot.key is None or slot.key[1] > capture_mono:
                    continue
                slot.waiting.discard(model)
                if not several or not slot.waiting:
                    slot.key = None
                    slot.waiting.clear()
            kept.freed.notify_all()

    def stats(self, camera: str) -> dict:
        kept = self._cameras.get(camera)
        if kept is None:
            return {}
        with kept.lock:
            held = sum(s.buffer.nbytes for s in kept.slots if s.buffer is not None)
        return {"frames_kept": kept.kept, "frames_missed": kept.missed, "bytes": held}
