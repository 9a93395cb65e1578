"""`yoloedge run`: the long-running daemon (see `core` for its start-up and shutdown order).

The package splits it along its seams: `core.Daemon` owns the lifecycle (start, main loop, signals,
shutdown), `cameras.CameraSet` every camera's, `reload.Reloader` applying a new configuration with
rollback, `status` the typed snapshot that ctl, HTTP, /metrics and MQTT report, and `state` the
daemon's allowed state changes. What `cli` and the tests use is exported here.
"""

from .core import Daemon, run_daemon
from .state import EXIT_ALREADY_RUNNING, EXIT_FAILURE, EXIT_OK, DaemonState

__all__ = ["EXIT_ALREADY_RUNNING", "EXIT_FAILURE", "EXIT_OK", "Daemon", "DaemonState", "run_daemon"]
