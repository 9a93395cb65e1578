"""Device workers: one thread per accelerator device, owning its backend.

Every device call (load, allocate, copy, execute, free) happens on the worker's own thread, as
pyACL and CUDA contexts require. The worker letterboxes a batch into the backend's input buffer,
runs it, copies the outputs into one slot of a small ring of output buffers allocated once at
start, and hands the slot to the post-processing stage, so decode and NMS never hold the device
up. A full ring makes the worker wait: back-pressure instead of unbounded memory.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..config.schema import AcceleratorConfig
from ..config.model import ModelConfig
from ..detector import Detector
from ..health.progress import ProgressTracker
from ..preprocess import Geometry
from .batcher import Batcher
from .frames import Frame
from .metrics import LatencyWindow, RateMeter

log = logging.getLogger(__name__)

RING_SLOTS = 3


@dataclass
class InferredBatch:
    """A batch that has been run, waiting for post-processing."""

    worker: "DeviceWorker"
    frames: list[Frame]
    geometries: list[Geometry]
    slot: int
    outputs: list[np.ndarray]  # views [n, ...] of the ring slot

    def release(self) -> None:
        self.worker.release_slot(self.slot)


class DeviceWorker(threading.Thread):
    def __init__(self, name: str, accelerator: AcceleratorConfig, device: int, model: ModelConfig,
                 batcher: Batcher, results: "queue.Queue[InferredBatch | None]",
                 tracker: ProgressTracker, backend_factory: Callable[[], object]):
        super().__init__(name=f"worker-{name}", daemon=True)
        self.worker_name = name
        self.accelerator = accelerator
        self.device = device
        self.model = model
        self.batcher = batcher
        self.results = results
        self.tracker = tracker
        self._backend_factory = backend_factory
        self.detector: Detector | None = None
        self.ready = threading.Event()
        self.startup_error: str | None = None
        self.state = "starting"
        self._stop_event = threading.Event()
        self._free: queue.Queue[int] = queue.Queue()
        self._ring: list[list[np.ndarray]] = []
        self.inferences = RateMeter()
        self.frames_done = RateMeter()
        self.infer_ms = LatencyWindow()
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
            self.state = "failed"
            log.error("%s: cannot start: %s", self.worker_name, self.startup_error,
                      extra={"device": self.worker_name})
            self.ready.set()
            self._close_device()
            return
        self.state = "running"
        self.ready.set()
        try:
            while not self._stop_event.is_set():
                frames = self.batcher.next_batch(self.detector.max_batch, self._stop_event)
                if frames:
                    self._process(frames)
        finally:
            self.state = "stopped"
            self._close_device()

    def stop(self) -> None:
        self._stop_event.set()
        self.batcher.wake()

    def _start_device(self) -> None:
        self.tracker.register(self.worker_name, self.accelerator.inference_timeout_s)
        backend = self._backend_factory()
        # Load, allocate and warm up under the watchdog deadline of a (long) first inference.
        self.tracker.busy(self.worker_name)
        self.detector = Detector(self.model, backend, max_batch=self.accelerator.batch)
        self.detector.warm_up()
        self._allocate_ring()
        self.tracker.idle(self.worker_name)
        log.info("%s ready: %s, batch %d", self.worker_name, backend.description,
                 self.detector.max_batch, extra={"device": self.worker_name})

    def _allocate_ring(self) -> None:
        outputs = self.detector.infer(1)
        cap = self.detector.max_batch
        self._ring = [[np.empty((cap, *o.shape[1:]), o.dtype) for o in outputs] for _ in range(RING_SLOTS)]
        for i in range(RING_SLOTS):
            self._free.put(i)

    def _close_device(self) -> None:
        if self.detector is not None:
            try:
                self.detector.close()
            except Exception:  # noqa: BLE001 - teardown continues; the failure is logged
                log.exception("%s: error while releasing the device", self.worker_name)
        self.tracker.unregister(self.worker_name)

    # -- the hot path -------------------------------------------------------------------------
    def _process(self, frames: list[Frame]) -> None:
        self.in_flight = True
        try:
            self._run_batch(frames)
        finally:
            self.in_flight = False

    def _run_batch(self, frames: list[Frame]) -> None:
        slot = self._acquire_slot()
        if slot is None:  # stopping
            self.frames_lost += len(frames)
            return
        n = len(frames)
        self.tracker.busy(self.worker_name)
        t0 = time.monotonic()
        for f in frames:
            f.timings["batched"] = t0
        try:
            geometries = self.detector.preprocess([f.image for f in frames])
            outputs = self.detector.infer(n)
            views = []
            for buf, out in zip(self._ring[slot], outputs):
                np.copyto(buf[:n], out[:n])
                views.append(buf[:n])
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the worker
            self._free.put(slot)
            self._inference_failed(exc, frames)
            return
        t1 = time.monotonic()
        self.tracker.idle(self.worker_name)
        if self.consecutive_errors:
            self.tracker.mark_healthy(self.worker_name)
            self.consecutive_errors = 0
        self.infer_ms.add((t1 - t0) * 1000)
        self.inferences.mark()
        self.frames_done.mark(n)
        for f in frames:
            f.timings["inferred"] = t1
        self.results.put(InferredBatch(self, frames, geometries, slot, views))

    def _inference_failed(self, exc: Exception, frames: list[Frame]) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        self.frames_lost += len(frames)
        limit = self.accelerator.max_consecutive_errors
        log.error("%s: inference failed (%d in a row), %d frame(s) lost: %s", self.worker_name,
                  self.consecutive_errors, len(frames), exc, extra={"device": self.worker_name})
        if self.consecutive_errors >= limit:
            self.tracker.mark_unhealthy(self.worker_name, f"{self.consecutive_errors} inferences failed in a row: {exc}")
        else:
            self.tracker.idle(self.worker_name)
        # A failing device is retried, but not in a tight loop.
        self._stop_event.wait(min(5.0, 0.1 * 2 ** min(self.consecutive_errors, 6)))

    def _acquire_slot(self) -> int | None:
        while not self._stop_event.is_set():
            try:
                return self._free.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def release_slot(self, slot: int) -> None:
        self._free.put(slot)

    def status(self) -> dict:
        return {
            "name": self.worker_name,
            "backend": self.accelerator.backend,
            "device": self.device,
            "model": self.model.path,
            "batch": self.detector.max_batch if self.detector else self.accelerator.batch,
            "state": self.state,
            "inferences_per_s": round(self.inferences.rate(), 2),
            "frames_per_s": round(self.frames_done.rate(), 2),
            "p50_ms": self.infer_ms.percentile(50),
            "p99_ms": self.infer_ms.percentile(99),
            "queue_depth": self.batcher.depth(),
            "errors": self.errors,
            "frames_lost": self.frames_lost,
            "description": self.detector.backend.description if self.detector else "",
            "error": self.startup_error,
            "telemetry": self._telemetry(),
        }

    def _telemetry(self) -> dict | None:
        """Device health from backends that offer it (Ascend: npu-smi); None from the others."""
        backend = self.detector.backend if self.detector else None
        return backend.telemetry() if hasattr(backend, "telemetry") else None
