"""An accelerator group: one batcher, a preparer pool, one worker per device, one post stage.

    camera queues -> preparers (letterbox into input sets) -> workers (run) -> post (decode, publish)

The model is the group's: every device loads the same file, and the first to load it describes
it (`ModelInfo`) for post-processing and routing, through each output set, for every device.

Started in that order's reverse (post, workers, then preparers once a model is loaded and the
letterbox is known) and stopped in it (preparers, workers, post), each stage bounded in time.
"""

from __future__ import annotations

import logging
import threading
import time

from ..backends import backend_config_for, create_backend
from ..backends.base import Backend
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig
from .detector import Detector
from ..health.progress import ProgressTracker
from ..preprocess import Resizer
from .batcher import Batcher
from .intake import CameraIntake
from .modelinfo import ModelInfo
from .post import Floor, PostStage, Sink, no_floor
from .prepare import Preparer, auto_threads
from .worker import DeviceWorker, WorkerState

log = logging.getLogger(__name__)


class AcceleratorGroup:
    def __init__(self, name: str, config: AcceleratorConfig, model: ModelConfig,
                 tracker: ProgressTracker, sink: Sink, floor: Floor = no_floor):
        self.name = name
        self.config = config
        self.model = model
        self._lock = threading.Lock()  # guards `_model_info`; a leaf
        self._model_info: ModelInfo | None = None
        self.batcher = Batcher(config.batch_timeout_ms / 1000.0)
        self.post = PostStage(name, sink, auto_threads(config.post_threads), floor)
        self.workers = [
            DeviceWorker(f"{name}/{device}", config, device, model, self.batcher, self.post, tracker,
                         self._factory(device), describe=self._describe)
            for device in config.devices
        ]
        self.preparers: list[Preparer] = []

    def _factory(self, device: int):
        def create() -> Backend:
            return create_backend(self.config.backend, self.model.path, backend_config_for(self.config, device))
        return create

    def _describe(self, detector: Detector) -> ModelInfo:
        """The model's description, made once from the first device that loaded it (on its
        thread): a reopening loads the same file (`model.identity`), a sibling the same path."""
        with self._lock:
            if self._model_info is None:
                self._model_info = ModelInfo.of(detector)
            return self._model_info

    @property
    def model_info(self) -> ModelInfo | None:
        """None until a device has loaded the model."""
        with self._lock:
            return self._model_info

    def start(self) -> None:
        self.post.start()
        for w in self.workers:
            w.start()

    def wait_ready(self, stop: threading.Event) -> None:
        """Block until every worker loaded its model (or failed), or `stop` is set; then start the
        preparers, which need the loaded model's input format."""
        for w in self.workers:
            while not w.ready.wait(0.2):
                if stop.is_set():
                    return
        detector = self.detector
        if detector is None:
            return
        for i in range(auto_threads(self.config.preprocess_threads)):
            preparer = Preparer(f"prepare-{self.name}-{i}", self.batcher, detector.new_letterboxer(),
                                self._letterbox_failed)
            self.preparers.append(preparer)
            preparer.start()

    def add_camera(self, camera: str, queue_size: int, lossless: bool) -> CameraIntake:
        """A camera's queue and the sink its reader writes into (the model must be loaded)."""
        detector = self.detector
        if detector is None:
            raise RuntimeError(f"accelerator {self.name} has no running device")
        queue = self.batcher.add_camera(camera, queue_size, lossless)
        resizer = Resizer(detector.input.height, detector.input.width, detector.style)
        return CameraIntake(queue, resizer, CameraIntake.ring_size(queue_size, len(self.preparers)))

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
        """The model as a worker opened it (all load the same one); a device that is restarting
        still describes it, so cameras can be added while a card recovers."""
        return next((w.detector for w in self.running_workers + self.workers if w.detector is not None), None)

    def busy(self) -> bool:
        """Frames still on their way: queued, in a buffer, on a device or being published."""
        return (self.batcher.pending() > 0 or self.post.pending() > 0
                or any(w.in_flight for w in self.workers))

    def stop_preparers(self, timeout: float) -> None:
        for p in self.preparers:
            p.stop()
        self.batcher.close()
        deadline = time.monotonic() + timeout  # one bound for all: not `timeout` per thread
        for p in self.preparers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.error("%s did not stop within %.1f s", p.name, timeout)

    def stop_workers(self, timeout: float) -> None:
        """Stop every device worker within `timeout` in all: joined one after another with what
        is left, so four hung cards cannot stretch a 10 s stop to 40 s (past TimeoutStopSec)."""
        for w in self.workers:
            w.stop()
        self.batcher.close()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                # It may be fine itself and wait for a batch that a hung sibling holds.
                log.error("%s did not stop within %.1f s (its device call, or one it waits for, hung?)",
                          w.worker_name, timeout)
            elif w.hung_calls:
                log.warning("%s: %d abandoned device call(s) never returned", w.worker_name, w.hung_calls)

    def stop_post(self, timeout: float) -> None:
        if not self.post.stop(timeout):
            log.error("post-processing of %s did not stop within %.1f s", self.name, timeout)
