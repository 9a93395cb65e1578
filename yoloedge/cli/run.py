"""`yoloedge run`: start the daemon (normally from systemd).

Every signal the daemon handles (`health.signals`: SIGHUP, SIGTERM, SIGINT, SIGUSR1, SIGXCPU and
those it ignores with a log line) is blocked from `cli.main`'s first line until the daemon's
handlers are in place (`daemon.signals.DaemonSignals.install`; they then stay blocked on the main
thread and arrive on the daemon's signal thread, see `health.signals`). Before, a SIGHUP while
the modules were still importing killed the process with status 129, which systemd counts as a
clean exit, and a SIGUSR1 from a logrotate script killed it silently. Blocked, a signal waits: a
reload asked for during start-up is applied once the daemon runs, a stop ends the start-up
cleanly (exit 0), an ignored one is logged once the daemon runs, and a config error still exits
78. Blocking rather than ignoring keeps the request instead of losing it; what remains is the
interpreter's own start-up before the first line of yoloedge runs.
"""

from __future__ import annotations

import argparse
import os
import signal

from ..health.signals import SIGNAL_ACTIONS

DEFAULT_CONFIG = "/etc/yoloedge/yoloedge.yaml"
#: the signals the daemon handles, held back until it does.
DAEMON_SIGNALS = frozenset(SIGNAL_ACTIONS)


def hold_daemon_signals() -> set[int | signal.Signals]:
    """Block DAEMON_SIGNALS in this (main) thread; returns the mask to restore."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, DAEMON_SIGNALS)


def release_daemon_signals(previous: set[int | signal.Signals]) -> None:
    """Undo `hold_daemon_signals` for commands other than run: a pending signal acts now."""
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the detection daemon",
                       description="Run the daemon: cameras -> accelerators -> MQTT. "
                                   "Exits 78 on a configuration error before touching any device.")
    p.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"configuration file (default {DEFAULT_CONFIG})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..daemon import run_daemon

    return run_daemon(args.config, os.environ)
