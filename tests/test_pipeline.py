"""Queues, batcher and device worker, on the CPU with a small synthetic model."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from onnx_models import make_dynamic_batch_v8_model
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
from yoloedge.config import AcceleratorConfig, ModelConfig
from yoloedge.health.progress import ProgressTracker
from yoloedge.pipeline.batcher import Batcher
from yoloedge.pipeline.frames import Frame
from yoloedge.pipeline.queues import FrameQueue, QueueClosed
from yoloedge.pipeline.worker import DeviceWorker


def frame(camera: str, seq: int, color=(0, 0, 255), size=(64, 64)) -> Frame:
    img = np.zeros((*size, 3), np.uint8)
    img[:] = color
    return Frame(camera, seq, img, time.time(), time.monotonic())


# -- queues ------------------------------------------------------------------------------------
def test_keep_latest_queue_drops_the_oldest_and_counts():
    q = FrameQueue("a", 2, lossless=False, wakeup=threading.Condition())
    for i in range(5):
        assert q.put(frame("a", i))
    assert q.dropped == 3
    assert [q.get_nowait().seq, q.get_nowait().seq] == [3, 4]
    assert q.get_nowait() is None


def test_lossless_queue_blocks_until_room_and_loses_nothing():
    cond = threading.Condition()
    q = FrameQueue("a", 2, lossless=True, wakeup=cond)
    q.put(frame("a", 0))
    q.put(frame("a", 1))
    assert q.put(frame("a", 2), timeout=0.1) is False  # full: times out instead of dropping
    got = []

    def consume():
        for _ in range(3):
            time.sleep(0.05)
            with cond:
                got.append(q.get_nowait().seq)

    t = threading.Thread(target=consume)
    t.start()
    assert q.put(frame("a", 2), timeout=2.0) is True
    t.join()
    assert got == [0, 1, 2] and q.dropped == 0


def test_closing_a_lossless_queue_releases_a_blocked_reader():
    q = FrameQueue("a", 1, lossless=True, wakeup=threading.Condition())
    q.put(frame("a", 0))
    errors = []

    def blocked():
        try:
            q.put(frame("a", 1))
        except QueueClosed as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    q.close()
    t.join(2)
    assert not t.is_alive() and len(errors) == 1


# -- batcher -----------------------------------------------------------------------------------
def test_batcher_fills_a_batch_fairly_across_cameras():
    b = Batcher(timeout_s=0.05)
    qa = b.add_camera("a", 10, False)
    qb = b.add_camera("b", 10, False)
    for i in range(6):
        qa.put(frame("a", i))
    qb.put(frame("b", 0))
    batch = b.next_batch(4, threading.Event())
    cams = [f.camera for f in batch]
    assert len(batch) == 4 and cams.count("b") == 1, cams  # b is not starved by a's backlog
    assert [f.seq for f in batch if f.camera == "a"] == [0, 1, 2]  # per-camera order kept


def test_batcher_returns_a_partial_batch_after_the_timeout():
    b = Batcher(timeout_s=0.2)
    q = b.add_camera("a", 10, False)
    q.put(frame("a", 0))
    t0 = time.monotonic()
    batch = b.next_batch(8, threading.Event())
    waited = time.monotonic() - t0
    assert len(batch) == 1
    assert 0.15 <= waited < 1.0


def test_batcher_returns_a_full_batch_without_waiting():
    b = Batcher(timeout_s=5.0)
    q = b.add_camera("a", 10, False)
    for i in range(4):
        q.put(frame("a", i))
    t0 = time.monotonic()
    assert len(b.next_batch(4, threading.Event())) == 4
    assert time.monotonic() - t0 < 0.5


def test_batcher_idle_and_stop():
    b = Batcher(timeout_s=0.01)
    b.add_camera("a", 2, False)
    t0 = time.monotonic()
    assert b.next_batch(4, threading.Event(), idle_wait_s=0.1) == []
    assert time.monotonic() - t0 < 1.0
    stop = threading.Event()
    stop.set()
    assert b.next_batch(4, stop, idle_wait_s=0.1) == []


def test_removing_a_camera_discards_its_frames():
    b = Batcher(timeout_s=0.01)
    q = b.add_camera("a", 5, False)
    q.put(frame("a", 0))
    q.put(frame("a", 1))
    assert b.remove_camera("a") == 2
    assert b.depth() == 0
    with pytest.raises(QueueClosed):
        q.put(frame("a", 2))


# -- device worker -----------------------------------------------------------------------------
class FlakyBackend(OnnxRuntimeBackend):
    """Fails `fail_next` runs, then works; counts runs."""

    def __init__(self, path):
        super().__init__(path)
        self.fail_next = 0
        self.runs = 0

    def run(self, n):
        self.runs += 1
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("device error")
        return super().run(n)


@pytest.fixture()
def model(tmp_path):
    path = tmp_path / "dyn.onnx"
    make_dynamic_batch_v8_model(str(path), size=64, nc=2)
    return str(path)


def start_worker(model, backend, batch=4, max_errors=3):
    batcher = Batcher(timeout_s=0.02)
    results = queue.Queue()
    tracker = ProgressTracker()
    acc = AcceleratorConfig(batch=batch, max_consecutive_errors=max_errors, inference_timeout_s=5)
    cfg = ModelConfig(path=model, format="v8", labels=["red", "blue"], conf=0.1)
    w = DeviceWorker("test/0", acc, 0, cfg, batcher, results, tracker, lambda: backend)
    w.start()
    assert w.ready.wait(30) and w.state == "running", w.startup_error
    return w, batcher, results, tracker


def test_worker_runs_batches_and_hands_them_to_post_processing(model):
    backend = FlakyBackend(model)
    w, batcher, results, _ = start_worker(model, backend)
    q = batcher.add_camera("a", 10, True)
    for i in range(4):
        q.put(frame("a", i, color=(0, 0, 255) if i % 2 == 0 else (255, 0, 0)))
    item = results.get(timeout=10)
    assert [f.seq for f in item.frames] == [0, 1, 2, 3]
    dets = item.worker.detector.postprocess(item.outputs, item.geometries)
    item.release()
    labels = [[item.worker.detector.labels[c] for c in d.class_ids] for d in dets]
    assert labels[0] == ["red"] and labels[1] == ["blue"]  # each frame its own answer
    w.stop()
    w.join(5)
    assert not w.is_alive() and w.state == "stopped"


def test_full_output_ring_applies_back_pressure(model):
    backend = FlakyBackend(model)
    w, batcher, results, _ = start_worker(model, backend, batch=1)
    q = batcher.add_camera("a", 20, True)
    for i in range(8):
        q.put(frame("a", i))
    time.sleep(1.0)
    # Nobody releases the slots: the worker stops after filling its ring of 3.
    assert results.qsize() == 3
    assert len(q) == 8 - 3 - 1 or len(q) == 8 - 3  # one batch may be waiting for a slot
    while not results.empty():
        results.get().release()
    deadline = time.monotonic() + 5
    seen = 3
    while seen < 8 and time.monotonic() < deadline:
        try:
            results.get(timeout=0.5).release()
            seen += 1
        except queue.Empty:
            pass
    assert seen == 8
    w.stop()
    w.join(5)


def test_failing_inferences_mark_the_worker_unhealthy_then_recover(model):
    backend = FlakyBackend(model)
    w, batcher, results, tracker = start_worker(model, backend, batch=1, max_errors=2)
    backend.fail_next = 2
    q = batcher.add_camera("a", 20, True)
    for i in range(2):
        q.put(frame("a", i))
    deadline = time.monotonic() + 5
    while w.errors < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.errors == 2 and w.frames_lost == 2
    assert any("failed in a row" in p for p in tracker.check())
    q.put(frame("a", 2))
    item = results.get(timeout=5)
    item.release()
    assert [f.seq for f in item.frames] == [2]
    assert tracker.check() == []  # recovered
    assert w.is_alive()
    w.stop()
    w.join(5)


def test_a_model_that_cannot_load_is_reported_not_raised(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    batcher = Batcher(timeout_s=0.02)
    acc = AcceleratorConfig()
    w = DeviceWorker("test/0", acc, 0, ModelConfig(path=str(bad)), batcher, queue.Queue(), ProgressTracker(),
                     lambda: OnnxRuntimeBackend(str(bad)))
    w.start()
    assert w.ready.wait(10)
    w.join(5)
    assert w.state == "failed" and "bad.onnx" in w.startup_error
