"""An accelerator group: one batcher, one worker per device, one post-processing stage."""

from __future__ import annotations

import logging
import queue

from ..backends import backend_config_for, create_backend
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig
from ..health.progress import ProgressTracker
from .batcher import Batcher
from .post import PostStage, Sink
from .worker import DeviceWorker

log = logging.getLogger(__name__)


class AcceleratorGroup:
    def __init__(self, name: str, config: AcceleratorConfig, model: ModelConfig,
                 tracker: ProgressTracker, sink: Sink):
        self.name = name
        self.config = config
        self.model = model
        self.batcher = Batcher(config.batch_timeout_ms / 1000.0)
        self.results: queue.Queue = queue.Queue()
        self.post = PostStage(name, self.results, sink)
        self.workers = [
            DeviceWorker(f"{name}/{device}", config, device, model, self.batcher, self.results, tracker,
                         self._factory(device))
            for device in config.devices
        ]

    def _factory(self, device: int):
        return lambda: create_backend(self.config.backend, self.model.path,
                                      backend_config_for(self.config, device))

    def start(self) -> None:
        self.post.start()
        for w in self.workers:
            w.start()

    def wait_ready(self, stop) -> None:
        """Block until every worker loaded its model (or failed), or `stop` is set."""
        for w in self.workers:
            while not w.ready.wait(0.2):
                if stop.is_set():
                    return

    @property
    def running_workers(self) -> list[DeviceWorker]:
        return [w for w in self.workers if w.state == "running"]

    @property
    def detector(self):
        """The detector of any running worker (all load the same model)."""
        running = self.running_workers
        return running[0].detector if running else None

    def busy(self) -> bool:
        return (self.batcher.depth() > 0 or self.post.pending() > 0
                or any(w.in_flight for w in self.workers))

    def stop_workers(self, timeout: float) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(timeout)
            if w.is_alive():
                log.error("%s did not stop within %.1f s (device call hung?)", w.worker_name, timeout)

    def stop_post(self, timeout: float) -> None:
        if self.post.is_alive() and not self.post.stop(timeout):
            log.error("post-processing of %s did not stop within %.1f s", self.name, timeout)
