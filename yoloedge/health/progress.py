"""Is any device worker making progress? The answer gates the systemd watchdog ping.

A hung accelerator call (driver stuck, device lost) blocks its worker thread forever; Python
cannot interrupt it. The worker's supervisor abandons such a call and opens the device again on a
fresh thread (see `pipeline.worker`), while the group's other devices go on serving. So each
worker reports `busy()` before an inference and `idle()` / `failed()` after it, `abandoned()`
when its call was given up, and the daemon sends WATCHDOG=1 while `making_progress()`: at least
one device is healthy. Only when none is does systemd restart the whole service; `check()` still
lists every problem for status.

A worker with nothing to do (no frames) is idle, and idle is healthy: a quiet night with no
camera traffic must not restart the daemon.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable


class Progress(str, Enum):
    IDLE = "idle"  # waiting for work, or between inferences: healthy
    BUSY = "busy"  # an inference is running (a problem once past its deadline)
    UNHEALTHY = "unhealthy"  # the worker reported itself broken

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Problem:
    """Why the daemon is not healthy, and which worker (or part) it belongs to: status marks that
    worker, and only that one, unhealthy (`ascend0/1` is not `ascend0/10`)."""

    source: str
    text: str

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


@dataclass(frozen=True)
class WorkerProgress:
    """One worker's state at the time of `ProgressTracker.snapshot()`, for status output."""

    name: str
    state: Progress
    busy_for_s: float | None  # how long the current inference has run; None when not busy
    deadline_s: float
    inferences: int
    errors: int
    consecutive_errors: int
    last_error: str | None
    unhealthy_reason: str | None


@dataclass
class _Worker:
    deadline_s: float
    max_consecutive_errors: int
    busy_since: float | None = None
    inferences: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None
    unhealthy_reason: str | None = None


class ProgressTracker:
    """Thread-safe record of what each registered worker is doing; the clock is injectable.

    Updating a name that is not registered raises KeyError: unregister a worker only after
    its thread has stopped.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}

    def register(self, name: str, deadline_s: float, *, max_consecutive_errors: int = 0) -> None:
        """Track `name`; an inference running longer than `deadline_s` is a problem.

        `max_consecutive_errors` > 0 also reports the worker once that many inferences in a
        row failed (0: failures alone never make it a problem).
        """
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        with self._lock:
            self._workers[name] = _Worker(deadline_s=deadline_s,
                                          max_consecutive_errors=max_consecutive_errors)

    def unregister(self, name: str) -> None:
        """Stop tracking `name` (its worker has exited); unknown names are ignored."""
        with self._lock:
            self._workers.pop(name, None)

    def busy(self, name: str) -> None:
        """An inference started now."""
        now = self._clock()
        with self._lock:
            self._get(name).busy_since = now

    def idle(self, name: str) -> None:
        """The inference finished successfully (or the worker waits for frames)."""
        with self._lock:
            worker = self._get(name)
            if worker.busy_since is not None:
                worker.inferences += 1
            worker.busy_since = None
            worker.consecutive_errors = 0

    def failed(self, name: str, error: BaseException | str) -> None:
        """The inference raised: the worker is responsive again, but count the failure."""
        with self._lock:
            worker = self._get(name)
            worker.busy_since = None
            worker.errors += 1
            worker.consecutive_errors += 1
            worker.last_error = _describe(error)

    def mark_unhealthy(self, name: str, reason: str) -> None:
        """The worker itself knows it is broken (device lost, session failed to load)."""
        with self._lock:
            self._get(name).unhealthy_reason = reason

    def abandoned(self, name: str, reason: str) -> None:
        """The worker gave up on its running call (it hung): no longer busy, unhealthy until
        `mark_healthy` (its device opened again)."""
        with self._lock:
            worker = self._get(name)
            worker.busy_since = None
            worker.unhealthy_reason = reason

    def mark_healthy(self, name: str) -> None:
        """Clear `mark_unhealthy` (the worker recovered, e.g. after re-opening its device)."""
        with self._lock:
            self._get(name).unhealthy_reason = None

    def check(self, now: float | None = None) -> list[Problem]:
        """Problems, e.g. str(p) == "onnxruntime0: inference running for 12.3 s (deadline 10 s)".

        Empty means every worker is idle or inside its deadline: safe to ping the watchdog.
        """
        now = self._clock() if now is None else now
        with self._lock:
            return [problem for name, worker in self._workers.items()
                    for problem in _problems(name, worker, now)]

    def making_progress(self, now: float | None = None) -> bool:
        """True while at least one worker has no problem (or none is registered): a card that is
        down while a sibling serves must not get the whole daemon restarted."""
        now = self._clock() if now is None else now
        with self._lock:
            return not self._workers or any(not _problems(name, worker, now)
                                            for name, worker in self._workers.items())

    def snapshot(self, now: float | None = None) -> list[WorkerProgress]:
        """Every worker's state, in registration order, for the status report."""
        now = self._clock() if now is None else now
        with self._lock:
            return [_progress(name, worker, now) for name, worker in self._workers.items()]

    def _get(self, name: str) -> _Worker:
        """Callers hold the lock. A KeyError here is a wiring bug worth seeing."""
        worker = self._workers.get(name)
        if worker is None:
            raise KeyError(f"worker {name!r} is not registered with the progress tracker")
        return worker


def _describe(error: BaseException | str) -> str:
    """Keep the exception type: "TimeoutError" alone says more than an empty message."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return error


def _problems(name: str, worker: _Worker, now: float) -> list[Problem]:
    """Why `worker` is not healthy at `now`; empty when it is."""
    problems = []
    if worker.unhealthy_reason is not None:
        problems.append(Problem(name, worker.unhealthy_reason))
    if worker.busy_since is not None:
        running = now - worker.busy_since
        if running > worker.deadline_s:
            problems.append(Problem(name, f"inference running for {running:.1f} s "
                                          f"(deadline {worker.deadline_s:g} s)"))
    if 0 < worker.max_consecutive_errors <= worker.consecutive_errors:
        problems.append(Problem(name, f"{worker.consecutive_errors} inferences in a row failed "
                                      f"(last: {worker.last_error})"))
    return problems


def _progress(name: str, worker: _Worker, now: float) -> WorkerProgress:
    """An immutable copy of `worker` (the live one is guarded by the tracker's lock)."""
    if worker.unhealthy_reason is not None:
        state = Progress.UNHEALTHY
    elif worker.busy_since is not None:
        state = Progress.BUSY
    else:
        state = Progress.IDLE
    return WorkerProgress(
        name=name, state=state,
        busy_for_s=None if worker.busy_since is None else now - worker.busy_since,
        deadline_s=worker.deadline_s, inferences=worker.inferences, errors=worker.errors,
        consecutive_errors=worker.consecutive_errors, last_error=worker.last_error,
        unhealthy_reason=worker.unhealthy_reason)
