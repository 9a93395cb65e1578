"""Pinned cameras in the batcher: a camera whose pictures live in one card's memory (`decoder:
dvpp`) has its frames put only into that card's input sets, each card may have a buffer open at
once, and unpinned cameras still go anywhere. No threads: take/poll are called directly on a
clock the test moves."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from yoloedge.pipeline.batcher import Batcher
from yoloedge.pipeline.intake import Resized


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _frame(camera: str, seq: int) -> Resized:
    return Resized(weakref.ref(_frame), camera=camera, seq=seq)


def _batcher(capacity: int = 2) -> tuple[Batcher, Clock]:
    clock = Clock()
    batcher = Batcher(0.05, clock=clock)
    for device in ("npu/0", "npu/1"):
        batcher.add_buffers(f"{device}#1", [np.zeros((capacity, 4), np.uint8) for _ in range(2)], device=device,
                            device_slots=[(0x1000, 4), (0x2000, 4)])
    return batcher, clock


def _take_all(batcher: Batcher) -> list[tuple[str, str]]:
    stop = threading.Event()
    got = []
    while (job := batcher.take(stop, idle_wait_s=0.0)) is not None:
        frame, buffer, slot, taken = job
        batcher.filled(buffer, slot, frame, None, taken)
        got.append((frame.camera, buffer.owner))
    return got


def test_pinned_frames_go_only_to_their_device_and_both_devices_fill_at_once():
    batcher, _ = _batcher(capacity=4)
    a = batcher.add_camera("a", 8, lossless=True, device="npu/0")
    b = batcher.add_camera("b", 8, lossless=True, device="npu/1")
    for seq in range(3):
        a.put(_frame("a", seq), 0)
        b.put(_frame("b", seq), 0)
    got = _take_all(batcher)
    assert sorted(got) == sorted([("a", "npu/0#1")] * 3 + [("b", "npu/1#1")] * 3)
    # neither batch is full: each device has its own open buffer, sealed by its own worker's timeout
    stop = threading.Event()
    with batcher.lock:
        assert isinstance(batcher.poll("npu/0#1", stop), float)
    batcher._clock.now += 1.0  # type: ignore[attr-defined]
    with batcher.lock:
        first, second = batcher.poll("npu/0#1", stop), batcher.poll("npu/1#1", stop)
    assert first.owner == "npu/0#1" and [m.camera for m in first.metas[:first.claimed]] == ["a"] * 3
    assert second.owner == "npu/1#1" and [m.camera for m in second.metas[:second.claimed]] == ["b"] * 3
    assert first.device_slots == (0x1000, 4)


def test_a_pinned_camera_waits_while_its_device_is_gone_and_others_go_on():
    batcher, _ = _batcher(capacity=2)
    a = batcher.add_camera("a", 8, lossless=True, device="npu/0")
    free = batcher.add_camera("free", 8, lossless=True)
    batcher.remove_buffers("npu/0#1")
    a.put(_frame("a", 0), 0)
    free.put(_frame("free", 0), 0)
    assert _take_all(batcher) == [("free", "npu/1#1")]
    assert len(a) == 1  # still queued: no other card can read its picture
    assert batcher.pending() == 2


def test_unpinned_cameras_share_one_open_buffer_as_before():
    batcher, _ = _batcher(capacity=4)
    q = batcher.add_camera("x", 8, lossless=True)
    r = batcher.add_camera("y", 8, lossless=True)
    for seq in range(2):
        q.put(_frame("x", seq), 0)
        r.put(_frame("y", seq), 0)
    owners = {owner for _, owner in _take_all(batcher)}
    assert len(owners) == 1  # one batch of four, not two half batches
