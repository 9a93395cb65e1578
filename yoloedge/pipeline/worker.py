"""Device workers: one thread per accelerator device, owning its backend, doing nothing but execute.

Every device call (load, allocate, copy, execute, free) happens on the worker's own thread, as
pyACL and CUDA contexts require. At start the worker opens its backend with several input sets
and output sets (allocated once), warms the model up, and lends its input sets to the batcher.
Then it only waits for a sealed batch, runs it from its input set into a free output set, gives
the input set back for refilling and hands the output set to post-processing. Letterboxing
happens on the preparers' threads, decode and NMS on post-processing's, so the device is kept
busy as long as the host can feed it. A worker waiting for a free output set is back-pressure:
post-processing is behind, and memory stays bounded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from enum import Enum
from typing import TYPE_CHECKING, Callable

from ..backends.base import Backend
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig
from ..detector import Detector
from ..health.progress import ProgressTracker
from ..metrics import LatencyWindow, RateMeter
from .batcher import Batcher
from .slots import BatchBuffer, OutputSet

if TYPE_CHECKING:
    from .post import PostStage

log = logging.getLogger(__name__)


class WorkerState(str, Enum):
    STARTING = "starting"  # loading the model, allocating, warming up
    RUNNING = "running"  # serving batches
    FAILED = "failed"  # could not start (startup_error says why); its thread has ended
    STOPPED = "stopped"  # stopped and its device released

    def __str__(self) -> str:
        return self.value


class DeviceWorker(threading.Thread):
    def __init__(self, name: str, accelerator: AcceleratorConfig, device: int, model: ModelConfig,
                 batcher: Batcher, post: PostStage, tracker: ProgressTracker,
                 backend_factory: Callable[[], Backend], clock: Callable[[], float] = time.monotonic):
        super().__init__(name=f"worker-{name}", daemon=True)
        self.worker_name = name
        self.accelerator = accelerator
        self.device = device
        self.model = model
        self.batcher = batcher
        self.post = post
        self.tracker = tracker
        self._backend_factory = backend_factory
        self._clock = clock
        self.detector: Detector | None = None
        self.ready = threading.Event()
        self.startup_error: str | None = None
        self.state = WorkerState.STARTING
        self._stop_event = threading.Event()
        self._free_outputs: queue.SimpleQueue[OutputSet] = queue.SimpleQueue()
        self.inferences = RateMeter(clock=clock)
        self.frames_done = RateMeter(clock=clock)
        #: device seconds per second: the device's utilisation; its total is the busy time so far
        self.busy = RateMeter(clock=clock)
        self.infer_ms = LatencyWindow()
        self.batch_sizes = LatencyWindow()
        self.errors = 0
        self.consecutive_errors = 0
        self.frames_lost = 0
        self.in_flight = False  # a batch taken from the batcher and not yet handed on

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._start_device()
        except Exception as exc:  # noqa: BLE001 - any start-up failure is reported, not raised
            self.startup_error = f"{type(exc).__name__}: {exc}"
            self.state = WorkerState.FAILED
            log.error("%s: cannot start: %s", self.worker_name, self.startup_error,
                      extra={"device": self.worker_name})
            self.ready.set()
            self._close_device()
            return
        self.batcher.add_buffers(self.worker_name, list(self.loaded.backend.input_buffers))
        self.state = WorkerState.RUNNING
        self.ready.set()
        try:
            while not self._stop_event.is_set():
                buffer = self.batcher.next_batch(self.worker_name, self._stop_event)
                if buffer is not None:
                    self._process(buffer)
        finally:
            for lost in self.batcher.remove_buffers(self.worker_name):
                self._give_up(lost, "the device stopped")
            self.state = WorkerState.STOPPED
            self._close_device()

    def stop(self) -> None:
        self._stop_event.set()

    @property
    def loaded(self) -> Detector:
        """The detector, once the device has started (post-processing only sees started workers)."""
        if self.detector is None:
            raise RuntimeError(f"{self.worker_name}: the device has not started")
        return self.detector

    def _start_device(self) -> None:
        acc = self.accelerator
        self.tracker.register(self.worker_name, acc.inference_timeout_s)
        backend = self._backend_factory()
        # Load, allocate and warm up under the watchdog deadline of a (long) first inference.
        self.tracker.busy(self.worker_name)
        sets = output_sets_for(acc)
        self.detector = Detector(self.model, backend, max_batch=acc.batch, input_sets=acc.input_buffers,
                                 output_sets=sets)
        self.detector.warm_up()
        for index in range(sets):
            self._free_outputs.put(OutputSet(self, index, self.detector.max_batch))
        self.tracker.idle(self.worker_name)
        log.info("%s ready: %s, batch %d, %d input and %d output buffers", self.worker_name,
                 backend.description, self.detector.max_batch, acc.input_buffers, sets,
                 extra={"device": self.worker_name})

    def _close_device(self) -> None:
        if self.detector is not None:
            try:
                self.detector.close()
            except Exception:  # noqa: BLE001 - teardown continues; the failure is logged
                log.exception("%s: error while releasing the device", self.worker_name)
        self.tracker.unregister(self.worker_name)

    # -- the hot path -------------------------------------------------------------------------
    def _process(self, buffer: BatchBuffer) -> None:
        output_set = self._acquire_output_set()
        if output_set is None:  # stopping while post-processing holds every output set
            self.batcher.release(buffer)
            self._give_up(buffer, "stopping")
            return
        n = buffer.claimed
        self.in_flight = True
        self.tracker.busy(self.worker_name)
        started = self._clock()
        try:
            outputs = self.loaded.backend.run(n, buffer.index, output_set.index)
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the worker
            self.in_flight = False
            self._give_up(buffer, None)
            self.batcher.release(buffer)
            self._free_outputs.put(output_set)
            self._inference_failed(exc, n)
            return
        finished = self._clock()
        self.tracker.idle(self.worker_name)
        # The frames' details move on with the outputs; the input set is refilled at once.
        output_set.metas, buffer.metas = buffer.metas, output_set.metas
        output_set.outputs, output_set.count, output_set.ticket = outputs, n, buffer.ticket
        output_set.started_mono, output_set.inferred_mono = started, finished
        self.batcher.release(buffer)
        self.post.submit(output_set)
        self.in_flight = False
        self._count_success(n, finished - started)

    def _count_success(self, n: int, seconds: float) -> None:
        if self.consecutive_errors:
            self.tracker.mark_healthy(self.worker_name)
            self.consecutive_errors = 0
        self.busy.mark(seconds)
        self.infer_ms.add(seconds * 1000)
        self.batch_sizes.add(n)
        self.inferences.mark()
        self.frames_done.mark(n)

    def _give_up(self, buffer: BatchBuffer, reason: str | None) -> None:
        """The buffer's frames will not be published: count them and free their ticket."""
        frames = sum(1 for m in buffer.metas[:buffer.claimed] if m.valid)
        self.frames_lost += frames
        self.post.skip(buffer.ticket)
        if reason and frames:
            log.warning("%s: %d frame(s) not processed: %s", self.worker_name, frames, reason,
                        extra={"device": self.worker_name})

    def _inference_failed(self, exc: Exception, frames: int) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        limit = self.accelerator.max_consecutive_errors
        log.error("%s: inference failed (%d in a row), %d frame(s) lost: %s", self.worker_name,
                  self.consecutive_errors, frames, exc, extra={"device": self.worker_name})
        if self.consecutive_errors >= limit:
            self.tracker.mark_unhealthy(self.worker_name,
                                        f"{self.consecutive_errors} inferences failed in a row: {exc}")
        else:
            self.tracker.idle(self.worker_name)
        # A failing device is retried, but not in a tight loop.
        self._stop_event.wait(min(5.0, 0.1 * 2 ** min(self.consecutive_errors, 6)))

    def _acquire_output_set(self) -> OutputSet | None:
        while True:
            try:
                return self._free_outputs.get(timeout=0.2)
            except queue.Empty:
                if self._stop_event.is_set() and self.post.stopped:
                    return None

    def release_output_set(self, output_set: OutputSet) -> None:
        self._free_outputs.put(output_set)

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict:
        detector = self.detector
        return {
            "name": self.worker_name,
            "backend": self.accelerator.backend,
            "device": self.device,
            "model": self.model.path,
            "batch": detector.max_batch if detector else self.accelerator.batch,
            "state": self.state.value,
            "inferences_per_s": round(self.inferences.rate(), 2),
            "frames_per_s": round(self.frames_done.rate(), 2),
            "utilisation": round(min(1.0, self.busy.rate()), 3),
            "busy_s": round(self.busy.total, 3),
            "p50_ms": self.infer_ms.percentile(50),
            "p99_ms": self.infer_ms.percentile(99),
            "batch_p50": self.batch_sizes.percentile(50),
            "queue_depth": self.batcher.pending(),
            "errors": self.errors,
            "frames_lost": self.frames_lost,
            "description": detector.backend.description if detector else "",
            "error": self.startup_error,
            "telemetry": detector.backend.telemetry() if detector else None,
        }


def output_sets_for(accelerator: AcceleratorConfig) -> int:
    """One output set per input set, plus one being post-processed while the device writes."""
    return accelerator.input_buffers + 1
