"""`yoloedge run`: start the daemon (normally from systemd).

SIGHUP, SIGTERM and SIGINT are blocked from `cli.main`'s first line until the daemon's handlers
are in place (`Daemon._install_signal_handlers` unblocks them). Before, a SIGHUP while the
modules were still importing killed the process with status 129, which systemd counts as a
clean exit. Blocked, a signal waits: a reload asked for during start-up is applied once the
daemon runs, a stop ends the start-up cleanly (exit 0), and a config error still exits 78.
Blocking rather than ignoring keeps the request instead of losing it; what remains is the
interpreter's own start-up before the first line of yoloedge runs.
"""

from __future__ import annotations

import argparse
import os
import signal

DEFAULT_CONFIG = "/etc/yoloedge/yoloedge.yaml"
#: the signals the daemon handles, held back until it does.
DAEMON_SIGNALS = frozenset({signal.SIGHUP, signal.SIGTERM, signal.SIGINT})


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
