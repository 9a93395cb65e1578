"""`yoloedge run`: the long-running daemon (see `core` for its start-up and shutdown order).

What `cli` and the tests use is exported here.
"""

from .core import EXIT_ALREADY_RUNNING, EXIT_FAILURE, EXIT_OK, Daemon, DaemonState, run_daemon

__all__ = ["EXIT_ALREADY_RUNNING", "EXIT_FAILURE", "EXIT_OK", "Daemon", "DaemonState", "run_daemon"]
