"""The device worker's hot path: each sealed batch is submitted to its model's backend and
completed, its input set given back and its outputs handed to post-processing; with a backend
that pipelines (`Backend.pipelined`: Ascend async), at most two batches are in flight.

Why two: `submit` of a pipelining backend only queues the batch's copy-in, execution and
copy-out on the device's stream, so the worker takes the next sealed batch and submits it before
it waits (`complete`) for the previous one. The card then has batch n+1 queued behind batch n
instead of idling while the host hands n's outputs over and fetches the next batch. Results are
published per ticket by post-processing, so the order of completion does not matter to it; this
worker completes in submission order anyway.

What keeps it sound:

* a batch's input set goes back to the batcher and its output set to post-processing only after
  its `complete` returned (the device reads and writes them until then);
* a second batch is submitted only if its output set is free right away: waiting for one with a
  batch in flight would hold that batch's own output set back from post-processing (a deadlock
  with few output sets), so the batch in flight is completed first;
* each batch's device call is recorded at its submit (`DeviceHealth` holds one: the newest), so a
  `complete` that hangs is an overdue inference for the supervisor as before. With two in flight
  the deadline runs from the later submit, which comes right before the earlier batch's complete;
* after a failed batch the worker backs off (as before), but only once nothing is in flight;
* everything in flight (`Incarnation.running`) is given up together when the call is abandoned,
  and a stopping worker drains what it submitted before it leaves (and so before the device is
  closed).
"""

from __future__ import annotations

import logging
import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends.base import Ticket
from ..health.progress import DeviceCall
from .scheduler import Scheduler
from .served import LoadedModel
from .slots import BatchBuffer, OutputSet

if TYPE_CHECKING:
    import threading

    from ..backoff import Backoff
    from .worker import DeviceWorker

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """One submitted batch, until its `complete` returned."""

    model: LoadedModel
    buffer: BatchBuffer
    output_set: OutputSet
    ticket: Ticket
    started: float
    call: DeviceCall | None


class HotPath:
    """The serving loop of `Incarnation` (a mixin: its state is the incarnation's)."""

    worker: DeviceWorker
    name: str
    models: list[LoadedModel]
    stop: threading.Event
    abandoned: bool
    failure: str | None
    call: DeviceCall | None
    running: list[tuple[LoadedModel, BatchBuffer]]
    error_backoff: Backoff
    #: after a failed batch: how long to wait before the next one (0: none due)
    backoff_s: float = 0.0

    def begin_call(self, what: str, deadline_s: float | None) -> float:
        raise NotImplementedError

    def give_up(self, model: LoadedModel, buffer: BatchBuffer, reason: str | None) -> None:
        raise NotImplementedError

    def _serve(self, scheduler: Scheduler) -> None:
        """Until stopped: the next batch is submitted, then the one before it completed."""
        pending: InFlight | None = None
        try:
            while not self.stop.is_set():
                job = scheduler.next_batch(self.stop) if pending is None else scheduler.ready_batch(self.stop)
                new = None
                if job is not None:
                    new, pending = self._submit(self.models[job[0]], job[1], pending)
                if pending is not None:
                    self._finish(pending)
                pending = None
                if new is not None and new.model.detector.backend.pipelined:
                    pending = new
                elif new is not None:
                    self._finish(new)
                if self.backoff_s:
                    if pending is not None:
                        self._finish(pending)
                        pending = None
                    delay, self.backoff_s = self.backoff_s, 0.0
                    self.stop.wait(delay)
        except BaseException:
            if pending is not None:  # the device may still read and write its sets: wait for it
                self._drain(pending)
            raise
        if pending is not None:
            self._finish(pending)

    def _drain(self, pending: InFlight) -> None:
        try:
            self._finish(pending)
        except Exception:  # noqa: BLE001 - the loop's own error is the one raised; this one is logged
            log.exception("%s: while completing the batch in flight after a failure", self.name)

    def _submit(self, model: LoadedModel, buffer: BatchBuffer,
                pending: InFlight | None) -> tuple[InFlight | None, InFlight | None]:
        """Submit `buffer`; returns it in flight (None if it failed or was given up) and what is
        left of `pending` (completed here when this batch's output set had to be waited for)."""
        worker, batcher = self.worker, model.served.batcher
        try:
            output_set: OutputSet | None = model.free_outputs.get_nowait()
        except queue.Empty:
            if pending is not None:
                self._finish(pending)
                pending = None
            output_set = self._acquire_output_set(model)
        if output_set is None:  # stopping while post-processing holds every output set
            batcher.release(buffer)
            self.give_up(model, buffer, "stopping")
            return None, pending
        n = buffer.claimed
        with worker.lock:
            self.running.append((model, buffer))
            started = self.begin_call("inference", worker.accelerator.inference_timeout_s)
            call = self.call
        try:
            ticket = model.detector.backend.submit(n, buffer.index, output_set.index)
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the worker
            self._failed(InFlight(model, buffer, output_set, Ticket(n, buffer.index, output_set.index), started,
                                  call), exc)
            return None, pending
        return InFlight(model, buffer, output_set, ticket, started, call), pending

    def _landed(self, flight: InFlight) -> bool:
        """The batch's call returned (callers hold the worker's lock): True if it still counts."""
        if (flight.model, flight.buffer) in self.running:
            self.running.remove((flight.model, flight.buffer))
        if flight.call is not None:
            self.worker.health.end(flight.call)
            if self.call is flight.call:
                self.call = None
        if self.abandoned:  # its ticket and frames were given up already
            flight.model.release_output_set(flight.output_set)
        return not self.abandoned

    def _failed(self, flight: InFlight, exc: Exception) -> None:
        with self.worker.lock:
            if not self._landed(flight):
                return
        model, buffer = flight.model, flight.buffer
        self.give_up(model, buffer, None)
        model.served.batcher.release(buffer)
        model.release_output_set(flight.output_set)
        self._inference_failed(model, exc, flight.ticket.n)

    def _finish(self, flight: InFlight) -> None:
        """Complete the batch and hand its outputs to post-processing."""
        worker, model, buffer, output_set = self.worker, flight.model, flight.buffer, flight.output_set
        batcher, post = model.served.batcher, model.served.post
        n = flight.ticket.n
        try:
            outputs = model.detector.backend.complete(flight.ticket)
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the worker
            self._failed(flight, exc)
            return
        with worker.lock:
            finished = worker.clock()
            if not self._landed(flight):  # too late: given up when the call was abandoned
                return
        # The frames' details move on with the outputs; the input set is refilled at once.
        output_set.metas, buffer.metas = buffer.metas, output_set.metas
        output_set.outputs, output_set.count, output_set.ticket = outputs, n, buffer.ticket
        output_set.started_mono, output_set.inferred_mono = flight.started, finished
        batcher.release(buffer)
        try:
            post.submit(output_set)
        except Exception:
            # Post-processing may or may not hold the set now: it is not reused (the device is
            # left, see `_await_output_sets`), and its ticket is given up so publishing goes on.
            worker.stats.frames_lost += sum(1 for m in output_set.metas[:n] if m.valid)
            post.skip(output_set.ticket)
            raise
        model.batches += 1
        self._count_success(model, n, finished - flight.started)

    def _count_success(self, model: LoadedModel, n: int, seconds: float) -> None:
        stats = self.worker.stats
        if self.failure is not None:  # a batch drained after the device gave up: it stays failed
            stats.inferred(n, seconds, model.detector.backend.last_timing())
            return
        model.consecutive_errors = 0
        if stats.consecutive_errors:
            # "in a row" is per model: another model's successes do not hide one that always fails
            stats.consecutive_errors = max(m.consecutive_errors for m in self.models)
            if not stats.consecutive_errors:
                self.worker.health.healthy()
                self.error_backoff.reset()
        stats.inferred(n, seconds, model.detector.backend.last_timing())

    def _inference_failed(self, model: LoadedModel, exc: Exception, frames: int) -> None:
        worker, stats = self.worker, self.worker.stats
        model.consecutive_errors += 1
        stats.consecutive_errors = max(m.consecutive_errors for m in self.models)
        given_up = model.consecutive_errors >= worker.accelerator.max_consecutive_errors
        if given_up:
            what = "inferences" if len(self.models) == 1 else f"inferences of model {model.name}"
            self.failure = f"{model.consecutive_errors} {what} failed in a row: {exc}"
            worker.health.unhealthy(self.failure)
        stats.errors += 1  # after the health: whoever sees the count sees the health that goes with it
        log.error("%s: inference%s failed (%d in a row), %d frame(s) lost: %s", self.name,
                  "" if len(self.models) == 1 else f" of model {model.name}", model.consecutive_errors, frames,
                  exc, extra={"device": self.name})
        if given_up:
            self.stop.set()  # leave the loop: the device is released and opened again
            return
        # A failing device is retried, but not in a tight loop: `_serve` waits this long once
        # nothing is in flight (a wait with a batch on the device would read as its hang).
        self.backoff_s = self.error_backoff.next_delay()

    def _acquire_output_set(self, model: LoadedModel) -> OutputSet | None:
        while True:
            try:
                return model.free_outputs.get(timeout=0.2)
            except queue.Empty:
                if self.stop.is_set() and (model.served.post.stopped or self.abandoned or self.failure):
                    return None
