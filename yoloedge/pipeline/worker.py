"""Device workers: one per accelerator device, owning its backend, doing nothing but execute.

Every device call (load, allocate, copy, execute, free) happens on one thread, as pyACL and CUDA
contexts require. That thread opens its backend with several input sets and output sets
(allocated once), warms the model up, and lends its input sets to the batcher. Then it only waits
for a sealed batch, runs it from its input set into a free output set, gives the input set back for
refilling and hands the output set to post-processing. Letterboxing happens on the preparers'
threads, decode and NMS on post-processing's, so the device is kept busy as long as the host can
feed it. A worker waiting for a free output set is back-pressure: post-processing is behind, and
memory stays bounded.

Recovery. One such thread and what it opened is an `Incarnation`; the `DeviceWorker` is the
device's supervisor and outlives them. An incarnation whose inferences fail
`max_consecutive_errors` times in a row takes its buffers out of the batcher (its sealed batches
are given up, see `batcher`), waits for post-processing to hand back its output sets, releases its
device in reverse order on its own thread and ends. An incarnation whose call runs past
`inference_timeout_s` cannot be stopped (Python cannot kill a thread), so it is *abandoned*: its
buffers leave the batcher at once, the hung batch's ticket is given up so publishing does not wait
for it, and whatever the call returns later is discarded. Its memory is
not reused: on a card the hung call still owns its input and output buffers, so they stay
allocated until the call returns and the abandoned thread frees them itself (on the thread that
owns the context). Either way the supervisor then waits a backoff (`RestartPolicy`) and opens the
device again on a fresh thread. It does not wait for a hung call to return, because it may never
return: a new backend is independent of the hung one (a new ONNX Runtime session; on Ascend a new
context and stream on the same device, `set_device` being reference-counted), and the other cards
are never touched. At most `max_hung` abandoned calls per device are left running; past that the
worker waits for one to return before it opens the device again (`WAITING_FOR_HUNG`, logged once),
so a card that hangs on every call cannot pile up threads and device memory.

A reopening loads the model file from disk again, so it first checks that the file is still the
one the first opening loaded (`model.identity`); a changed file fails the reopening, which is
retried with the same backoff until the original is back or the service is restarted.

Opening a device (load, allocate, warm up) is not under the inference deadline: a TensorRT engine,
a cold CUDA session or a big .om file can take far longer than any inference. The first opening
has no deadline at all (start-up waits for it, and a card that never opens keeps the daemon from
becoming ready, which systemd sees); a reopening is abandoned like a hung call only after
`open_deadline_s`: three times what the first opening took, at least a minute.

Device memory that something may still read or write is never freed: if post-processing does not
hand back an output set (Ascend outputs are views on device memory) or a preparer does not finish
writing an input slot within a bound, the leaving incarnation keeps its device open, knowingly
leaked, counted in `leaked_openings` and logged.

The next opening's backend is constructed (which touches no device) before the current one is
released: a runtime shared by the whole process and finalised when its last user leaves (pyACL,
which can be initialised only once per process) must stay initialised across the restart of a
process's only card.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from ..backends.base import Backend
from ..backoff import Backoff
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig
from ..detector import Detector
from ..health.progress import ProgressTracker
from ..metrics import BucketCounts, LatencyWindow, RateMeter
from ..model import identity
from .batcher import Batcher
from .post import PostStage
from .slots import BatchBuffer, OutputSet

log = logging.getLogger(__name__)

#: how often the supervisor looks for a hung call or a due restart (real time; deadlines use the clock)
SUPERVISE_EVERY_S = 0.05
#: a reopening may take OPEN_DEADLINE_FACTOR times the first opening, and at least OPEN_DEADLINE_MIN_S
OPEN_DEADLINE_FACTOR = 3.0
OPEN_DEADLINE_MIN_S = 60.0
#: how long a leaving device waits (real time) for post-processing to hand back its output sets
OUTPUT_WAIT_S = 10.0
#: device call bounds (s) of the `yoloedge_inference_seconds` histogram (web.metrics).
INFERENCE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class WorkerState(str, Enum):
    STARTING = "starting"  # loading the model, allocating, warming up (the first time)
    RUNNING = "running"  # serving batches
    BACKOFF = "backoff"  # the device failed or hung and was let go; waiting to open it again
    WAITING_FOR_HUNG = "hung-wait"  # due to open again, but max_hung abandoned calls run
    RESTARTING = "restarting"  # opening the device again on a fresh thread
    FAILED = "failed"  # could not start at all (startup_error says why); not retried
    STOPPED = "stopped"  # stopped and its device released

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed or hung device is opened again: after `first_delay_s`, doubling with every
    failed attempt up to `max_delay_s`; a device that has run `healthy_reset_s` without failing
    starts again from `first_delay_s`. Quick for a one-off fault, never a tight loop for a card
    that stays broken. The daemon uses the defaults; tests pass their own."""

    first_delay_s: float = 1.0
    max_delay_s: float = 60.0
    healthy_reset_s: float = 60.0
    max_hung: int = 2  # abandoned calls left running per device before restarts wait for one

    def backoff(self) -> Backoff:
        return Backoff(self.first_delay_s, self.max_delay_s, reset_after_s=self.healthy_reset_s)


def _error_backoff() -> Backoff:
    """Between failed inferences of a device that has not given up yet (see `_inference_failed`)."""
    return Backoff(0.2, 5.0)


class Incarnation:
    """One life of a device worker: the thread that opened the backend and everything it owns.
    Output sets point here, so a late output set goes back to the life that made it."""

    def __init__(self, worker: DeviceWorker, generation: int):
        self.worker = worker
        self.generation = generation
        #: the batcher's key for its buffers: a late `release` of an abandoned life finds no owner
        self.owner = f"{worker.worker_name}#{generation}"
        suffix = f"#{generation}" if generation > 1 else ""
        self.thread = threading.Thread(target=worker._live, args=(self,), name=f"worker-{worker.worker_name}{suffix}",
                                       daemon=True)
        self.detector: Detector | None = None
        self.free_outputs: queue.SimpleQueue[OutputSet] = queue.SimpleQueue()
        self.outputs_back = threading.Condition()  # notified whenever an output set comes back
        self.output_sets = 0
        self.open_error: str | None = None  # opening the device failed
        self.failure: str | None = None  # it served, then gave up (too many failures in a row)
        self.abandoned = False  # its call hung: nothing it does from now on counts
        self.busy_since: float | None = None  # a device call (open or run) started then
        self.running: BatchBuffer | None = None  # the batch on the device
        self.stop = threading.Event()
        self.buffers_out = threading.Event()  # its input sets left the batcher: no preparer writes them
        self.keep_open: str | None = None  # why its device memory must not be freed (see `_leak`)
        self.done = threading.Event()  # its thread ends: the device is released (or knowingly leaked)

    @property
    def loaded(self) -> Detector:
        if self.detector is None:
            raise RuntimeError(f"{self.owner}: the device has not started")
        return self.detector

    @property
    def in_flight(self) -> bool:
        return self.running is not None

    def release_output_set(self, output_set: OutputSet) -> None:
        with self.outputs_back:
            self.free_outputs.put(output_set)
            self.outputs_back.notify_all()


class DeviceWorker:
    """A device's supervisor: starts an incarnation, replaces it when it fails or hangs, reports."""

    def __init__(self, name: str, accelerator: AcceleratorConfig, device: int, model: ModelConfig,
                 batcher: Batcher, post: PostStage, tracker: ProgressTracker,
                 backend_factory: Callable[[], Backend], clock: Callable[[], float] = time.monotonic,
                 restart: RestartPolicy = RestartPolicy()):
        self.name = f"worker-{name}"
        self.worker_name = name
        self.accelerator = accelerator
        self.device = device
        self.model = model
        self.batcher = batcher
        self.post = post
        self.tracker = tracker
        self.restart = restart
        self._backend_factory = backend_factory
        self._clock = clock
        self.ready = threading.Event()
        self.startup_error: str | None = None
        self.state = WorkerState.STARTING
        self._stop_event = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # state, the current incarnation, abandonment
        self._current: Incarnation | None = None
        self._hung: list[Incarnation] = []  # abandoned incarnations whose call has not returned yet
        self._generation = 0
        self._backoff = restart.backoff()
        self._error_backoff = _error_backoff()
        self._first_open_s: float | None = None  # how long the first opening took (on the clock)
        self._model_files: tuple[identity.FileDigest, ...] = ()  # what the first opening loaded
        self._running_since: float | None = None
        self._last_detector: Detector | None = None
        self._spare: Backend | None = None  # the next opening's backend (see the module docstring)
        self._supervisor = threading.Thread(target=self._supervise, name=f"supervise-{name}", daemon=True)
        self.restarts = 0
        self.last_error: str | None = None
        self.next_retry_mono: float | None = None
        self.inferences = RateMeter(clock=clock)
        self.frames_done = RateMeter(clock=clock)
        #: device seconds per second: the device's utilisation; its total is the busy time so far
        self.busy = RateMeter(clock=clock)
        self.infer_ms = LatencyWindow()
        self.batch_sizes = LatencyWindow()
        #: for /metrics: cumulative, where the windows above forget
        self.infer_buckets = BucketCounts(INFERENCE_BUCKETS_S)
        self.batch_buckets = BucketCounts(batch_bounds(accelerator.batch))
        self.errors = 0
        self.consecutive_errors = 0
        self.frames_lost = 0
        self.leaked_openings = 0  # incarnations left open because their memory might still be in use

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.tracker.register(self.worker_name, self.accelerator.inference_timeout_s)
        self._spawn()
        self._supervisor.start()

    def stop(self) -> None:
        self._stop_event.set()
        inc = self._current
        if inc is not None:
            inc.stop.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        self._supervisor.join(timeout)

    def is_alive(self) -> bool:
        return self._supervisor.is_alive()

    @property
    def native_id(self) -> int | None:
        """The current device thread's id (its priority is the device's)."""
        inc = self._current
        return inc.thread.native_id if inc is not None else None

    @property
    def detector(self) -> Detector | None:
        """The model as last opened: its description outlives a restart (same model, same format)."""
        return self._last_detector

    @property
    def loaded(self) -> Detector:
        detector = self._last_detector
        if detector is None:
            raise RuntimeError(f"{self.worker_name}: the device has not started")
        return detector

    @property
    def in_flight(self) -> bool:
        inc = self._current
        return inc is not None and inc.in_flight

    @property
    def hung_calls(self) -> int:
        """Abandoned calls still running (no lock: status must never wait for the supervisor)."""
        return len(self._hung)

    @property
    def open_deadline_s(self) -> float:
        """How long a reopening may take before it is abandoned (see the module docstring)."""
        first = self._first_open_s
        return max(OPEN_DEADLINE_MIN_S, OPEN_DEADLINE_FACTOR * (first or 0.0))

    def _spawn(self) -> None:
        with self._lock:
            if self._stop_event.is_set():  # stop() came between the supervisor's check and now
                return
            self._generation += 1
            inc = Incarnation(self, self._generation)
            self._current = inc
            self.state = WorkerState.STARTING if self._generation == 1 else WorkerState.RESTARTING
            self.next_retry_mono = None
        inc.thread.start()

    # -- the supervisor ----------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stop_event.is_set():
            self._wake.wait(SUPERVISE_EVERY_S)
            self._wake.clear()
            if self._stop_event.is_set() or self.state is WorkerState.FAILED:
                break
            self._tick(self._clock())
        inc = self._current
        if inc is not None:
            inc.stop.set()
            inc.done.wait()  # a hung call keeps this supervisor (and join) waiting, as before
        self._discard_spare()
        with self._lock:
            if self.state is not WorkerState.FAILED:
                self.state = WorkerState.STOPPED
        self.tracker.unregister(self.worker_name)
        self.ready.set()

    def _reserve_spare(self) -> None:
        """Construct the backend of the next opening now, while this one still holds the runtime."""
        with self._lock:
            if self._spare is not None or self._stop_event.is_set():
                return
        try:  # outside the lock: constructing a backend may take a while, status must not wait
            spare = self._backend_factory()
        except Exception:  # noqa: BLE001 - the next opening constructs it (and reports why not)
            log.exception("%s: cannot prepare the backend for the next opening", self.worker_name)
            return
        with self._lock:
            kept = self._spare is None and not self._stop_event.is_set()
            if kept:
                self._spare = spare
        if not kept:  # someone else reserved one, or we are stopping
            self._close_spare(spare)

    def _take_spare(self) -> Backend:
        with self._lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None else self._backend_factory()

    def _discard_spare(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            self._close_spare(spare)

    def _close_spare(self, spare: Backend) -> None:
        try:
            spare.close()  # never opened: releases only its claim on the runtime
        except Exception:  # noqa: BLE001 - logged; stopping goes on
            log.exception("%s: error while discarding the unused backend", self.worker_name)

    def _tick(self, now: float) -> None:
        """One look at the device: hung, gone, or due for a restart. Under the lock it only decides
        and changes state; the batcher, the tracker and the log are called after it, so status()
        never waits for them."""
        abandoned: tuple[Incarnation, BatchBuffer | None, str] | None = None
        ended: str | None = None
        delay: float | None = None
        spawn = False
        waiting: int | None = None
        with self._lock:
            inc = self._current
            if inc is not None and inc.busy_since is not None:
                call, deadline = self._call_deadline()
                running = now - inc.busy_since
                if deadline is not None and running > deadline:
                    hang = f"{call} running for {running:.1f} s (deadline {deadline:g} s)"
                    inc.abandoned = True
                    inc.stop.set()
                    self._hung.append(inc)
                    abandoned = (inc, inc.running, hang)
                    delay = self._retry_later(hang, now)
            elif inc is not None and inc.done.is_set() and self.state is not WorkerState.FAILED:
                if inc.failure is None and inc.open_error is None and not inc.stop.is_set():
                    ended = "the device thread ended unexpectedly"
                reason = inc.failure or inc.open_error or ended
                if reason is not None:
                    delay = self._retry_later(reason, now)
            elif self.state in (WorkerState.BACKOFF, WorkerState.WAITING_FOR_HUNG):
                spawn, waiting = self._reopen_due(now)
        if abandoned is not None:
            self._let_go(*abandoned)
        if ended is not None:
            log.error("%s: %s", self.worker_name, ended, extra={"device": self.worker_name})
            self.tracker.abandoned(self.worker_name, ended)
            self.batcher.set_down(self.worker_name, True)
        if delay is not None:
            log.warning("%s: opening the device again in %.1f s", self.worker_name, delay,
                        extra={"device": self.worker_name})
        if waiting is not None:
            log.warning("%s: %d abandoned device call(s) still running, the most allowed: the device waits for "
                        "one to return before it is opened again", self.worker_name, waiting,
                        extra={"device": self.worker_name})
        if spawn:
            self._spawn()

    def _reopen_due(self, now: float) -> tuple[bool, int | None]:
        """Whether to open the device again now (callers hold the lock). Past its backoff with
        `max_hung` abandoned calls still running it waits for one to return instead, with no retry
        time to show, since that depends on the hung call; the first time, it returns their number
        for the one log line that says so."""
        if self.state is WorkerState.BACKOFF and (self.next_retry_mono is None or now < self.next_retry_mono):
            return False, None
        if len(self._hung) < self.restart.max_hung:
            return True, None
        if self.state is WorkerState.WAITING_FOR_HUNG:
            return False, None
        self.state = WorkerState.WAITING_FOR_HUNG
        self.next_retry_mono = None
        return False, len(self._hung)

    def _call_deadline(self) -> tuple[str, float | None]:
        """The device call running now and how long it may run (callers hold the lock)."""
        if self.state is WorkerState.STARTING:
            return "first opening of the device", None  # start-up waits for it, see the module docstring
        if self.state is WorkerState.RESTARTING:
            return "reopening of the device", self.open_deadline_s
        return "inference", self.accelerator.inference_timeout_s

    def _let_go(self, inc: Incarnation, running: BatchBuffer | None, reason: str) -> None:
        """The call hangs: take this life's buffers out without waiting for the call (supervisor
        thread, no lock held). The abandoned thread frees its device itself once its call returns,
        but not before its buffers are out of the batcher."""
        try:
            log.error("%s: %s; abandoning the call and restarting the device", self.worker_name, reason,
                      extra={"device": self.worker_name})
            self.tracker.abandoned(self.worker_name, reason)
            self.batcher.set_down(self.worker_name, True)
            if running is not None:
                self._give_up(running, "the device call hung")
            self._remove_buffers(inc, "the device hung")
        finally:
            inc.buffers_out.set()

    def _retry_later(self, reason: str, now: float) -> float:
        """Back off, then open the device again (callers hold the lock); returns the delay."""
        healthy_for = None if self._running_since is None else now - self._running_since
        delay = self._backoff.next_delay(healthy_for)
        self._current = None
        self.state = WorkerState.BACKOFF
        self.last_error = reason
        self._running_since = None
        self.next_retry_mono = now + delay
        return delay

    # -- one incarnation's thread ------------------------------------------------------------
    def _live(self, inc: Incarnation) -> None:
        """The whole life of one incarnation. Whatever happens on it, the device is left (or
        knowingly leaked), `done` and `ready` are set and the supervisor is told why."""
        try:
            serving = False
            try:
                self._open(inc)
                serving = self._serve_from(inc)
            except Exception as exc:  # noqa: BLE001 - any start-up failure is reported, not raised
                self._open_failed(inc, f"{type(exc).__name__}: {exc}")
            while serving and not inc.stop.is_set():
                buffer = self.batcher.next_batch(inc.owner, inc.stop)
                if buffer is not None:
                    self._process(inc, buffer)
        except Exception as exc:  # noqa: BLE001 - a bug or a host failure: the device is restarted
            self._thread_failed(inc, exc)
        finally:
            self.ready.set()  # start-up never waits for a thread that is gone
            try:
                self._leave(inc)
            finally:
                self._finish(inc)

    def _thread_failed(self, inc: Incarnation, exc: Exception) -> None:
        reason = f"the device thread failed: {type(exc).__name__}: {exc}"
        log.error("%s: %s", self.worker_name, reason, exc_info=exc, extra={"device": self.worker_name})
        with self._lock:
            inc.running = inc.busy_since = None
            inc.failure = reason
            inc.stop.set()
            owned = not inc.abandoned
        if owned:
            self.tracker.abandoned(self.worker_name, reason)  # not busy any more, and unhealthy

    def _open(self, inc: Incarnation) -> None:
        acc = self.accelerator
        with self._lock:
            started = inc.busy_since = self._clock()  # under the open deadline, see _call_deadline
        if inc.generation > 1:  # the same model as the first opening, or none (see `model.identity`)
            identity.check_unchanged(self._model_files)
        backend = self._take_spare()
        if inc.generation > 1:
            self._reserve_spare()  # this opening may fail and release the runtime
        sets = output_sets_for(acc)
        inc.detector = Detector(self.model, backend, max_batch=acc.batch, input_sets=acc.input_buffers,
                                output_sets=sets)
        inc.detector.warm_up()
        inc.output_sets = sets
        for index in range(sets):
            inc.free_outputs.put(OutputSet(inc, index, inc.detector.max_batch))
        if inc.generation == 1:
            # After loading, so a missing or bad file is reported by the backend as it always was;
            # on this thread and off the lock: hashing a large model takes a while.
            self._model_files = identity.record(self.model)
            self._first_open_s = max(0.0, self._clock() - started)
        log.info("%s ready: %s, batch %d, %d input and %d output buffers", self.worker_name,
                 backend.description, inc.detector.max_batch, acc.input_buffers, sets,
                 extra={"device": self.worker_name})

    def _open_failed(self, inc: Incarnation, error: str) -> None:
        with self._lock:
            inc.busy_since = None
            inc.open_error = error
            if inc.generation == 1:
                self.startup_error = error
                self.state = WorkerState.FAILED
        if inc.generation == 1:
            log.error("%s: cannot start: %s", self.worker_name, error, extra={"device": self.worker_name})
        elif not inc.abandoned:
            log.error("%s: cannot open the device again: %s", self.worker_name, error,
                      extra={"device": self.worker_name})

    def _serve_from(self, inc: Incarnation) -> bool:
        """Lend the input sets to the batcher and report RUNNING; False if this life was let go
        while it opened (then it only releases what it opened)."""
        with self._lock:
            inc.busy_since = None
            current = not inc.abandoned and not inc.stop.is_set()
            if current:
                self._last_detector = inc.loaded
                self.state = WorkerState.RUNNING
                self._running_since = self._clock()
                restarted = inc.generation > 1
                if restarted:
                    self.restarts += 1
                    self.consecutive_errors = 0
                    self._error_backoff.reset()
        if current:
            self.batcher.add_buffers(inc.owner, list(inc.loaded.backend.input_buffers), device=self.worker_name)
            self.batcher.set_down(self.worker_name, False)
            if restarted:
                self.tracker.mark_healthy(self.worker_name)
                log.warning("%s: device open again (restart %d)", self.worker_name, self.restarts,
                            extra={"device": self.worker_name})
        self.ready.set()
        return current

    def _leave(self, inc: Incarnation) -> None:
        """Give back the buffers, wait for post-processing to return the output sets, release the
        device (on this thread) unless its memory may still be in use."""
        if inc.abandoned:
            inc.buffers_out.wait()  # the supervisor takes them out (bounded by the batcher's wait)
        else:
            if inc.failure is not None:
                self.batcher.set_down(self.worker_name, True)
            self._remove_buffers(inc, "the device failed" if inc.failure is not None else "the device stopped")
            inc.buffers_out.set()
        # Always, a normal stop included: workers stop before post-processing, which may still read
        # the last outputs, views of device-side memory (pinned host memory on TensorRT and Ascend).
        self._await_output_sets(inc)
        if inc.failure is not None:
            self._reserve_spare()
        if inc.keep_open is not None:
            self._leak(inc)
        else:
            self._close_device(inc)

    def _remove_buffers(self, inc: Incarnation, reason: str) -> None:
        """Take this life's input sets out of the batcher, giving up the frames they held. One that
        a preparer still writes after the batcher's wait keeps the device open (see `_leak`)."""
        lost = self.batcher.remove_buffers(inc.owner)
        for buffer in lost:
            self._give_up(buffer, reason)
        if any(not b.ready for b in lost):
            inc.keep_open = "a preparer is still writing into its input buffers"

    def _await_output_sets(self, inc: Incarnation) -> None:
        """Post-processing may still read outputs in this device's memory: wait (bounded) for it to
        hand every output set back; if it does not, the device is not released."""
        deadline = time.monotonic() + OUTPUT_WAIT_S
        with inc.outputs_back:
            while inc.free_outputs.qsize() < inc.output_sets and not self.post.stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    inc.keep_open = "post-processing still holds its output sets"
                    return
                # woken by every returned set; the slice only notices a post stage that stopped
                inc.outputs_back.wait(min(remaining, 0.5))

    def _leak(self, inc: Incarnation) -> None:
        """Keep this life's device memory allocated for good: freeing it while something may still
        read or write it would be a use-after-free. Costs one opening's memory; counted and logged."""
        with self._lock:
            self.leaked_openings += 1
            count = self.leaked_openings
        log.error("%s: %s; its device memory is left allocated (%d opening(s) leaked so far)",
                  self.worker_name, inc.keep_open, count, extra={"device": self.worker_name})

    def _close_device(self, inc: Incarnation) -> None:
        if inc.detector is not None:
            try:
                inc.detector.close()
            except Exception:  # noqa: BLE001 - teardown continues; the failure is logged
                log.exception("%s: error while releasing the device", self.worker_name)

    def _finish(self, inc: Incarnation) -> None:
        """This life's thread ends: it no longer counts as a hung call; the supervisor looks."""
        with self._lock:
            if inc in self._hung:
                self._hung.remove(inc)
        inc.done.set()
        self._wake.set()

    # -- the hot path -------------------------------------------------------------------------
    def _process(self, inc: Incarnation, buffer: BatchBuffer) -> None:
        output_set = self._acquire_output_set(inc)
        if output_set is None:  # stopping while post-processing holds every output set
            self.batcher.release(buffer)
            self._give_up(buffer, "stopping")
            return
        n = buffer.claimed
        with self._lock:
            inc.running = buffer
            started = inc.busy_since = self._clock()
            if not inc.abandoned:
                self.tracker.busy(self.worker_name)
        try:
            outputs = inc.loaded.backend.run(n, buffer.index, output_set.index)
        except Exception as exc:  # noqa: BLE001 - a failed batch must not kill the worker
            with self._lock:
                inc.running = inc.busy_since = None
                if inc.abandoned:  # its ticket and frames were given up already
                    inc.release_output_set(output_set)
                    return
            self._give_up(buffer, None)
            self.batcher.release(buffer)
            inc.release_output_set(output_set)
            self._inference_failed(inc, exc, n)
            return
        with self._lock:
            finished = self._clock()
            inc.running = inc.busy_since = None
            if inc.abandoned:  # too late: the batch was given up when the call was abandoned
                inc.release_output_set(output_set)
                return
        self.tracker.idle(self.worker_name)
        # The frames' details move on with the outputs; the input set is refilled at once.
        output_set.metas, buffer.metas = buffer.metas, output_set.metas
        output_set.outputs, output_set.count, output_set.ticket = outputs, n, buffer.ticket
        output_set.started_mono, output_set.inferred_mono = started, finished
        self.batcher.release(buffer)
        try:
            self.post.submit(output_set)
        except Exception:
            # Post-processing may or may not hold the set now: it is not reused (the device is
            # left, see `_await_output_sets`), and its ticket is given up so publishing goes on.
            self.frames_lost += sum(1 for m in output_set.metas[:n] if m.valid)
            self.post.skip(output_set.ticket)
            raise
        self._count_success(n, finished - started)

    def _count_success(self, n: int, seconds: float) -> None:
        if self.consecutive_errors:
            self.tracker.mark_healthy(self.worker_name)
            self.consecutive_errors = 0
            self._error_backoff.reset()
        self.busy.mark(seconds)
        self.infer_ms.add(seconds * 1000)
        self.batch_sizes.add(n)
        self.infer_buckets.add(seconds)
        self.batch_buckets.add(n)
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

    def _inference_failed(self, inc: Incarnation, exc: Exception, frames: int) -> None:
        self.consecutive_errors += 1
        given_up = self.consecutive_errors >= self.accelerator.max_consecutive_errors
        # The call is over either way: clear its busy mark, or a card that recovers would still
        # show "inference running for N s" and stop the watchdog (and counts were off by one).
        self.tracker.failed(self.worker_name, exc)
        if given_up:
            inc.failure = f"{self.consecutive_errors} inferences failed in a row: {exc}"
            self.tracker.mark_unhealthy(self.worker_name, inc.failure)
        self.errors += 1  # after the tracker: whoever sees the count sees the health that goes with it
        log.error("%s: inference failed (%d in a row), %d frame(s) lost: %s", self.worker_name,
                  self.consecutive_errors, frames, exc, extra={"device": self.worker_name})
        if given_up:
            inc.stop.set()  # leave the loop: the device is released and opened again
            return
        # A failing device is retried, but not in a tight loop.
        inc.stop.wait(self._error_backoff.next_delay())

    def _acquire_output_set(self, inc: Incarnation) -> OutputSet | None:
        while True:
            try:
                return inc.free_outputs.get(timeout=0.2)
            except queue.Empty:
                if inc.stop.is_set() and (self.post.stopped or inc.abandoned or inc.failure):
                    return None

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict:
        inc = self._current
        detector = inc.detector if inc is not None and not inc.done.is_set() else None
        retry = self.next_retry_mono
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
            "in_flight": self.in_flight,  # a batch is on the device now
            "errors": self.errors,
            "frames_lost": self.frames_lost,
            "rebalanced": self.batcher.rebalanced_to(self.worker_name),
            "restarts": self.restarts,
            "last_error": self.last_error,
            "next_retry_in_s": None if retry is None else round(max(0.0, retry - self._clock()), 1),
            "hung_calls": self.hung_calls,
            "leaked_openings": self.leaked_openings,
            "description": detector.backend.description if detector else "",
            "error": self.startup_error,
            "telemetry": detector.backend.telemetry() if detector else None,
        }


def batch_bounds(batch: int) -> tuple[float, ...]:
    """1, 2, 4... up to the configured batch, which is a bound itself: a full batch is its own bucket."""
    return tuple(sorted({float(2 ** i) for i in range(batch.bit_length()) if 2 ** i < batch} | {float(batch)}))


def output_sets_for(accelerator: AcceleratorConfig) -> int:
    """One output set per input set, plus one being post-processed while the device writes."""
    return accelerator.input_buffers + 1
