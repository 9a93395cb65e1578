"""Several models in one accelerator group (issue 19): each camera's frames go to its own models,
each model letterboxes to its own input size and batches on its own, one device worker runs them
all, fairly, and a model that cannot be loaded leaves the others running.

Real ONNX Runtime on two real models of different input sizes (YOLOv8n at 640, YOLOX-nano at 416),
checked against the references their upstream code made (`../shared/testdata/reference`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import cv2
import numpy as np
import pytest

from parity import mismatches
from yoloedge.config.model import ModelConfig
from yoloedge.config.schema import AcceleratorConfig
from yoloedge.daemon.status import WorkerStatus
from yoloedge.health.progress import ProgressTracker
from yoloedge.pipeline.batcher import Batcher, BatchSignal
from yoloedge.pipeline.feed import CameraFeed
from yoloedge.pipeline.groups import AcceleratorGroup
from yoloedge.pipeline.intake import CameraIntake
from yoloedge.pipeline.queues import FrameQueue
from yoloedge.pipeline.scheduler import Scheduler
from yoloedge.pipeline.worker import WorkerState
from yoloedge.preprocess import Resizer
from yoloedge.sources.frame import Frame
from yoloedge.web.metrics import model_metrics

V8, YOLOX = "yolov8n_coco_int8.onnx", "yolox_nano_coco_416.onnx"
IMAGES = ("bus", "zidane")


class Collected:
    """Post-processing's sink: what each (camera, model) got, frame by frame."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: dict[tuple[str, str], dict[int, list[dict]]] = defaultdict(dict)

    def __call__(self, meta, dets, output_set) -> None:
        with self.lock:
            self.got[(meta.camera, output_set.model.name)][meta.seq] = dets.to_dicts(output_set.model.labels)

    def count(self) -> int:
        with self.lock:
            return sum(len(frames) for frames in self.got.values())


def start_group(model_configs, sink, devices=(0,), batch=2) -> AcceleratorGroup:
    acc = AcceleratorConfig(backend="onnxruntime", devices=devices, batch=batch, batch_timeout_ms=5,
                            name="cpu0", preprocess_threads=2, post_threads=2)
    group = AcceleratorGroup("cpu0", acc, model_configs, ProgressTracker(), sink)
    group.start()
    group.wait_ready(threading.Event())
    return group


def stop_group(group: AcceleratorGroup) -> None:
    group.stop_preparers(5)
    group.stop_workers(10)
    group.stop_post(5)


def feed_frames(feeds: dict[str, CameraFeed], images: list[np.ndarray]) -> None:
    """Every image to every camera, lossless: each feed is retried until every model took it."""
    for seq, image in enumerate(images):
        for camera, feed in feeds.items():
            frame = Frame(camera, seq, image, 1.7e9 + seq, float(seq))
            deadline = time.monotonic() + 30
            while not feed(frame, 0.25):
                assert time.monotonic() < deadline, f"{camera} frame {seq} never taken"


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def reference(references, model: str, image: str) -> list[dict]:
    path = references / f"{model[:-5]}__{image}__conf25_iou45.json"
    return json.loads(path.read_text())["detections"]


@pytest.mark.shared
def test_two_models_of_different_sizes_each_give_their_upstream_boxes_to_the_cameras_routed_to_them(
        models, media, references):
    sink = Collected()
    coco = ModelConfig(path=str(models / V8), name="coco")
    nano = ModelConfig(path=str(models / YOLOX), name="nano")
    group = start_group([coco, nano], sink, batch=2)
    try:
        assert [w.state for w in group.workers] == [WorkerState.RUNNING]
        assert (group.detector_of("coco").input.height, group.detector_of("nano").input.height) == (640, 416)
        feeds = {"door": group.add_camera("door", 4, True, ["coco"]),
                 "yard": group.add_camera("yard", 4, True, ["nano"]),
                 "gate": group.add_camera("gate", 4, True, None)}  # every model of the group
        assert {name: list(feed.intakes) for name, feed in feeds.items()} == {
            "door": ["coco"], "yard": ["nano"], "gate": ["coco", "nano"]}
        images = [cv2.imread(str(media / f"{name}.jpg")) for name in IMAGES] * 3
        feed_frames(feeds, images)
        wait_for(lambda: sink.count() == 4 * len(images), 120, "every frame of every (camera, model)")
        assert set(sink.got) == {("door", "coco"), ("yard", "nano"), ("gate", "coco"), ("gate", "nano")}
        for (camera, name), frames in sink.got.items():
            assert sorted(frames) == list(range(len(images))), (camera, name)
            model = V8 if name == "coco" else YOLOX
            for seq, dets in frames.items():
                problems = mismatches(dets, reference(references, model, IMAGES[seq % 2]))
                assert not problems, f"{camera} {name} frame {seq}: {problems}"
        worker = group.workers[0].status()
        assert [m["name"] for m in worker["models"]] == ["coco", "nano"]
        assert all(m["state"] == "running" and m["batches"] > 0 for m in worker["models"])
        # the 640 model's input sets are (640/416)^2 the 416 one's: memory is per model
        memory = {m["name"]: m["memory"]["host_bytes"] for m in worker["models"]}
        assert memory["coco"] > memory["nano"] > 0
        families = {f.name: f for f in model_metrics([WorkerStatus("cpu0", 0, "running", True, worker)])}
        batches = {s.labels["model"]: s.value for s in families["yoloedge_model_batches"].samples}
        assert batches == {m["name"]: m["batches"] for m in worker["models"]}
        host = {s.labels["model"]: s.value for s in families["yoloedge_model_memory_bytes"].samples
                if s.labels["kind"] == "host"}
        assert host == memory
        # each model's frames were letterboxed to its own size, by its own resizer
        assert feeds["gate"].intakes["coco"].resizer is not feeds["gate"].intakes["nano"].resizer
        assert feeds["gate"].dropped == 0
    finally:
        stop_group(group)


@pytest.mark.shared
def test_a_model_that_cannot_be_loaded_leaves_the_other_running(models, media, references, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model at all")
    sink = Collected()
    group = start_group([ModelConfig(path=str(models / V8), name="coco"),
                         ModelConfig(path=str(broken), name="broken")], sink)
    try:
        assert group.workers[0].state is WorkerState.RUNNING
        errors = group.model_errors()
        assert list(errors) == ["broken"] and "broken.onnx" in errors["broken"]
        assert group.serving_models() == ["coco"]
        rows = {m["name"]: m for m in group.workers[0].status()["models"]}
        assert rows["coco"]["state"] == "running" and rows["broken"]["state"] == "failed"
        feed = group.add_camera("door", 4, True, None)
        assert list(feed.intakes) == ["coco"]  # not fed to a model that is not there
        with pytest.raises(RuntimeError, match="no running device"):
            group.add_camera("yard", 4, True, ["broken"])
        image = cv2.imread(str(media / "bus.jpg"))
        feed_frames({"door": feed}, [image])
        wait_for(lambda: sink.count() == 1, 60, "the frame of the model that loaded")
        assert not mismatches(sink.got[("door", "coco")][0], reference(references, V8, "bus"))
    finally:
        stop_group(group)


@pytest.mark.shared
def test_a_group_whose_only_model_cannot_be_loaded_fails_as_before(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"garbage")
    group = start_group([ModelConfig(path=str(broken))], Collected())
    try:
        worker = group.workers[0]
        assert worker.state is WorkerState.FAILED and "broken.onnx" in (worker.startup_error or "")
    finally:
        stop_group(group)


# -- the parts, on their own ------------------------------------------------------------------------

def _sealed_batches(batcher: Batcher, owner: str, frames: int) -> None:
    """`frames` one-frame batches sealed and written for `owner` (a device with a batch of 1)."""
    from yoloedge.pipeline.intake import Resized

    queue = batcher.add_camera("cam", frames, True)
    for seq in range(frames):
        queue.put(Resized(lambda: None, camera="cam", seq=seq), 1.0)
    stop = threading.Event()
    for _ in range(frames):
        job = batcher.take(stop, idle_wait_s=0.1)
        assert job is not None
        item, buffer, slot, taken = job
        batcher.filled(buffer, slot, item, None, taken)


def test_the_scheduler_takes_the_models_in_turn_so_none_starves():
    signal = BatchSignal()
    busy, quiet = Batcher(0.01, signal=signal), Batcher(0.01, signal=signal)
    for batcher in (busy, quiet):
        batcher.add_buffers("dev#1", [np.zeros((1, 4), np.float32) for _ in range(8)], device="dev")
    _sealed_batches(busy, "dev#1", 8)
    _sealed_batches(quiet, "dev#1", 2)
    scheduler = Scheduler([busy, quiet], "dev#1")
    stop = threading.Event()
    order = []
    for _ in range(10):
        job = scheduler.next_batch(stop, idle_wait_s=0.01)
        assert job is not None
        index, buffer = job
        order.append(index)
        (busy, quiet)[index].release(buffer)
    # the busy model had a batch every time; the quiet one still got every other run while it had one
    assert order == [0, 1, 0, 1, 0, 0, 0, 0, 0, 0] and scheduler.runs == [8, 2]
    stop.set()
    assert scheduler.next_batch(stop, idle_wait_s=0.01) is None  # nothing sealed, stopping


def test_the_scheduler_refuses_batchers_that_do_not_share_a_signal():
    with pytest.raises(ValueError, match="share one BatchSignal"):
        Scheduler([Batcher(0.01), Batcher(0.01)], "dev#1")


def test_a_lossless_feed_waits_for_every_model_and_gives_none_a_frame_twice():
    lock = threading.Lock()
    work = threading.Condition(lock)
    fast = FrameQueue("cam", 4, True, lock, work)
    slow = FrameQueue("cam", 1, True, lock, work)
    feed = CameraFeed({"fast": CameraIntake(fast, Resizer(32, 32), 6),
                       "slow": CameraIntake(slow, Resizer(16, 16), 3)})
    image = np.full((48, 64, 3), 50, np.uint8)
    assert feed(Frame("cam", 0, image, 1.7e9, 0.0), 0.01)
    second = Frame("cam", 1, image, 1.7e9 + 1, 1.0)
    assert not feed(second, 0.01)  # the slow model's queue is full: the frame is offered again later
    assert not feed(second, 0.01)
    assert (len(fast), len(slow)) == (2, 1)  # the fast model took frame 1 once, not once per slice
    with lock:  # the batcher's side takes under its lock
        taken = slow.get_nowait()
    assert taken is not None and taken.seq == 0 and taken.image.shape[:2] == (12, 16)  # its own size
    taken.release()
    assert feed(second, 0.01) and (len(fast), len(slow)) == (2, 1)
    with lock:
        assert [fast.get_nowait().seq, fast.get_nowait().seq] == [0, 1]
    assert feed.dropped == 0


@pytest.mark.shared
def test_a_device_that_fails_on_one_model_reopens_every_model(models, media, references, monkeypatch):
    """Inferences of one model fail until the device gives up: the device is released and
    opened again, with both models, and both serve again."""
    from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
    from yoloedge.errors import BackendError
    from yoloedge.pipeline import groups as groups_module

    made: list[str] = []
    failing = {"left": 0}

    class Flaky(OnnxRuntimeBackend):
        def run(self, n, input_set=0, output_set=0):
            if self.model_path.endswith(YOLOX) and failing["left"] > 0:
                failing["left"] -= 1
                raise BackendError("injected: the card lost this model")
            return super().run(n, input_set, output_set)

    def create(name, model_path, config=None):
        made.append(model_path.rsplit("/", 1)[-1])
        return Flaky(model_path)

    monkeypatch.setattr(groups_module, "create_backend", create)
    sink = Collected()
    acc = AcceleratorConfig(backend="onnxruntime", devices=(0,), batch=1, batch_timeout_ms=5, name="cpu0",
                            max_consecutive_errors=2, preprocess_threads=1, post_threads=1)
    group = AcceleratorGroup("cpu0", acc, [ModelConfig(path=str(models / V8), name="coco"),
                                           ModelConfig(path=str(models / YOLOX), name="nano")],
                             ProgressTracker(), sink)
    group.start()
    group.wait_ready(threading.Event())
    worker = group.workers[0]
    try:
        feed = group.add_camera("gate", 4, True, None)
        image = cv2.imread(str(media / "bus.jpg"))
        failing["left"] = 2
        feed_frames({"gate": feed}, [image] * 2)  # nano's two batches fail: the device gives up
        wait_for(lambda: worker.stats.restarts == 1 and worker.state is WorkerState.RUNNING, 60,
                 "the device opened again")
        # each model's backend made again for the reopening (and one spare for the next), none left out
        assert made.count(V8) == made.count(YOLOX) >= 2
        before = sink.count()
        for seq in range(2, 4):
            frame = Frame("gate", seq, image, 1.7e9 + seq, float(seq))
            while not feed(frame, 0.25):
                pass
        wait_for(lambda: sink.count() >= before + 4, 60, "both models serve after the restart")
        for name, model in (("coco", V8), ("nano", YOLOX)):
            frames = sink.got[("gate", name)]
            assert {2, 3} <= set(frames), name
            assert not mismatches(frames[3], reference(references, model, "bus")), name
        assert worker.stats.errors == 2
    finally:
        stop_group(group)
