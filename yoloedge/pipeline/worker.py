"""Device workers: one per accelerator device, owning its backends (one per model of its group),
doing nothing but execute.

Every device call (load, allocate, copy, execute, free) happens on one thread, as pyACL and CUDA
contexts require (see `incarnation`). Letterboxing happens on the preparers' threads, decode and
NMS on post-processing's, so the device is kept busy as long as the host can feed it. What the
worker has done is counted in its `WorkerStats` (`workerstats`).

Recovery. One such thread and what it opened is an `Incarnation`; the `DeviceWorker` is the
device's supervisor and outlives them. Whether a call is overdue is decided in one place, the
device's `DeviceHealth` record (`health.progress`): the incarnation notes each call there, the
supervisor abandons a call the record calls overdue, and the progress tracker gating the systemd
watchdog reads the same record. An incarnation whose inferences fail
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

Device memory that something may still read or write is never freed (see `incarnation`), and the
next opening's backend is constructed before the current one is released (see `spare`).

States move only through `_transition`, from the states listed in `ALLOWED_FROM`.

Locks: `lock` guards the state, the current incarnation, abandonment and each incarnation's
running call; it is held only to decide, never across a device call, the batcher, post-processing
or the log, so status never waits for them. It is taken before the health record's and the spare
backend's locks (both leaves).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

from ..backoff import Backoff
from ..config.schema import AcceleratorConfig
from .detector import Detector
from ..health.progress import DeviceHealth, ProgressTracker
from ..model import identity
from .incarnation import Incarnation
from .served import LoadedModel, ServedModel
from .slots import BatchBuffer
from .spare import SpareBackend
from .workerreport import worker_report
from .workerstats import WorkerStats

log = logging.getLogger(__name__)

#: how often the supervisor looks for a hung call or a due restart (real time; deadlines use the clock)
SUPERVISE_EVERY_S = 0.05
#: a reopening may take OPEN_DEADLINE_FACTOR times the first opening, and at least OPEN_DEADLINE_MIN_S
OPEN_DEADLINE_FACTOR = 3.0
OPEN_DEADLINE_MIN_S = 60.0


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


_S = WorkerState
#: the states each state may be entered from (STARTING is only the first)
ALLOWED_FROM: dict[WorkerState, frozenset[WorkerState]] = {
    _S.STARTING: frozenset(),
    _S.RUNNING: frozenset({_S.STARTING, _S.RESTARTING}),
    _S.BACKOFF: frozenset({_S.STARTING, _S.RUNNING, _S.RESTARTING}),
    _S.WAITING_FOR_HUNG: frozenset({_S.BACKOFF}),
    _S.RESTARTING: frozenset({_S.BACKOFF, _S.WAITING_FOR_HUNG}),
    _S.FAILED: frozenset({_S.STARTING, _S.RUNNING}),  # RUNNING: its buffers could not be lent out
    _S.STOPPED: frozenset({_S.STARTING, _S.RUNNING, _S.BACKOFF, _S.WAITING_FOR_HUNG, _S.RESTARTING}),
}


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


@dataclass(frozen=True)
class FirstOpening:
    """What the first opening loaded (a reopening must find the same files) and how long it took."""

    files: tuple[identity.FileDigest, ...]
    seconds: float


class DeviceWorker:
    """A device's supervisor: starts an incarnation, replaces it when it fails or hangs, reports."""

    def __init__(self, name: str, accelerator: AcceleratorConfig, device: int, served: Sequence[ServedModel],
                 tracker: ProgressTracker, clock: Callable[[], float] = time.monotonic,
                 restart: RestartPolicy = RestartPolicy()):
        if not served:
            raise ValueError(f"{name}: a device serves at least one model")
        self.worker_name = name
        self.accelerator = accelerator
        self.device = device
        self.served = tuple(served)  # the group's models, each with its batcher and post stage
        self.tracker = tracker
        self.restart = restart
        self.clock = clock
        self.stats = WorkerStats.for_batch(accelerator.batch, clock)
        self.health = DeviceHealth(name, clock)  # what the progress tracker reads
        self.ready = threading.Event()
        self.startup_error: str | None = None
        self.state = WorkerState.STARTING
        self.last_error: str | None = None
        self.next_retry_mono: float | None = None
        self.lock = threading.Lock()  # see the module docstring
        self._stop_event = threading.Event()
        self._wake = threading.Event()
        self.spares = [SpareBackend(name if len(served) == 1 else f"{name} {m.name}", m.factory, self._stop_event)
                       for m in served]
        self._backoff = restart.backoff()
        self._current: Incarnation | None = None
        self._hung: list[Incarnation] = []  # abandoned incarnations whose call has not returned yet
        self._generation = 0
        self._first: FirstOpening | None = None
        self._running_since: float | None = None
        self._last_models: tuple[LoadedModel, ...] = ()  # what the last opening served
        #: model name -> why the first opening could not load it (the others are served)
        self.failed_models: dict[str, str] = {}
        self._supervisor = threading.Thread(target=self._supervise, name=f"supervise-{name}", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.tracker.register(self.health)
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
        """The first model as last opened (see `detector_of`)."""
        models = self._last_models
        return models[0].detector if models else None

    def detector_of(self, model: str) -> Detector | None:
        """`model` as last opened: its description outlives a restart (same file, same format)."""
        return next((m.detector for m in self._last_models if m.name == model), None)

    @property
    def serving_models(self) -> frozenset[str]:
        """The models the first opening loaded: a reopening opens these again."""
        return frozenset(m.name for m in self.served) - self.failed_models.keys()

    def set_down(self, down: bool) -> None:
        """Tell every model's batcher this device is down (or serves again)."""
        for served in self.served:
            served.batcher.set_down(self.worker_name, down)

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
        first = self._first
        return max(OPEN_DEADLINE_MIN_S, OPEN_DEADLINE_FACTOR * (first.seconds if first else 0.0))

    @property
    def model_files(self) -> tuple[identity.FileDigest, ...]:
        """What the first opening loaded: a reopening must find the same (see `model.identity`)."""
        first = self._first
        return first.files if first else ()

    def _transition(self, to: WorkerState) -> None:
        """The one way the state changes (callers hold the lock); a move not in `ALLOWED_FROM` is a bug."""
        if self.state not in ALLOWED_FROM[to]:
            raise RuntimeError(f"{self.worker_name}: no transition from {self.state} to {to}")
        self.state = to

    def _spawn(self) -> None:
        with self.lock:
            if self._stop_event.is_set():  # stop() came between the supervisor's check and now
                return
            self._generation += 1
            inc = Incarnation(self, self._generation)
            self._current = inc
            if self._generation > 1:
                self._transition(WorkerState.RESTARTING)
            self.next_retry_mono = None
        inc.thread.start()

    # -- the supervisor ----------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stop_event.is_set():
            self._wake.wait(SUPERVISE_EVERY_S)
            self._wake.clear()
            if self._stop_event.is_set() or self.state is WorkerState.FAILED:
                break
            self._tick(self.clock())
        inc = self._current
        if inc is not None:
            inc.stop.set()
            inc.done.wait()  # a hung call keeps this supervisor (and join) waiting, as before
        for spare in self.spares:
            spare.discard()
        with self.lock:
            if self.state is not WorkerState.FAILED:
                self._transition(WorkerState.STOPPED)
        self.tracker.unregister(self.worker_name)
        self.ready.set()

    def _tick(self, now: float) -> None:
        """One look at the device: hung, gone, or due for a restart. Under the lock it only decides
        and changes state; the batcher, the health record's readers and the log come after it."""
        abandoned: tuple[Incarnation, list[tuple[LoadedModel, BatchBuffer]], str] | None = None
        ended: str | None = None
        delay: float | None = None
        spawn = False
        waiting: int | None = None
        with self.lock:
            inc = self._current
            hang = self.health.overdue(now) if inc is not None and inc.call is not None else None
            if inc is not None and hang is not None:
                inc.abandoned = True
                inc.stop.set()
                self._hung.append(inc)
                abandoned = (inc, list(inc.running), hang)
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
            self.health.abandon(ended)
            self.set_down(True)
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
        self._transition(WorkerState.WAITING_FOR_HUNG)
        self.next_retry_mono = None
        return False, len(self._hung)

    def _let_go(self, inc: Incarnation, running: list[tuple[LoadedModel, BatchBuffer]], reason: str) -> None:
        """The call hangs: take this life's buffers out without waiting for the call (supervisor
        thread, no lock held). The abandoned thread frees its device itself once its call returns,
        but not before its buffers are out of the batcher."""
        try:
            log.error("%s: %s; abandoning the call and restarting the device", self.worker_name, reason,
                      extra={"device": self.worker_name})
            self.health.abandon(reason)
            self.set_down(True)
            for model, buffer in running:  # everything in flight (two batches on a pipelining backend)
                inc.give_up(model, buffer, "the device call hung")
            inc.remove_buffers("the device hung")
        finally:
            inc.buffers_out.set()

    def _retry_later(self, reason: str, now: float) -> float:
        """Back off, then open the device again (callers hold the lock); returns the delay."""
        healthy_for = None if self._running_since is None else now - self._running_since
        delay = self._backoff.next_delay(healthy_for)
        self._current = None
        self._transition(WorkerState.BACKOFF)
        self.last_error = reason
        self._running_since = None
        self.next_retry_mono = now + delay
        return delay

    # -- what its incarnations report --------------------------------------------------------
    def first_opened(self, files: tuple[identity.FileDigest, ...], seconds: float) -> None:
        with self.lock:
            self._first = FirstOpening(files, seconds)

    def serving(self, inc: Incarnation) -> bool:
        """`inc` opened its device: lend its input sets to the batcher and report RUNNING; False if
        it was let go while it opened (then it only releases what it opened)."""
        with self.lock:
            inc.end_call()
            current = not inc.abandoned and not inc.stop.is_set()
            if current:
                self._last_models = tuple(inc.models)
                if inc.generation == 1:
                    self.failed_models = dict(inc.failed_models)
                self._transition(WorkerState.RUNNING)
                self._running_since = self.clock()
                restarted = inc.generation > 1
                if restarted:  # healthy with the state and the count: whoever sees one sees all three
                    self.health.healthy()
                    self.stats.restarts += 1
                    self.stats.consecutive_errors = 0
        if current:
            try:
                for model in inc.models:
                    backend = model.detector.backend
                    model.served.batcher.add_buffers(inc.owner, list(backend.input_buffers), device=self.worker_name,
                                                     device_slots=backend.device_inputs)
                self.set_down(False)
            except Exception as exc:
                if restarted:  # down again, a moment after it was reported healthy
                    self.health.unhealthy(f"{type(exc).__name__}: {exc}")
                raise
            if restarted:
                log.warning("%s: device open again (restart %d)", self.worker_name, self.stats.restarts,
                            extra={"device": self.worker_name})
        self.ready.set()
        return current

    def open_failed(self, inc: Incarnation, error: str) -> None:
        with self.lock:
            inc.end_call()
            inc.open_error = error
            if inc.generation == 1:
                self.startup_error = error
                self._transition(WorkerState.FAILED)
        if inc.generation == 1:
            log.error("%s: cannot start: %s", self.worker_name, error, extra={"device": self.worker_name})
        elif not inc.abandoned:
            log.error("%s: cannot open the device again: %s", self.worker_name, error,
                      extra={"device": self.worker_name})

    def finished(self, inc: Incarnation) -> None:
        """`inc`'s thread ends: it no longer counts as a hung call; the supervisor looks."""
        with self.lock:
            if inc in self._hung:
                self._hung.remove(inc)
        inc.done.set()
        self._wake.set()

    # -- status -------------------------------------------------------------------------------
    @property
    def incarnation(self) -> Incarnation | None:
        """The current opening of the device (None between openings); read without the lock."""
        return self._current

    def status(self) -> dict:
        return worker_report(self)
