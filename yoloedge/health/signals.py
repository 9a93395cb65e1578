"""The signals `yoloedge run` handles, and what each one means to it.

    SIGTERM, SIGINT   stop: drain, publish `stopped`, exit 0 (a second one: exit at once)
    SIGHUP            reload the configuration file
    SIGUSR1           write the status summary (what `yoloedge-ctl status` prints) to the log
    SIGXCPU           the CPU time limit (systemd `LimitCPU=`, `ulimit -t`) is reached: stop
                      cleanly, exit 1, before the kernel's SIGKILL at the hard limit
    SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO (= SIGPOLL), SIGPWR, SIGSTKFLT and the realtime
    signals SIGRTMIN..SIGRTMAX: ignored, with one log line

Every one of these ends a process by default, at once and without a word: no `stopped` status
(MQTT subscribers get the Last Will), the in-memory queue lost. logrotate scripts send SIGUSR1
to whatever they rotate for, timers and profilers raise SIGALRM/SIGVTALRM/SIGPROF, a UPS tool
SIGPWR, and `kill -USR2` or `kill -34` may be typed at the wrong pid; none of that may cost the
service. A repeated ignored signal is logged again at most once a minute, with its count, and
the status summary at most once a second, so a tool sending one in a loop cannot flood the log.

Left alone, on purpose:

* SIGPIPE and SIGXFSZ, which Python ignores from the start: the write that caused one fails with
  EPIPE or EFBIG where it happened, and is reported there;
* SIGQUIT and the fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS),
  whose core dump is the point of sending or raising them;
* the job-control stops (SIGTSTP, SIGTTIN, SIGTTOU; SIGSTOP cannot be caught): they suspend the
  process without ending it, and SIGCONT resumes it;
* the signals whose default is to do nothing (SIGCHLD, SIGURG, SIGWINCH, SIGCONT).

The signals are received on a thread of their own and the Python-level handlers do nothing
(`SignalDispatcher` says why): the signal's number goes through a pipe to that thread, which
sets the stop and reload flags and counts the rest for the main loop, which logs them
(`SignalInbox.due`). The daemon takes over a signal only while its
disposition is still the default: one that a library installed a handler for, or that Python
ignores, stays as it is.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from enum import Enum
from typing import Callable, Iterable, Mapping

log = logging.getLogger(__name__)

#: the same ignored signal is logged again at most this often, with how many arrived meanwhile
IGNORED_LOG_INTERVAL_S = 60.0
#: SIGUSR1 writes the status at most this often; requests meanwhile are answered by the next one
STATUS_LOG_INTERVAL_S = 1.0


class SignalAction(str, Enum):
    STOP = "stop"
    RELOAD = "reload"
    LOG_STATUS = "log the status"
    CPU_LIMIT = "stop: CPU time limit"
    IGNORE = "ignore"

    def __str__(self) -> str:
        return self.value


def _present(*names: str) -> list[int]:
    """The signals of this platform among `names` (SIGSTKFLT and SIGPWR are Linux's)."""
    return [int(getattr(signal, name)) for name in names if hasattr(signal, name)]


def _realtime() -> list[int]:
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    return list(range(int(low), int(high) + 1)) if low is not None and high is not None else []


def _actions() -> dict[int, SignalAction]:
    actions = {int(signal.SIGTERM): SignalAction.STOP, int(signal.SIGINT): SignalAction.STOP,
               int(signal.SIGHUP): SignalAction.RELOAD, int(signal.SIGUSR1): SignalAction.LOG_STATUS}
    actions.update({signum: SignalAction.CPU_LIMIT for signum in _present("SIGXCPU")})
    ignored = _present("SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT")
    actions.update({signum: SignalAction.IGNORE for signum in ignored + _realtime()})
    return actions


#: every signal the daemon handles; `yoloedge run` holds them all back until its handlers are in
#: place (see `cli.run`)
SIGNAL_ACTIONS: Mapping[int, SignalAction] = _actions()

_INTERVALS = {SignalAction.LOG_STATUS: STATUS_LOG_INTERVAL_S, SignalAction.IGNORE: IGNORED_LOG_INTERVAL_S}


def signal_name(signum: int) -> str:
    """'SIGUSR2', 'SIGIO', 'SIGRTMIN+3'."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        pass
    low = getattr(signal, "SIGRTMIN", None)
    if low is not None and signum > low:
        return f"SIGRTMIN+{signum - low}"
    return f"signal {signum}"


class SignalInbox:
    """Counts the signals that neither stop nor reload the daemon (`record`, from the dispatcher)
    and tells the main loop which to act on now (`due`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()  # the dispatcher records, the main loop takes
        self._received: dict[int, int] = {}
        self._next_at: dict[int, float] = {}  # signal -> earliest time to act on it again

    def record(self, signum: int) -> None:
        with self._lock:
            self._received[signum] = self._received.get(signum, 0) + 1

    def due(self, flush: bool = False) -> list[tuple[int, int]]:
        """(signal, how many arrived since it was last acted on) for each signal to act on now.
        One acted on less than its interval ago waits, counting, until the interval has passed;
        `flush` (shutdown) takes every waiting one at once."""
        now = self._clock()
        found = []
        with self._lock:
            for signum, count in list(self._received.items()):
                if not flush and now < self._next_at.get(signum, float("-inf")):
                    continue
                del self._received[signum]
                action = SIGNAL_ACTIONS.get(signum, SignalAction.IGNORE)
                self._next_at[signum] = now + _INTERVALS.get(action, 0.0)
                found.append((signum, count))
        return found


def _in_signal_context(signum: int, frame: object) -> None:
    """The Python-level handler: nothing. Installing it makes CPython's C handler write the
    signal's number to the wakeup pipe (and keeps the default action away); the work is done on
    the dispatcher's thread."""


class SignalDispatcher:
    """Signals turned into calls of `on_signal(signum)` on a thread of their own.

    Two things go wrong when signals are handled on the main thread:

    * a Python handler runs there between two bytecodes of whatever it interrupted; one that
      takes a lock (`threading.Event.set()` does) hangs for good when that code holds the same
      lock -- the main loop clearing the reload event, waiting on the stop event;
    * the C handler runs on the main thread's alternate signal stack, the small one faulthandler
      sets up (the stderr guard enables it), and CPython installs its handlers with SA_ONSTACK.
      Different signals arriving together nest there, one signal frame (a few kB with the CPU's
      vector state) per signal, past the end of that stack into the heap: a storm of SIGUSR1,
      SIGUSR2, SIGALRM, SIGPROF and a realtime signal during start-up ended in SIGSEGV.

    So the daemon's signals stay blocked on the main thread, and in every thread it starts,
    which inherit its mask, for the daemon's whole life, and only this thread unblocks them:
    the kernel delivers each one here, on an ordinary thread stack. The Python-level handler
    does nothing; CPython's C handler writes the signal's number to a pipe
    (`signal.set_wakeup_fd`) that this thread reads, and acts on it here, where taking locks is
    fine (and a stop request is seen even while the main thread sits in a long call into C).
    The pipe is non-blocking on the writing side: in a storm that fills it, the surplus
    signals are dropped, not waited for.

    Processes started from the daemon inherit the blocked mask; it starts none of its own.
    """

    def __init__(self, on_signal: Callable[[int], None]):
        self._on_signal = on_signal
        self._thread: threading.Thread | None = None

    def install(self, take_over: Iterable[int], unblock: Iterable[int]) -> None:
        """Main thread (set_wakeup_fd demands it), once: handle the signals in `take_over`, and
        receive every signal in `unblock` (those the daemon took over, and any a library
        handles itself) on this dispatcher's thread only."""
        unblock = frozenset(unblock)
        signal.pthread_sigmask(signal.SIG_BLOCK, unblock)  # cli.main did; callers from elsewhere may not
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for signum in take_over:
            signal.signal(signum, _in_signal_context)
        self._thread = threading.Thread(target=self._run, args=(read_end, unblock), name="signals", daemon=True)
        self._thread.start()

    def _run(self, read_end: int, unblock: frozenset[int]) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)  # what was held back arrives now
        while True:
            received = os.read(read_end, 512)
            if not received:
                return
            for signum in received:
                try:
                    self._on_signal(signum)
                except Exception:  # noqa: BLE001 - one failing action must not end signal handling
                    log.exception("acting on %s failed", signal_name(signum))
