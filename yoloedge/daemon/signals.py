"""The daemon's side of its signals: what each one sets, and what the main loop logs for them.

Signals only set flags, on the dispatcher's thread (`health.signals`): stop and reload set their
events, a second stop signal ends the process at once, SIGXCPU stops it cleanly, and the others
are counted for the main loop to log (`act`, SIGUSR1: the status). Nothing here takes a lock of
the daemon's; the events' own locks are never held by the thread the signal interrupts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

from ..control.statustext import format_status
from ..health.signals import SIGNAL_ACTIONS, SignalAction, SignalDispatcher, SignalInbox, signal_name
from .state import EXIT_FAILURE

log = logging.getLogger(__name__)


class DaemonSignals:
    def __init__(self, stop: threading.Event, reload: threading.Event, status: Callable[[], dict],
                 before_forced_exit: Callable[[], None]):
        self._stop = stop
        self._reload = reload
        self._status = status  # SIGUSR1 logs it
        #: run before a second signal ends the process at once: the stderr guard writes out what
        #: its pipe still holds (that signal's own message included), bounded
        self._before_forced_exit = before_forced_exit
        self._stops = 0  # stop signals received
        self._inbox = SignalInbox()  # signals that neither stop nor reload, for the main loop
        self.cpu_limit = False  # SIGXCPU: stopping because the CPU time limit is reached

    def install(self) -> None:
        """Hand the daemon's signals to a dispatcher thread (`health.signals`).

        `yoloedge run` blocks these from its first line (cli.main) so that a signal during
        imports and config loading waits instead of killing the process. They stay blocked on
        this thread; the dispatcher's thread unblocks them, and what waited arrives there: a
        pending stop stops the start-up, a pending reload is applied once running, the others
        are acted on (logged) then. Besides the stop and reload signals, only signals still at
        their default are taken over.
        """
        SignalDispatcher(self._on_signal).install(
            take_over=[signum for signum, action in SIGNAL_ACTIONS.items()
                       if action in (SignalAction.STOP, SignalAction.RELOAD)
                       or signal.getsignal(signum) is signal.SIG_DFL],
            unblock=SIGNAL_ACTIONS)

    def _on_signal(self, signum: int) -> None:
        """The signal thread, once per signal: stop and reload set their flags, the others are
        counted for the main loop to log (`act`)."""
        action = SIGNAL_ACTIONS.get(signum, SignalAction.IGNORE)
        if action is SignalAction.STOP:
            self._on_stop_signal()
        elif action is SignalAction.RELOAD:
            self._reload.set()
        else:
            self._inbox.record(signum)  # before the stop below: the shutdown logs it
            if action is SignalAction.CPU_LIMIT:
                # sent again every CPU second until the hard limit's SIGKILL: not a second stop
                self.cpu_limit = True
                self._stop.set()

    def act(self, flush: bool = False) -> None:
        """The main loop's side of the signals that are only counted: log them (SIGUSR1: the status)."""
        for signum, count in self._inbox.due(flush):
            name = signal_name(signum)
            times = f" ({count} times)" if count > 1 else ""
            action = SIGNAL_ACTIONS.get(signum)
            if action is SignalAction.LOG_STATUS:
                log.info("%s%s: status follows\n%s", name, times, format_status(self._status()))
            elif action is SignalAction.CPU_LIMIT:
                log.error("%s: the CPU time limit (LimitCPU=, ulimit -t) is reached; stopping cleanly "
                          "before the kernel kills the daemon", name)
            else:
                log.warning("received %s%s: ignored (SIGHUP reloads, SIGTERM stops, SIGUSR1 logs the status)",
                            name, times)

    def _on_stop_signal(self) -> None:
        self._stops += 1
        if self._stops > 1:
            os.write(2, b"yoloedge: second signal, exiting immediately\n")
            self._before_forced_exit()
            os._exit(EXIT_FAILURE)
        self._stop.set()
