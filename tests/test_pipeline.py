"""Queues, batcher, preparers, device workers and post-processing, on the CPU with the synthetic
colour-meter model of tests/onnx_models.py (class 0 "red" scores the mean red of the input, class 1
"blue" the mean blue), run by the real ONNX Runtime backend."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from onnx_models import make_dynamic_batch_v8_model
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
from yoloedge.config import AcceleratorConfig, ModelConfig
from yoloedge.health.progress import ProgressTracker
from yoloedge.pipeline.batcher import Batcher
from yoloedge.pipeline.intake import CameraIntake
from yoloedge.pipeline.post import PostStage
from yoloedge.pipeline.prepare import Preparer
from yoloedge.pipeline.queues import FrameQueue, QueueClosed
from yoloedge.pipeline.worker import DeviceWorker, WorkerState
from yoloedge.pipeline.scheduler import Scheduler
from yoloedge.pipeline.served import ServedModel
from yoloedge.preprocess import Resizer, compute_geometry
from yoloedge.sources.frame import Frame

RED, BLUE = (0, 0, 255), (255, 0, 0)


def next_batch(batcher, owner, stop):
    """What a device worker serving one model takes next (its scheduler over this one batcher)."""
    job = Scheduler([batcher], owner).next_batch(stop)
    return None if job is None else job[1]


def frame(camera: str, seq: int, color=RED, size=(64, 64)) -> Frame:
    img = np.zeros((*size, 3), np.uint8)
    img[:] = color
    return Frame(camera, seq, img, time.time(), time.monotonic())


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- queues ------------------------------------------------------------------------------------
def test_keep_latest_queue_drops_the_oldest_and_counts():
    q = FrameQueue("a", 2, lossless=False)
    for i in range(5):
        assert q.put(frame("a", i))
    assert q.dropped == 3
    assert [q.get_nowait().seq, q.get_nowait().seq] == [3, 4]
    assert q.get_nowait() is None


def test_lossless_queue_blocks_until_room_and_loses_nothing():
    lock = threading.Lock()
    q = FrameQueue("a", 2, lossless=True, lock=lock)
    q.put(frame("a", 0))
    q.put(frame("a", 1))
    assert q.put(frame("a", 2), timeout=0.1) is False  # full: times out instead of dropping
    got = []

    def consume():
        for _ in range(3):
            time.sleep(0.05)
            with lock:
                got.append(q.get_nowait().seq)

    t = threading.Thread(target=consume)
    t.start()
    assert q.put(frame("a", 2), timeout=5.0) is True
    t.join()
    assert got == [0, 1, 2] and q.dropped == 0


def test_closing_a_lossless_queue_releases_a_blocked_reader():
    q = FrameQueue("a", 1, lossless=True)
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


# -- intake: the camera's sink ------------------------------------------------------------------
def test_intake_queues_the_resized_picture_and_recycles_dropped_buffers():
    q = FrameQueue("a", 2, lossless=False)
    intake = CameraIntake(q, Resizer(64, 64), ring=CameraIntake.ring_size(2, preparers=1))
    big = frame("a", 0, RED, size=(1080, 1920))
    seen = set()
    for i in range(50):  # nobody consumes: the queue overflows all the time
        assert intake(Frame("a", i, big.image, 0.0, 0.0), 0.1)
        seen.add(q._items[-1].image.ctypes.data)
    assert q.dropped == 48 and intake.grown == 0  # every dropped picture gave its buffer back
    assert len(seen) <= 4  # the ring: 2 queued + 1 preparer + 1 being resized, reused over and over
    assert [item.seq for item in q._items] == [48, 49]
    item = q.get_nowait()
    assert item.image.shape == (36, 64, 3) and item.geometry.src_w == 1920 and item.image[0, 0, 2] == 255


def test_intake_allocates_only_as_many_pictures_as_are_in_flight_at_once():
    """The ring is sized for the worst case (5 here), but a camera whose pictures are placed as
    fast as they come needs one: the buffer given back last is taken next, so no other is made."""
    q = FrameQueue("a", 2, lossless=False)
    intake = CameraIntake(q, Resizer(64, 64), ring=CameraIntake.ring_size(2, preparers=2))
    big = frame("a", 0, RED, size=(1080, 1920))
    seen = set()
    for i in range(20):  # a preparer that keeps up: each picture is placed before the next frame
        assert intake(Frame("a", i, big.image, 0.0, 0.0), 0.1)
        item = q.get_nowait()
        seen.add(item.image.ctypes.data)
        item.release()
    assert len(seen) == 1 and intake.buffers() == 1
    held = [intake(Frame("a", 100 + i, big.image, 0.0, 0.0), 0.1) and q.get_nowait() for i in range(3)]
    assert intake.buffers() == 3  # three in flight at once (two preparers and the queue): three buffers
    for item in held:
        item.release()
    assert intake.buffers() == 3 and intake.grown == 0


def test_intake_on_a_full_lossless_queue_returns_false_without_resizing():
    q = FrameQueue("a", 1, lossless=True)
    intake = CameraIntake(q, Resizer(64, 64), ring=3)
    assert intake(frame("a", 0), 0.1)
    free_before = len(intake._free)
    assert intake(frame("a", 1), 0.1) is False
    assert len(intake._free) == free_before and len(q) == 1  # nothing taken, nothing lost
    q.close()
    with pytest.raises(QueueClosed):
        intake(frame("a", 2), 0.1)


# -- batcher -----------------------------------------------------------------------------------
def buffers(n: int = 2, capacity: int = 4):
    return [np.zeros((capacity, 3, 8, 8), np.float32) for _ in range(n)]


def take_and_fill(batcher: Batcher, count: int) -> list:
    """What preparers do, without the letterbox: claim a slot, mark it written."""
    stop = threading.Event()
    taken = []
    for _ in range(count):
        job = batcher.take(stop, idle_wait_s=0.05)
        assert job is not None, f"nothing to take after {len(taken)}"
        f, buf, slot, t = job
        geometry = compute_geometry(64, 64, 8, 8)
        batcher.filled(buf, slot, f, geometry, t)
        taken.append((f.camera, f.seq, buf.index, slot))
    return taken


def test_batcher_fills_a_batch_fairly_across_cameras():
    b = Batcher(timeout_s=0.05)
    b.add_buffers("dev", buffers(1, capacity=4))
    qa, qb = b.add_camera("a", 10, False), b.add_camera("b", 10, False)
    for i in range(6):
        qa.put(frame("a", i))
    qb.put(frame("b", 0))
    taken = take_and_fill(b, 4)
    cams = [c for c, *_ in taken]
    assert cams.count("b") == 1, cams  # b is not starved by a's backlog
    assert [s for c, s, *_ in taken if c == "a"] == [0, 1, 2]  # per-camera order kept
    batch = next_batch(b, "dev", threading.Event())
    assert batch is not None and batch.claimed == 4
    assert [(m.camera, m.seq) for m in batch.metas] == [(c, s) for c, s, *_ in taken]


def test_a_full_batch_is_sealed_and_runs_without_waiting_for_the_timeout():
    clock = FakeClock()
    b = Batcher(timeout_s=3600, clock=clock)  # the clock never reaches the timeout
    b.add_buffers("dev", buffers(2, capacity=4))
    q = b.add_camera("a", 10, False)
    for i in range(4):
        q.put(frame("a", i))
    take_and_fill(b, 4)
    batch = next_batch(b, "dev", threading.Event())
    assert batch is not None and batch.claimed == 4 and batch.ticket == 0


def test_a_partial_batch_waits_for_the_timeout_on_the_injected_clock():
    clock = FakeClock()
    b = Batcher(timeout_s=0.2, clock=clock)
    b.add_buffers("dev", buffers(2, capacity=8))
    q = b.add_camera("a", 10, False)
    q.put(frame("a", 0))
    take_and_fill(b, 1)
    got = []
    t = threading.Thread(target=lambda: got.append(next_batch(b, "dev", threading.Event())), daemon=True)
    t.start()
    t.join(0.5)  # real time passes, the batch clock does not: it must still be waiting
    assert t.is_alive() and not got
    clock.t += 0.25  # the batch timeout is over
    t.join(5)
    assert got and got[0].claimed == 1


def test_a_sealed_batch_runs_only_once_every_claimed_slot_is_written():
    b = Batcher(timeout_s=0.01)
    b.add_buffers("dev", buffers(1, capacity=2))
    q = b.add_camera("a", 10, False)
    q.put(frame("a", 0))
    q.put(frame("a", 1))
    stop = threading.Event()
    first = b.take(stop)
    second = b.take(stop)  # the buffer is full now, hence sealed, but slot 0 is still being written
    f, buf, slot, t = second
    b.filled(buf, slot, f, compute_geometry(64, 64, 8, 8), t)
    got = []
    waiter = threading.Thread(target=lambda: got.append(next_batch(b, "dev", stop)), daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "ran a batch whose slot 0 was not written yet"
    f, buf, slot, t = first
    b.filled(buf, slot, f, compute_geometry(64, 64, 8, 8), t)
    waiter.join(5)
    assert got and got[0].filled == 2


def test_double_buffering_fills_the_next_batch_while_one_runs():
    b = Batcher(timeout_s=0.01)
    b.add_buffers("dev", buffers(2, capacity=2))
    q = b.add_camera("a", 10, False)
    for i in range(6):
        q.put(frame("a", i))
    take_and_fill(b, 2)
    running = next_batch(b, "dev", threading.Event())  # batch 1 is on the device now ...
    taken = take_and_fill(b, 2)  # ... and batch 2 fills the other input set meanwhile
    assert {idx for _, _, idx, _ in taken} == {1 - running.index}
    assert b.take(threading.Event(), idle_wait_s=0.05) is None, "a third batch without a free buffer"
    b.release(running)
    assert take_and_fill(b, 1)[0][2] == running.index  # the released set is filled again


def test_tickets_follow_the_order_batches_were_sealed_in():
    b = Batcher(timeout_s=0.01)
    b.add_buffers("dev", buffers(3, capacity=1))
    q = b.add_camera("a", 10, False)
    for i in range(3):
        q.put(frame("a", i))
    take_and_fill(b, 3)
    tickets = [next_batch(b, "dev", threading.Event()).ticket for _ in range(3)]
    assert tickets == [0, 1, 2]


def test_the_least_loaded_device_gets_the_next_buffer():
    b = Batcher(timeout_s=0.01)
    b.add_buffers("dev0", buffers(2, capacity=1))
    b.add_buffers("dev1", buffers(2, capacity=1))
    q = b.add_camera("a", 10, False)
    for i in range(4):
        q.put(frame("a", i))
    owners = []
    for _ in range(4):
        f, buf, slot, t = b.take(threading.Event())
        b.filled(buf, slot, f, compute_geometry(64, 64, 8, 8), t)
        owners.append(buf.owner)
    assert sorted(owners) == ["dev0", "dev0", "dev1", "dev1"]
    assert owners[0] != owners[1]  # the second batch goes to the idle device, not behind the first


def test_removing_a_camera_discards_its_frames():
    b = Batcher(timeout_s=0.01)
    q = b.add_camera("a", 5, False)
    q.put(frame("a", 0))
    q.put(frame("a", 1))
    assert b.remove_camera("a") == 2
    assert b.pending() == 0
    with pytest.raises(QueueClosed):
        q.put(frame("a", 2))


# -- workers, preparers and post-processing together --------------------------------------------
class FlakyBackend(OnnxRuntimeBackend):
    """The real ONNX Runtime backend; fails `fail_next` runs, can be held inside run()."""

    def __init__(self, path):
        super().__init__(path)
        self.fail_next = 0
        self.runs = 0
        self.hold = threading.Event()
        self.hold.set()

    def run(self, n, input_set=0, output_set=0):
        self.runs += 1
        self.hold.wait(30)
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("device error")
        return super().run(n, input_set, output_set)


@pytest.fixture()
def model(tmp_path):
    path = tmp_path / "dyn.onnx"
    make_dynamic_batch_v8_model(str(path), size=64, nc=2)
    return str(path)


class Published:
    """The sink post-processing publishes to: records (camera, seq, labels) in call order."""

    def __init__(self):
        self.items: list[tuple[str, int, list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, meta, dets, output_set):
        self.entered.set()
        self.gate.wait(30)
        labels = output_set.model.labels
        self.items.append((meta.camera, meta.seq, [labels[c] for c in dets.class_ids]))


class Pipeline:
    def __init__(self, model, backends, batch=4, max_errors=3, input_buffers=2, preparers=2, post_threads=2,
                 timeout_ms=20, model_config=None):
        self.batcher = Batcher(timeout_s=timeout_ms / 1000)
        self.published = Published()
        self.post = PostStage("test", self.published, max_threads=post_threads)
        self.tracker = ProgressTracker()
        acc = AcceleratorConfig(batch=batch, max_consecutive_errors=max_errors, inference_timeout_s=5,
                                input_buffers=input_buffers)
        cfg = model_config or ModelConfig(path=model, format="v8", labels=["red", "blue"], conf=0.1)
        self.workers = [DeviceWorker(f"test/{i}", acc, i, [ServedModel(cfg, self.batcher, self.post, lambda b=b: b)],
                                     self.tracker) for i, b in enumerate(backends)]
        self.post.start()
        for w in self.workers:
            w.start()
        for w in self.workers:
            assert w.ready.wait(30) and w.state is WorkerState.RUNNING, w.startup_error
        detector = self.workers[0].detector
        self.preparers = [Preparer(f"prep{i}", self.batcher, detector.new_letterboxer(), lambda *a: None)
                          for i in range(preparers)]
        for p in self.preparers:
            p.start()

    def camera(self, name, size, lossless=True):
        """The camera's queue and the sink a reader would write into (resize on the caller's thread)."""
        det = self.workers[0].detector
        queue = self.batcher.add_camera(name, size, lossless)
        return CameraIntake(queue, Resizer(det.input.height, det.input.width, det.style),
                            CameraIntake.ring_size(size, len(self.preparers)))

    def stop(self):
        for p in self.preparers:
            p.stop()
        for w in self.workers:
            w.stop()
        self.batcher.close()
        for t in (*self.preparers, *self.workers):
            t.join(10)
            assert not t.is_alive()
        assert self.post.stop(10)


def test_frames_are_letterboxed_run_and_published_each_with_its_own_answer(model):
    p = Pipeline(model, [FlakyBackend(model)])
    sink = p.camera("a", 20)
    for i in range(10):
        assert sink(frame("a", i, RED if i % 2 == 0 else BLUE), 5.0)
    wait_until(lambda: len(p.published.items) == 10, what="10 published frames")
    assert [s for _, s, _ in p.published.items] == list(range(10))
    for _, seq, labels in p.published.items:
        assert labels == (["red"] if seq % 2 == 0 else ["blue"]), (seq, labels)
    assert p.workers[0].stats.frames_done.total == 10
    p.stop()
    assert p.workers[0].state is WorkerState.STOPPED


def test_each_cameras_frames_are_published_in_order_across_devices(model):
    """Two devices, one slow: batches finish out of order, publishing still follows each camera."""
    fast, slow = FlakyBackend(model), FlakyBackend(model)
    real_run = slow.run

    def slow_run(n, input_set=0, output_set=0):
        time.sleep(0.05)
        return real_run(n, input_set, output_set)

    slow.run = slow_run
    p = Pipeline(model, [fast, slow], batch=2)
    sinks = {c: p.camera(c, 100) for c in ("a", "b", "c")}
    for i in range(20):
        for name, sink in sinks.items():
            assert sink(frame(name, i), 5.0)
    wait_until(lambda: len(p.published.items) == 60, what="60 published frames")
    for cam in ("a", "b", "c"):
        assert [s for c, s, _ in p.published.items if c == cam] == list(range(20)), cam
    assert fast.runs and slow.runs, "both devices ran batches"
    p.stop()


def test_a_slow_publisher_applies_back_pressure_with_bounded_memory(model):
    backend = FlakyBackend(model)
    p = Pipeline(model, [backend], batch=2, input_buffers=2, post_threads=1)
    backend.runs = 0  # not the warm-up
    p.published.gate.clear()  # the broker is "slow": the first publish blocks
    sink = p.camera("a", 40)
    q = sink.queue
    for i in range(30):
        assert sink(frame("a", i), 5.0)
    assert p.published.entered.wait(10)
    wait_until(lambda: backend.runs >= 3, what="every output set filled")
    time.sleep(0.3)  # time for a (wrong) fourth run or more frames to leave the queue
    # Held: 3 output sets (2 input buffers + 1) with 2 frames each, 2 input buffers of 2 frames
    # filled again behind them. Nothing else left the queue: memory is bounded by the buffers.
    taken_in = 30 - len(q)
    assert taken_in <= 3 * 2 + 2 * 2, taken_in
    assert backend.runs == 3, "ran a batch with no output set free"
    p.published.gate.set()
    wait_until(lambda: len(p.published.items) == 30, what="everything published after the stall")
    assert [s for _, s, _ in p.published.items] == list(range(30))
    p.stop()


def test_post_processing_adds_a_thread_when_a_batch_arrives_and_none_is_free(model):
    p = Pipeline(model, [FlakyBackend(model)], batch=1, post_threads=3)
    assert p.post.threads == 1
    p.published.gate.clear()  # the only thread is busy publishing frame 0 ...
    sink = p.camera("a", 10)
    sink(frame("a", 0), 5.0)
    assert p.published.entered.wait(10)
    sink(frame("a", 1), 5.0)  # ... so frame 1's batch gets a thread of its own, which decodes it
    wait_until(lambda: p.post.threads >= 2, what="a second post-processing thread")
    wait_until(lambda: len(p.post._ready) == 1, what="frame 1 decoded while frame 0 is published")
    p.published.gate.set()
    wait_until(lambda: len(p.published.items) == 2)
    assert [s for _, s, _ in p.published.items] == [0, 1]
    p.stop()


def test_failing_inferences_mark_the_worker_unhealthy_then_recover(model):
    backend = FlakyBackend(model)
    p = Pipeline(model, [backend], batch=1, max_errors=2)
    w = p.workers[0]
    backend.fail_next = 2
    sink = p.camera("a", 20)
    for i in range(2):
        sink(frame("a", i), 5.0)
    wait_until(lambda: w.stats.errors == 2, what="two failures")
    assert w.stats.frames_lost == 2
    assert any("failed in a row" in str(pr) and pr.source == "test/0" for pr in p.tracker.check())
    sink(frame("a", 2), 5.0)
    wait_until(lambda: len(p.published.items) == 1, what="the next frame published")
    assert [s for _, s, _ in p.published.items] == [2]
    assert p.tracker.check() == []  # recovered
    p.stop()


def test_a_model_that_cannot_load_is_reported_not_raised(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    batcher = Batcher(timeout_s=0.02)
    post = PostStage("t", lambda *a: None)
    w = DeviceWorker("test/0", AcceleratorConfig(), 0,
                     [ServedModel(ModelConfig(path=str(bad)), batcher, post, lambda: OnnxRuntimeBackend(str(bad)))],
                     ProgressTracker())
    w.start()
    assert w.ready.wait(10)
    w.join(5)
    assert w.state is WorkerState.FAILED and "bad.onnx" in w.startup_error


# -- no allocation per frame -----------------------------------------------------------------------
class Counter:
    """A sink that only counts (an MQTT message per frame is output, not the hot path)."""

    def __init__(self):
        self.count = 0

    def __call__(self, meta, dets, output_set):
        self.count += 1


def test_the_hot_path_allocates_nothing_per_frame(tmp_path):
    """Queue -> letterbox into an input set -> device -> output set -> decode + NMS, frame after
    frame, under tracemalloc (which sees NumPy's and OpenCV's array allocations too).

    The model is the demo model (320x320, 5 classes) behind the simulated device, which returns the
    model's real outputs for a real demo frame, so decode and NMS do their usual work. A per-frame
    copy of anything frame-sized would raise the peak above the bound -- the 1920x1080 frame
    (6.2 MB), an input slot (1.2 MB), the letterbox canvas (0.3 MB), a batch's outputs (0.3 MB) --
    and a leak of even 160 bytes per frame would show as growth. What is left are a few small
    transients: decode's per-anchor reductions (2100 floats) and NMS on the candidates."""
    import gc
    import tracemalloc

    import cv2

    from yoloedge.backends.simulated import SimulatedBackend
    from yoloedge.config.simulated import SimulatedConfig
    from yoloedge import demo

    cap = cv2.VideoCapture(str(demo.clip_path()))
    ok, shot = cap.read()
    cap.release()
    assert ok
    cv2.imwrite(str(tmp_path / "shot.png"), shot)
    model = str(demo.MODEL)
    backend = SimulatedBackend(model, SimulatedConfig(device_ms=(1.0, 0.2), image=str(tmp_path / "shot.png")))
    p = Pipeline(model, [backend], batch=4, post_threads=2, preparers=2, model_config=ModelConfig(path=model))
    counter = Counter()
    p.post.sink = counter
    image = cv2.resize(shot, (1920, 1080))  # one decoded frame, as a camera delivers it, reused
    sink = p.camera("a", 8)
    seq = 0

    def run(frames: int) -> None:
        nonlocal seq
        target = counter.count + frames
        for _ in range(frames):
            sink(Frame("a", seq, image, 0.0, time.monotonic()), 5.0)
            seq += 1
        wait_until(lambda: counter.count >= target, timeout=60, what=f"{frames} frames through")

    run(200)  # warm-up: threads started, lazy initialisation done
    gc.collect()
    tracemalloc.start()
    try:
        run(50)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run(400)
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    p.stop()
    assert after - before < 64 * 1024, f"memory grew by {after - before} bytes over 400 frames"
    assert peak - before < 256 * 1024, f"a transient allocation of {peak - before} bytes on the hot path"


def test_host_threads_run_below_the_device_worker(model):
    """Preparers and post-processing are host work: on a CPU device an inference's parallel loop
    must not be preempted by them (see yoloedge.threads), so they sit HOST_NICENESS below it."""
    import os

    from yoloedge.threads import HOST_NICENESS

    p = Pipeline(model, [FlakyBackend(model)], batch=1)
    sink = p.camera("a", 4)
    sink(frame("a", 0), 5.0)
    wait_until(lambda: len(p.published.items) == 1)
    worker_nice = os.getpriority(os.PRIO_PROCESS, p.workers[0].native_id)
    expected = min(19, worker_nice + HOST_NICENESS)
    for thread in p.preparers:
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == expected, thread.name
    post = [t for t in p.post._threads if t.is_alive()]
    assert post and all(os.getpriority(os.PRIO_PROCESS, t.native_id) == expected for t in post)
    p.stop()


def test_a_post_stage_that_cannot_start_a_thread_unqueues_the_batch(monkeypatch):
    """Out of threads (RLIMIT_NPROC, a container's pids limit): the caller gets the error and
    gives the batch up, so the stage must not keep it queued for a decoder that may start later."""
    post = PostStage("exhausted", lambda *a: None)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        post.skip(0)
    assert post.pending() == 0 and post.threads == 0
    monkeypatch.undo()
    post.skip(0)  # threads are back: the stage works again
    wait_until(lambda: post.pending() == 0, what="the skipped ticket handled")
    assert post.threads == 1
    assert post.stop(5)


def test_stopping_waits_for_post_processing_to_return_the_outputs_before_closing(model):
    """The arrays `run` returns are views of the backend's output memory (pinned host memory on
    TensorRT and Ascend): closing the device while post-processing still reads one would be a
    use-after-free. A normal stop stops workers before post-processing, so it must wait too."""

    class Recording(FlakyBackend):
        post_busy_at_close: list[bool] = []

        def close(self):
            self.post_busy_at_close.append(not p.published.gate.is_set())
            super().close()

    backend = Recording(model)
    p = Pipeline(model, [backend], batch=1, post_threads=1)
    p.published.gate.clear()  # post-processing holds the first output set inside publish
    sink = p.camera("a", 4)
    assert sink(frame("a", 0), 5.0)
    assert p.published.entered.wait(10)
    for prep in p.preparers:
        prep.stop()
    p.workers[0].stop()
    threading.Timer(0.5, p.published.gate.set).start()
    p.workers[0].join(20)
    assert not p.workers[0].is_alive()
    assert Recording.post_busy_at_close == [False], "closed while post-processing still held an output set"
    assert [s for _, s, _ in p.published.items] == [0]
    p.stop()


def test_worker_states_change_only_along_allowed_transitions():
    w = DeviceWorker("test/0", AcceleratorConfig(), 0,
                     [ServedModel(ModelConfig(path="unused.onnx"), Batcher(timeout_s=0.02), PostStage("t", lambda *a: None),
                                  lambda: OnnxRuntimeBackend("unused.onnx"))], ProgressTracker())
    with pytest.raises(RuntimeError, match="no transition from starting to restarting"):
        w._transition(WorkerState.RESTARTING)
    w._transition(WorkerState.RUNNING)
    with pytest.raises(RuntimeError, match="no transition from running to hung-wait"):
        w._transition(WorkerState.WAITING_FOR_HUNG)
    w._transition(WorkerState.BACKOFF)
    assert w.state is WorkerState.BACKOFF
