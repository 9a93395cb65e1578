"""One life of a device worker: the thread that opens the device, serves batches on it and
releases it, and everything that thread owns (see `worker` for the supervisor that starts and
replaces these lives).

The thread opens one backend per model its group loads, each with several input sets and output
sets (allocated once), warms each model up, and lends each model's input sets to that model's
batcher. Then it only waits for whichever model has a sealed batch (`scheduler`), runs it from its
input set into a free output set of that model, gives the input set back for refilling and hands
the output set to the model's post-processing (the hot path, with up to two batches in flight
on a pipelining backend, is `flight.HotPath`). A thread waiting for a free output set is
back-pressure: post-processing is behind, and memory stays bounded.

At the first opening a model that cannot be loaded is reported (`failed_models`) and the others
are served; only when none loads does the opening fail. A reopening must open every model that
the first one served, or it fails and is retried as a whole.

Leaving, it takes its buffers out of the batcher (their sealed batches are given up), waits for
post-processing to hand back its output sets and releases the device on its own thread, as pyACL
and CUDA contexts require. Device memory that something may still read or write is never freed:
if post-processing does not hand back an output set (Ascend outputs are views on device memory)
or a preparer does not finish writing an input slot within a bound, the device stays open,
knowingly leaked, counted in `leaked_openings` and logged. An abandoned life (its call hung)
frees its device itself once the call returns, and whatever the call returns is discarded.

Locks: `abandoned`, `running` and the device call are guarded by the worker's lock (the
supervisor decides on them); `outputs_back` is a leaf.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..backoff import Backoff
from .detector import Detector
from ..health.progress import DeviceCall
from ..model import identity
from ..backends.base import DeviceScope
from .flight import HotPath
from .scheduler import Scheduler
from .served import LoadedModel
from .slots import BatchBuffer

if TYPE_CHECKING:
    from .worker import DeviceWorker

log = logging.getLogger(__name__)

#: how long a leaving device waits (real time) for post-processing to hand back its output sets
OUTPUT_WAIT_S = 10.0


class Incarnation(HotPath):
    """One opening of a device and the thread that serves it. Its output sets come back here, so a
    late output set goes back to the life that made it."""

    def __init__(self, worker: DeviceWorker, generation: int):
        self.worker = worker
        self.generation = generation
        self.name = worker.worker_name
        #: the batcher's key for its buffers: a late `release` of an abandoned life finds no owner
        self.owner = f"{self.name}#{generation}"
        suffix = f"#{generation}" if generation > 1 else ""
        self.thread = threading.Thread(target=self._live, name=f"worker-{self.name}{suffix}", daemon=True)
        self.models: list[LoadedModel] = []  # the models this opening serves, in the worker's order
        self.failed_models: dict[str, str] = {}  # model name -> why it could not be loaded (first opening)
        self.outputs_back = threading.Condition()  # notified whenever an output set comes back
        self.open_error: str | None = None  # opening the device failed
        self.failure: str | None = None  # it served, then gave up (too many failures in a row)
        self.abandoned = False  # its call hung: nothing it does from now on counts
        self.call: DeviceCall | None = None  # the device call (open or run) running now
        #: the batches on the device and their models: one, or two with a pipelining backend (`flight`)
        self.running: list[tuple[LoadedModel, BatchBuffer]] = []
        #: what the backends of this opening share on the device (one Ascend context for all its models)
        self.scope = DeviceScope(f"{self.name} opening {generation}")
        self.stop = threading.Event()
        self.buffers_out = threading.Event()  # its input sets left the batcher: no preparer writes them
        self.keep_open: str | None = None  # why its device memory must not be freed (see `_leak`)
        #: between failed inferences of a device that has not given up yet (a new life starts afresh)
        self.error_backoff = Backoff(0.2, 5.0)
        self.done = threading.Event()  # its thread ends: the device is released (or knowingly leaked)

    @property
    def detector(self) -> Detector | None:
        """The first model served (status's batch and backend description)."""
        return self.models[0].detector if self.models else None

    @property
    def in_flight(self) -> bool:
        return bool(self.running)

    def begin_call(self, what: str, deadline_s: float | None) -> float:
        """A device call starts (callers hold the worker's lock); returns when, on its clock."""
        self.call = self.worker.health.begin(what, deadline_s)
        return self.call.started

    def end_call(self) -> None:
        """The device call returned (callers hold the worker's lock)."""
        if self.call is not None:
            self.worker.health.end(self.call)
            self.call = None

    # -- the thread ----------------------------------------------------------------------------
    def _live(self) -> None:
        """The whole life. Whatever happens on it, the device is left (or knowingly leaked), `done`
        and `ready` are set and the supervisor is told why."""
        worker = self.worker
        try:
            serving = False
            try:
                self._open()
                serving = worker.serving(self)
            except Exception as exc:  # noqa: BLE001 - any start-up failure is reported, not raised
                worker.open_failed(self, f"{type(exc).__name__}: {exc}")
            scheduler = Scheduler([m.served.batcher for m in self.models], self.owner) if serving else None
            if scheduler is not None:
                self._serve(scheduler)
        except Exception as exc:  # noqa: BLE001 - a bug or a host failure: the device is restarted
            self._thread_failed(exc)
        finally:
            worker.ready.set()  # start-up never waits for a thread that is gone
            try:
                self._leave()
            finally:
                worker.finished(self)

    def _thread_failed(self, exc: Exception) -> None:
        reason = f"the device thread failed: {type(exc).__name__}: {exc}"
        log.error("%s: %s", self.name, reason, exc_info=exc, extra={"device": self.name})
        with self.worker.lock:
            self.running = []
            self.end_call()
            self.failure = reason
            self.stop.set()
            if not self.abandoned:
                self.worker.health.abandon(reason)  # not busy any more, and unhealthy

    def _open(self) -> None:
        worker = self.worker
        first = self.generation == 1
        with worker.lock:  # the first opening has no deadline, see the worker's module docstring
            started = (self.begin_call("first opening of the device", None) if first
                       else self.begin_call("reopening of the device", worker.open_deadline_s))
        if not first:  # the same models as the first opening, or none (see `model.identity`)
            identity.check_unchanged(worker.model_files)
        errors: list[Exception] = []
        for index, served in enumerate(worker.served):
            if not first and served.name not in worker.serving_models:
                continue  # it could not be loaded at the first opening: not retried
            try:
                self._open_model(index)
            except Exception as exc:
                if not first or len(worker.served) == 1:
                    raise
                errors.append(exc)
                self.failed_models[served.name] = f"{type(exc).__name__}: {exc}"
                log.error("%s: model %s cannot be loaded: %s; the device serves its other models", self.name,
                          served.name, exc, extra={"device": self.name})
        if not self.models:
            raise errors[0]
        if first:
            # After loading, so a missing or bad file is reported by the backend as it always was;
            # on this thread and off the lock: hashing a large model takes a while.
            files = tuple(f for m in self.models for f in identity.record(m.served.model))
            worker.first_opened(files, max(0.0, worker.clock() - started))

    def _open_model(self, index: int) -> None:
        worker, acc = self.worker, self.worker.accelerator
        served, spare = worker.served[index], worker.spares[index]
        backend = spare.take()
        if self.generation > 1:
            spare.reserve()  # this opening may fail and release the runtime
        backend.use_scope(self.scope)
        loaded = LoadedModel.open(index, served, backend, acc, self.outputs_back)
        self.models.append(loaded)  # closed by `_leave` from now on, whatever happens next
        loaded.warm_up(self.name)

    def _leave(self) -> None:
        """Give back the buffers, wait for post-processing to return the output sets, release the
        device (on this thread) unless its memory may still be in use."""
        if self.abandoned:
            self.buffers_out.wait()  # the supervisor takes them out (bounded by the batcher's wait)
        else:
            if self.failure is not None:
                self.worker.set_down(True)
            self.remove_buffers("the device failed" if self.failure is not None else "the device stopped")
            self.buffers_out.set()
        # Always, a normal stop included: workers stop before post-processing, which may still read
        # the last outputs, views of device-side memory (pinned host memory on TensorRT and Ascend).
        self._await_output_sets()
        if self.failure is not None:
            for spare in self.worker.spares:
                spare.reserve()
        if self.keep_open is not None:
            self._leak()
        else:
            self._close_device()

    def remove_buffers(self, reason: str) -> None:
        """Take this life's input sets out of the batchers, giving up the frames they held. One that
        a preparer still writes after the batcher's wait keeps the device open (see `_leak`)."""
        for model in self.models:
            lost = model.served.batcher.remove_buffers(self.owner)
            for buffer in lost:
                self.give_up(model, buffer, reason)
            if any(not b.ready for b in lost):
                self.keep_open = "a preparer is still writing into its input buffers"

    def give_up(self, model: LoadedModel, buffer: BatchBuffer, reason: str | None) -> None:
        """The buffer's frames will not be published: count them and free their ticket."""
        frames = sum(1 for m in buffer.metas[:buffer.claimed] if m.valid)
        self.worker.stats.frames_lost += frames
        model.served.post.skip(buffer.ticket)
        if reason and frames:
            log.warning("%s: %d frame(s) of model %s not processed: %s", self.name, frames, model.name, reason,
                        extra={"device": self.name})

    def _await_output_sets(self) -> None:
        """Post-processing may still read outputs in this device's memory: wait (bounded) for it to
        hand every output set back; if it does not, the device is not released."""
        deadline = time.monotonic() + OUTPUT_WAIT_S
        with self.outputs_back:
            while not all(m.all_back() or m.served.post.stopped for m in self.models):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.keep_open = "post-processing still holds its output sets"
                    return
                # woken by every returned set; the slice only notices a post stage that stopped
                self.outputs_back.wait(min(remaining, 0.5))

    def _leak(self) -> None:
        """Keep this life's device memory allocated for good: freeing it while something may still
        read or write it would be a use-after-free. Costs one opening's memory; counted and logged."""
        stats = self.worker.stats
        with self.worker.lock:
            stats.leaked_openings += 1
            count = stats.leaked_openings
        log.error("%s: %s; its device memory is left allocated (%d opening(s) leaked so far)",
                  self.name, self.keep_open, count, extra={"device": self.name})

    def _close_device(self) -> None:
        """Every model this opening loaded, the newest first (a shared context goes last)."""
        for model in reversed(self.models):
            try:
                model.detector.close()
            except Exception:  # noqa: BLE001 - teardown continues; the failure is logged
                log.exception("%s: error while releasing model %s", self.name, model.name)
        try:
            self.scope.close()  # normally nothing left: the last model released what they shared
        except Exception:  # noqa: BLE001 - logged; the device is left either way
            log.exception("%s: error while releasing what its models shared", self.name)
