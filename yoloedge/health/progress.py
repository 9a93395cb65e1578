"""Is any device making progress? The answer gates the systemd watchdog ping.

A hung accelerator call (driver stuck, device lost) blocks its worker thread forever; Python
cannot interrupt it. The worker's supervisor abandons such a call and opens the device again on a
fresh thread (see `pipeline.worker`), while the group's other devices go on serving.

One record per device decides, `DeviceHealth`: its worker notes each device call there (`begin`,
`end`) and why it is broken (`unhealthy`, `abandon`); the supervisor asks it whether the running
call is overdue (`overdue`) and acts on the answer; the `ProgressTracker` only reads the records
of the devices registered with it. The daemon sends WATCHDOG=1 while `making_progress()`: at
least one device has no problem. Only when none has does systemd restart the whole service;
`check()` still lists every problem for status.

A device with nothing to do (no frames) is idle, and idle is healthy: a quiet night with no
camera traffic must not restart the daemon.

Locks: each record's lock and the tracker's are leaves; a worker may hold its own lock while it
calls its record, and the tracker holds its lock while it reads the records (tracker -> record).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Problem:
    """Why the daemon is not healthy, and which worker (or part) it belongs to: status marks that
    worker, and only that one, unhealthy (`ascend0/1` is not `ascend0/10`)."""

    source: str
    text: str

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


@dataclass(frozen=True)
class DeviceCall:
    """One device call (an opening, an inference) and how long it may run; None: no bound."""

    what: str
    started: float
    deadline_s: float | None

    def overdue(self, now: float) -> str | None:
        """Why the call is overdue at `now`, e.g. "inference running for 12.3 s (deadline 10 s)";
        None while it is within its deadline (or has none)."""
        running = now - self.started
        if self.deadline_s is None or running <= self.deadline_s:
            return None
        return f"{self.what} running for {running:.1f} s (deadline {self.deadline_s:g} s)"


class DeviceHealth:
    """One device's running call and whether it is broken, on its worker's clock.

    `end` of a call that is no longer the running one (it was abandoned, a newer call began) does
    nothing: an abandoned thread whose call returns late cannot clear its successor's."""

    def __init__(self, name: str, clock: Callable[[], float]):
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._call: DeviceCall | None = None
        self._unhealthy: str | None = None

    def begin(self, what: str, deadline_s: float | None) -> DeviceCall:
        """A device call starts now; past `deadline_s` it is overdue."""
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        call = DeviceCall(what, self._clock(), deadline_s)
        with self._lock:
            self._call = call
        return call

    def end(self, call: DeviceCall) -> None:
        """The call returned (or raised): the device is responsive again."""
        with self._lock:
            if self._call is call:
                self._call = None

    def overdue(self, now: float | None = None) -> str | None:
        """The one judgement of a hang: the running call past its deadline, and why."""
        now = self._clock() if now is None else now
        with self._lock:
            call = self._call
        return None if call is None else call.overdue(now)

    def unhealthy(self, reason: str) -> None:
        """The device is broken (gave up after failures, its thread died) until `healthy`."""
        with self._lock:
            self._unhealthy = reason

    def abandon(self, reason: str) -> None:
        """The running call was given up (it hung): no call runs any more; unhealthy until
        `healthy` (the device opened again)."""
        with self._lock:
            self._call = None
            self._unhealthy = reason

    def healthy(self) -> None:
        """The device recovered (opened again, or an inference succeeded after failures)."""
        with self._lock:
            self._unhealthy = None

    def problems(self) -> list[Problem]:
        """Why this device is not healthy now; empty when it is."""
        hang = self.overdue()
        with self._lock:
            reason = self._unhealthy
        return [Problem(self.name, text) for text in (reason, hang) if text is not None]


class ProgressTracker:
    """The devices whose health gates the watchdog: each worker registers its record while it
    runs. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[str, DeviceHealth] = {}

    def register(self, health: DeviceHealth) -> None:
        with self._lock:
            self._devices[health.name] = health

    def unregister(self, name: str) -> None:
        """Stop reading `name` (its worker has exited); unknown names are ignored."""
        with self._lock:
            self._devices.pop(name, None)

    def check(self) -> list[Problem]:
        """Problems, e.g. str(p) == "onnxruntime0: inference running for 12.3 s (deadline 10 s)".

        Empty means every device is idle or inside its deadline: safe to ping the watchdog.
        """
        with self._lock:
            return [problem for health in self._devices.values() for problem in health.problems()]

    def making_progress(self) -> bool:
        """True while at least one device has no problem (or none is registered): a card that is
        down while a sibling serves must not get the whole daemon restarted."""
        with self._lock:
            return not self._devices or any(not health.problems() for health in self._devices.values())
