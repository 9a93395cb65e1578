"""An accelerator group: its models, one worker per device, and per model a lane.

    camera feeds -> per model: camera queues -> preparers (letterbox) -> batcher
                 -> workers (every device runs every model, whichever has a batch) -> post

Each model the group loads is a `ModelLane`: its own batcher (the cameras' queues and the devices'
input sets for that model, its own publishing order), its own preparers (letterboxing to its own
input size) and its own post stage, so the models never wait for each other except for the
device itself, which the worker shares out fairly (`scheduler`). The batchers share one signal,
so a worker waits on one condition for whichever model has work.

A model belongs to the group: every device loads the same file, and the first to load it
describes it (`ModelInfo`) for post-processing and routing, through each output set, for every
device. A model no device could load is left out: cameras are fed only the models that run, and
status says why the other did not.

Started in that order's reverse (post, workers, then preparers once a model is loaded and the
letterbox is known) and stopped in it (preparers, workers, post), each stage bounded in time.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

from ..backends import backend_config_for, create_backend
from ..backends.base import Backend
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig, CameraConfig
from ..sources.base import SourceKind, source_kind
from ..sources.dvpp import MediaEngine
from .detector import Detector
from ..health.progress import ProgressTracker
from ..preprocess import Resizer
from .batcher import Batcher, BatchSignal
from .feed import CameraFeed
from .intake import CameraIntake
from .media import GroupMedia, MediaError
from .modelinfo import ModelInfo
from .post import Floor, PostStage, Sink, no_floor
from .prepare import Preparer, auto_threads
from .served import ServedModel
from .worker import DeviceWorker, WorkerState

log = logging.getLogger(__name__)


class ModelLane:
    """One model of a group: its batcher, preparers and post stage, and its description."""

    def __init__(self, group: str, model: ModelConfig, config: AcceleratorConfig, signal: BatchSignal,
                 sink: Sink, floor: Floor, alone: bool = True):
        self.model = model
        self.batcher = Batcher(config.batch_timeout_ms / 1000.0, signal=signal)
        self.post = PostStage(group if alone else f"{group}:{model.name}", sink, auto_threads(config.post_threads),
                              floor)
        self.preparers: list[Preparer] = []
        self._lock = threading.Lock()  # guards `_info`; a leaf
        self._info: ModelInfo | None = None

    @property
    def name(self) -> str:
        return self.model.name

    def describe(self, detector: Detector) -> ModelInfo:
        """The model's description, made once from the first device that loaded it (on its
        thread): a reopening loads the same file (`model.identity`), a sibling the same path."""
        with self._lock:
            if self._info is None:
                self._info = ModelInfo.of(detector)
            return self._info

    @property
    def info(self) -> ModelInfo | None:
        """None until a device has loaded the model."""
        with self._lock:
            return self._info


class AcceleratorGroup:
    def __init__(self, name: str, config: AcceleratorConfig, models: Sequence[ModelConfig],
                 tracker: ProgressTracker, sink: Sink, floor: Floor = no_floor):
        if not models:
            raise ValueError(f"accelerator {name} loads no model")
        self.name = name
        self.config = config
        self.models = tuple(models)
        signal = BatchSignal()
        self.lanes = [ModelLane(name, model, config, signal, sink, floor, alone=len(models) == 1) for model in models]
        #: the Atlas cards' media engines (`decoder: dvpp`), opened when a camera first needs one
        self.media: GroupMedia | None = GroupMedia(name, config) if config.backend == "ascend" else None
        self.workers = [
            DeviceWorker(f"{name}/{device}", config, device,
                         [ServedModel(lane.model, lane.batcher, lane.post, self._factory(lane.model, device),
                                      lane.describe) for lane in self.lanes], tracker)
            for device in config.devices
        ]

    @property
    def model(self) -> ModelConfig:
        """The first model (single-model callers)."""
        return self.models[0]

    def _factory(self, model: ModelConfig, device: int):
        def create() -> Backend:
            return create_backend(self.config.backend, model.path, backend_config_for(self.config, device))
        return create

    def lane(self, model: str) -> ModelLane:
        for lane in self.lanes:
            if lane.name == model:
                return lane
        raise KeyError(f"accelerator {self.name} does not load model {model!r}")

    @property
    def model_info(self) -> ModelInfo | None:
        """The first model's description; None until a device has loaded it."""
        return self.lanes[0].info

    def start(self) -> None:
        for lane in self.lanes:
            lane.post.start()
        for w in self.workers:
            w.start()

    def wait_ready(self, stop: threading.Event) -> None:
        """Block until every worker loaded its models (or failed), or `stop` is set; then start the
        preparers of each model that loaded, which need its input format."""
        for w in self.workers:
            while not w.ready.wait(0.2):
                if stop.is_set():
                    return
        for lane in self.lanes:
            detector = self.detector_of(lane.name)
            if detector is None:
                continue
            for i in range(auto_threads(self.config.preprocess_threads)):
                suffix = "" if len(self.lanes) == 1 else f"-{lane.name}"
                preparer = Preparer(f"prepare-{self.name}{suffix}-{i}", lane.batcher, detector.new_letterboxer(),
                                    self._letterbox_failed)
                lane.preparers.append(preparer)
                preparer.start()

    def serving_models(self, wanted: Sequence[str] | None = None) -> list[str]:
        """The models (of `wanted`, default all, in the group's order) some device has loaded."""
        names = [lane.name for lane in self.lanes if wanted is None or lane.name in wanted]
        return [name for name in names if self.detector_of(name) is not None]

    def model_errors(self) -> dict[str, str]:
        """Models no device could load, and why (the first device's reason)."""
        errors: dict[str, str] = {}
        for w in self.workers:
            for name, error in w.failed_models.items():
                errors.setdefault(name, error)
        return {name: error for name, error in errors.items() if self.detector_of(name) is None}

    def takes_card_pictures(self, models: Sequence[str] | None = None) -> bool:
        """Whether the models (of `models`, default all, those that run) take pictures the card
        decoded (`decoder: dvpp`) rather than host frames."""
        names = self.serving_models(models)
        detectors = [d for d in (self.detector_of(name) for name in names) if d is not None]
        return any(d.backend.device_inputs is not None for d in detectors)

    def media_for(self, camera: CameraConfig, models: Sequence[str] | None = None,
                  queue_size: int = 2) -> MediaEngine | None:
        """The camera's way onto its card's media engine: for `decoder: dvpp` or `auto` on a group
        whose models take the card's pictures; None otherwise. Raises MediaError (the camera
        fails with it) when the camera and its models do not fit together."""
        if not self.takes_card_pictures(models):
            return None
        if camera.pipeline or camera.decoder not in ("dvpp", "auto"):
            raise MediaError(f"its model(s) take NV12 pictures the card decodes (an .om with YUV420SP AIPP), "
                             f"so the camera needs decoder: dvpp (or auto), not "
                             f"{'a pipeline:' if camera.pipeline else 'decoder: ' + camera.decoder}")
        if self.media is None:
            raise MediaError(f"accelerator {self.name} (backend: {self.config.backend}) has no media engine")
        if not camera.pipeline and source_kind(camera.url) not in (SourceKind.RTSP, SourceKind.FILE):
            raise MediaError("its model(s) take NV12 pictures the card decodes from rtsp:// streams and video "
                             "files; image folders, HTTP and capture devices are decoded on the host, so run "
                             "this camera on an accelerator whose model takes host frames")
        return self.media.for_camera(camera.name, queue_size, lossless=camera.realtime is False)

    def add_camera(self, camera: str, queue_size: int, lossless: bool,
                   models: Sequence[str] | None = None, device: str | None = None) -> CameraFeed:
        """A camera's queues, one per model it feeds (of `models`, default all, those that run),
        and the sink its reader writes into. `device`: the one device whose input sets take its
        frames (a camera the card decodes)."""
        names = self.serving_models(models)
        if not names:
            raise RuntimeError(f"accelerator {self.name} has no running device for "
                               f"{'its models' if models is None else 'model(s) ' + ', '.join(models)}")
        intakes: dict[str, CameraIntake] = {}
        try:
            for name in names:
                lane, detector = self.lane(name), self.detector_of(name)
                if detector is None:
                    continue
                queue = lane.batcher.add_camera(camera, queue_size, lossless, device=device)
                resizer = Resizer(detector.input.height, detector.input.width, detector.style)
                intakes[name] = CameraIntake(queue, resizer, CameraIntake.ring_size(queue_size, len(lane.preparers)))
        except Exception:
            self.remove_camera(camera)
            raise
        return CameraFeed(intakes)

    def remove_camera(self, camera: str) -> int:
        """Close and forget a camera's queues (and its decoder channel on the card); returns how
        many queued frames were discarded."""
        dropped = sum(lane.batcher.remove_camera(camera) for lane in self.lanes)
        if self.media is not None:
            self.media.remove_camera(camera)
        return dropped

    @staticmethod
    def _letterbox_failed(camera: str, seq: int, exc: Exception) -> None:
        log.error("camera %s: frame %d cannot be letterboxed: %s", camera, seq, exc, extra={"camera": camera})

    @property
    def running_workers(self) -> list[DeviceWorker]:
        return [w for w in self.workers if w.state is WorkerState.RUNNING]

    @property
    def serving(self) -> bool:
        """Some device runs or is coming back (backoff, restarting): cameras may join the group."""
        return any(w.state in (WorkerState.RUNNING, WorkerState.BACKOFF, WorkerState.WAITING_FOR_HUNG,
                               WorkerState.RESTARTING)
                   for w in self.workers)

    @property
    def detector(self) -> Detector | None:
        """The first model as a worker opened it (see `detector_of`)."""
        return self.detector_of(self.lanes[0].name)

    def detector_of(self, model: str) -> Detector | None:
        """`model` as a worker opened it (all load the same one); a device that is restarting
        still describes it, so cameras can be added while a card recovers."""
        for w in self.running_workers + self.workers:
            detector = w.detector_of(model)
            if detector is not None:
                return detector
        return None

    def pending(self) -> int:
        return sum(lane.batcher.pending() for lane in self.lanes)

    def rebalanced_of(self, camera: str) -> int:
        """Frames of `camera` (all its models) that went to another device while one was down."""
        return sum(lane.batcher.rebalanced_of(camera) for lane in self.lanes)

    def busy(self) -> bool:
        """Frames still on their way: queued, in a buffer, on a device or being published."""
        return (any(lane.batcher.pending() > 0 or lane.post.pending() > 0 for lane in self.lanes)
                or any(w.in_flight for w in self.workers))

    def stop_preparers(self, timeout: float) -> None:
        preparers = [p for lane in self.lanes for p in lane.preparers]
        for p in preparers:
            p.stop()
        for lane in self.lanes:
            lane.batcher.close()
        deadline = time.monotonic() + timeout  # one bound for all: not `timeout` per thread
        for p in preparers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.error("%s did not stop within %.1f s", p.name, timeout)

    def stop_workers(self, timeout: float) -> None:
        """Stop every device worker within `timeout` in all: joined one after another with what
        is left, so four hung cards cannot stretch a 10 s stop to 40 s (past TimeoutStopSec)."""
        for w in self.workers:
            w.stop()
        for lane in self.lanes:
            lane.batcher.close()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                # It may be fine itself and wait for a batch that a hung sibling holds.
                log.error("%s did not stop within %.1f s (its device call, or one it waits for, hung?)",
                          w.worker_name, timeout)
            elif w.hung_calls:
                log.warning("%s: %d abandoned device call(s) never returned", w.worker_name, w.hung_calls)

    def await_devices_closed(self, timeout: float) -> None:
        """After post-processing stopped: the workers that were still waiting for it to hand their
        output sets back now release their devices; wait for that (bounded), so the process does
        not end before a device is closed (and, on Ascend, before acl.finalize)."""
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                log.error("%s: its device was not released within %.1f s of the stop", w.worker_name, timeout)

    def close_media(self) -> None:
        """Close the cards' media engines (every camera's decoder channel, then each card's DVPP
        memory, channel and report thread), after the readers, preparers and workers stopped."""
        if self.media is not None:
            self.media.close()

    def stop_post(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for lane in self.lanes:
            if not lane.post.stop(max(0.0, deadline - time.monotonic())):
                log.error("post-processing of %s did not stop within %.1f s", lane.post.name, timeout)
