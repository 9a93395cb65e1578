"""The daemon's own state, and the changes it may make: one table, checked by `Daemon._transition`;
and the exit codes it ends with.

starting -> running (models loaded, cameras started) <-> reloading (one attempt at a time, on the
main loop); any of the three -> stopping (the staged shutdown) -> stopped. A change the table does
not list is a bug in the daemon, not a condition to run on: it raises `IllegalTransition`.
"""

from __future__ import annotations

from enum import Enum


EXIT_OK = 0
EXIT_FAILURE = 1
#: another daemon owns the control socket, or its lock file cannot be created (sysexits
#: EX_CANTCREAT). Not 78 (the configuration is fine) and not 1; the unit lists it in
#: RestartPreventExitStatus so systemd does not retry every RestartSec while the other one runs.
EXIT_ALREADY_RUNNING = 73


class DaemonState(str, Enum):
    STARTING = "starting"  # loading models; the control socket already answers
    RUNNING = "running"
    RELOADING = "reloading"  # applying a new configuration file
    STOPPING = "stopping"  # staged shutdown under way
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


#: each state, and the states it may be entered from
ALLOWED_FROM: dict[DaemonState, frozenset[DaemonState]] = {
    DaemonState.STARTING: frozenset(),  # the first state only
    DaemonState.RUNNING: frozenset({DaemonState.STARTING, DaemonState.RELOADING}),
    DaemonState.RELOADING: frozenset({DaemonState.RUNNING}),
    DaemonState.STOPPING: frozenset({DaemonState.STARTING, DaemonState.RUNNING, DaemonState.RELOADING}),
    DaemonState.STOPPED: frozenset({DaemonState.STOPPING}),
}


class IllegalTransition(RuntimeError):
    def __init__(self, before: DaemonState, after: DaemonState):
        super().__init__(f"daemon state {before} -> {after} is not allowed "
                         f"(only from {', '.join(sorted(map(str, ALLOWED_FROM[after]))) or 'nothing'})")


def checked(before: DaemonState, after: DaemonState) -> DaemonState:
    """`after`, when the table allows it from `before`; IllegalTransition otherwise."""
    if before not in ALLOWED_FROM[after]:
        raise IllegalTransition(before, after)
    return after
