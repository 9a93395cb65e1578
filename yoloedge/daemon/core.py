"""`yoloedge run`: the long-running daemon, from start-up to a staged, bounded shutdown.

The daemon only wires the parts together, starts them, reloads and stops them; the frames' path
lives in `pipeline/` (readers -> queues -> preparers -> device workers -> post-processing ->
`routing.router` -> its stages and sinks: MQTT, Home Assistant, watch, snapshots, metrics).

Start-up order: control socket (so `yoloedge-ctl status` answers while models load), MQTT
(connects in the background), accelerators (load + warm up every model), then READY=1 and
`online`, then the cameras. Shutdown reverses it: stop the readers, drain what is queued
(bounded by `shutdown_timeout_s`), stop the preparers, stop the device workers (each frees its
device on its own thread), stop post-processing, publish `stopped`, disconnect, close the socket.

Signals only set flags (on a thread of their own, see `health.signals`); the main loop acts on
them. SIGHUP reloads the configuration: cameras and MQTT settings change without touching models
or devices; an invalid file is rejected and the running configuration stays. SIGUSR1 writes the
status to the log; other signals that would kill the daemon silently are logged and ignored.

Locking: `Daemon._lock` guards `publisher` only; the cameras have their own (`CameraSet.lock`),
the reload attempts theirs (`Reloader.done`). All three are leaves: none is taken under another.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from .. import __version__
from ..backends.ort_install import config_clash
from ..config.errors import ConfigError
from ..config.loader import load_config
from ..config.schema import Config
from ..control.instance import AlreadyRunning, ControlServerError, InstanceLock
from ..control.protocol import quoted_name
from ..control.server import ControlServer, unexpected_fields
from ..control.watch import WatchHub
from ..events.recent import EventLog, events_reply
from ..health.notify import SystemdNotifier, watchdog_interval_s
from ..health.progress import ProgressTracker
from ..pipeline.cameras import CameraRuntime
from ..pipeline.groups import AcceleratorGroup
from ..routing.router import ResultRouter
from ..routing.sinks import SinkContext, build_sinks
from ..events import CountsStore, UnknownCounts
from ..routing import FrameKeeper, TrackingStage
from ..control.snapshot import snapshot_reply
from ..pipeline.snapshots import SnapshotStore
from ..pipeline.worker import WorkerState
from ..publish.homeassistant import Discovery
from ..publish.mqtt import MqttPublisher
from ..sources.framepool import FramePool
from ..web.endpoint import HttpEndpoint, listen_text
from ..web.metrics import Meters
from .cameras import CameraParts, CameraSet
from .reload import Reloader
from .signals import DaemonSignals
from .state import EXIT_ALREADY_RUNNING, EXIT_FAILURE, EXIT_OK, DaemonState, checked
from .status import DaemonStatus, collect, stats_message, status_line

log = logging.getLogger(__name__)
#: how long the stop waits at least, once post-processing stopped, for the devices to be released
#: (each device waits for the output sets post-processing still held; acl.finalize comes last)
CLOSE_WAIT_S = 2.0

TICK_S = 0.1
#: the line and zone totals live here under the service's state directory (`STATE_DIRECTORY`)
COUNTS_SUBDIR = "counts"


def counts_directory(environ: Mapping[str, str]) -> Path | None:
    """Where line and zone totals are kept: `$STATE_DIRECTORY/counts` (systemd's StateDirectory=,
    set by the unit; the first entry when it lists several). Without it the totals are kept in
    memory only and start from zero at every start; a relative path is refused the same way."""
    state = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if not state:
        log.info("STATE_DIRECTORY is not set (not run by the systemd unit): line and zone counts "
                 "are kept in memory only and start from zero on every start")
        return None
    if not os.path.isabs(state):
        log.warning("STATE_DIRECTORY %r is not an absolute path: line and zone counts are kept in "
                    "memory only", state)
        return None
    return Path(state) / COUNTS_SUBDIR


class Daemon:
    def __init__(self, config: Config, config_path: str, environ: Mapping[str, str], *,
                 before_forced_exit: Callable[[], None] = lambda: None):
        self.config = config
        self.config_path = config_path
        self.environ = dict(environ)
        self.notifier = SystemdNotifier(environ.get("NOTIFY_SOCKET"))
        self.tracker = ProgressTracker()
        self.state = DaemonState.STARTING  # changed by `_transition` only
        self.started_mono = time.monotonic()
        self.groups: dict[str, AcceleratorGroup] = {}
        self.publisher: MqttPublisher | None = None
        #: Home Assistant entities announced; outlives a publisher replaced by a reload.
        self.discovery = Discovery(config.device_id, __version__,
                                   ", ".join(os.path.basename(m.path) for m in config.models))
        self.control: ControlServer | None = None
        self.snapshots = SnapshotStore()  # each camera's latest processed frame (ctl snapshot, HTTP)
        #: each camera's recent events and their best shots, fed by the router (`events.recent`)
        self.events = EventLog()
        # /metrics, /api/status, /api/cameras/<name>/latest.jpg, /api/events (web.endpoint)
        self.http = HttpEndpoint(self.status, self._meters, self.snapshots, self.events)
        self._stop = threading.Event()
        self.reloader = Reloader(self)  # SIGHUP and ctl reload: its flag, attempts and generation
        self.instance = InstanceLock(config.control.socket)
        #: what each signal sets; the main loop logs the others (`daemon.signals`)
        self.signals = DaemonSignals(self._stop, self.reloader.requested, self.status, before_forced_exit)
        #: guards `publisher` against the control and HTTP threads: a reload that changes the MQTT
        #: settings sets it to None, then to the new client, so other threads take one reference
        #: under it (`_current_publisher`) and never read it twice. A leaf lock.
        self._lock = threading.Lock()
        self.watchers = WatchHub()  # `yoloedge-ctl watch` subscriptions
        #: full frames held for event best shots, only while a camera has objects (routing.keeper)
        keeper = FrameKeeper()
        #: per camera a tracker and its zones, lines and events (routing.tracking), with the line
        #: and zone totals
        self.tracking = TrackingStage(CountsStore(counts_directory(self.environ)), keeper,
                                      emit=lambda camera, batch: self.results.events(camera, batch))
        runtimes: dict[str, CameraRuntime] = {}  # the result router looks each frame's camera up here
        # one plain read per frame (no lock on the frames' path): a single read cannot see it change
        self.results = ResultRouter(runtimes, stages=[self.tracking], sinks=build_sinks(
            SinkContext(lambda: self.publisher, snapshots=self.snapshots, watchers=self.watchers,
                        event_log=self.events)))
        #: the BGR buffers the cameras' OpenCV captures retrieve their kept frames into, lent for a
        #: sink call each: a few serve every camera (see `sources.framepool`)
        parts = CameraParts(self.snapshots, self.events, keeper, self.tracking, self.results, FramePool())
        self.cameras = CameraSet(runtimes, parts, groups=lambda: self.groups, settings=lambda: self.config)

    # -- public entry ------------------------------------------------------------------------
    def run(self) -> int:
        """The instance lock is held from here to the end, whatever becomes of the socket: without
        it a daemon whose socket failed would let a second one start beside it."""
        self.signals.install()
        try:
            self.instance.acquire()
            self._start_control()
        except ControlServerError as exc:  # before MQTT and devices: nothing to shut down
            self.instance.release()
            log.error("not starting: %s", exc)
            return EXIT_ALREADY_RUNNING
        try:
            code = self._run()
        finally:
            self._shutdown()
            self.instance.release()
        return EXIT_FAILURE if self.signals.cpu_limit else code

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self.reloader.requested.set()

    def _transition(self, to: DaemonState) -> None:
        """Every change of `state` goes through here, checked against `state.ALLOWED_FROM`."""
        self.state = checked(self.state, to)

    # -- start-up ----------------------------------------------------------------------------
    def _run(self) -> int:
        cfg = self.config
        log.info("yoloedge %s starting: config %s, device_id %s", __version__, self.config_path, cfg.device_id)
        self.notifier.status("starting: loading models")
        self._start_http()
        publisher = self._start_publisher(cfg)
        if not self._start_accelerators(cfg):
            return EXIT_FAILURE
        if self._stop.is_set():
            return EXIT_OK
        for camera in cfg.cameras:
            self.cameras.add(camera)
        self._transition(DaemonState.RUNNING)
        publisher.set_status("online")
        self.notifier.ready(self._status_line())
        log.info("ready: %d accelerator device(s), %d camera(s)",
                 sum(len(g.running_workers) for g in self.groups.values()), len(self.cameras.snapshot()))
        self._main_loop()
        return EXIT_OK

    def _start_control(self) -> None:
        """Open the control socket; AlreadyRunning when another daemon (one older than the lock
        file) answers on it. Any other failure (a file in the way, a bind refused) only costs
        `yoloedge-ctl`: the instance lock, already held, still keeps a second daemon out.
        """
        path = self.config.control.socket
        try:
            self.control = ControlServer(path, self.config.control.mode, self._handle_control,
                                         instance=self.instance, slow=frozenset({"reload"}),
                                         streams={"watch": self.watchers.opener(self.snapshots.known)})
            self.control.start()
        except AlreadyRunning:
            self.control = None
            raise
        except OSError as exc:
            log.error("control socket %s unavailable (%s); yoloedge-ctl will not reach this daemon", path, exc)
            self.control = None

    def _start_http(self) -> None:
        """Like the control socket, an address that cannot be bound costs only the endpoint."""
        try:
            self.http.start(self.config.http)
        except OSError as exc:
            log.error("HTTP endpoint: cannot listen on %s (%s); /metrics and /api/status are unavailable",
                      listen_text(self.config.http), exc.strerror or exc)

    def _meters(self) -> Meters:
        """What /metrics reads: one status snapshot, and the meters it has no room for."""
        return Meters(self.report(), self.cameras.snapshot(),
                      [(g.name, w) for g in self.groups.values() for w in g.workers])

    def _start_publisher(self, cfg: Config) -> MqttPublisher:
        publisher = MqttPublisher(cfg.mqtt, cfg.device_id, __version__, discovery=self.discovery)
        self._set_publisher(publisher)
        publisher.start()
        return publisher

    def _current_publisher(self) -> MqttPublisher | None:
        with self._lock:
            return self.publisher

    def _set_publisher(self, publisher: MqttPublisher | None) -> None:
        with self._lock:
            self.publisher = publisher

    def _start_accelerators(self, cfg: Config) -> bool:
        # Built whole, then published: `status()` answers from the control thread meanwhile, and
        # iterating a dict while this thread inserts into it raises.
        self.groups = {name: AcceleratorGroup(name, acc, cfg.group_models(name),
                                              self.tracker, self.results, self.results.floor)
                       for name, acc in zip(cfg.group_names(), cfg.accelerators)}
        for group in self.groups.values():
            group.start()
        for group in self.groups.values():
            group.wait_ready(self._stop)
        failed = [w for g in self.groups.values() for w in g.workers if w.state is WorkerState.FAILED]
        for w in failed:
            log.error("accelerator %s failed to start: %s", w.worker_name, w.startup_error)
        for group in self.groups.values():
            for model, error in group.model_errors().items():
                log.error("accelerator %s: model %s could not be loaded on any device (%s); its cameras get "
                          "the group's other models", group.name, model, error)
        if all(not g.running_workers for g in self.groups.values()) and not self._stop.is_set():
            message = "; ".join(f"{w.worker_name}: {w.startup_error}" for w in failed) or "no devices"
            log.critical("no accelerator could load the model, giving up: %s", message)
            self.notifier.status(f"failed: {message}"[:200])
            return False
        return True

    # -- main loop ---------------------------------------------------------------------------
    def _main_loop(self) -> None:
        watchdog_every = watchdog_interval_s(self.environ, os.getpid()) if self.config.health.watchdog else None
        last_ping = last_status = last_stats = 0.0
        withheld = False  # pings are being withheld and that was logged: say it once, not per tick
        while not self._stop.is_set():
            now = time.monotonic()
            self.signals.act()
            if self.reloader.requested.is_set():
                self.reloader.requested.clear()
                self.reloader.reload()
            self.cameras.give_back_memory(now)
            self.tracking.end_idle()  # cameras that stopped: their events end
            if watchdog_every and now - last_ping >= watchdog_every:
                # One healthy device keeps the service alive: a down card restarts on its own.
                if self.tracker.making_progress():
                    self.notifier.watchdog()
                    last_ping = now
                    if withheld:
                        log.info("a device makes progress again: petting the systemd watchdog")
                    withheld = False
                elif now - last_ping >= watchdog_every * 2 and not withheld:
                    log.error("not petting the systemd watchdog, no device makes progress: %s",
                              "; ".join(map(str, self.tracker.check())))
                    withheld = True
            if now - last_status >= self.config.health.status_interval_s:
                self.notifier.status(self._status_line())
                last_status = now
            publisher = self._current_publisher()
            if publisher is not None and now - last_stats >= self.config.mqtt.stats_interval_s:
                publisher.publish_stats(self._stats_message())
                last_stats = now
            self._stop.wait(TICK_S)

    # -- control socket ----------------------------------------------------------------------
    def _handle_control(self, request: dict) -> dict:
        """Neither command takes a field besides "cmd": any other is refused, not ignored."""
        cmd = request.get("cmd")
        if cmd == "snapshot":  # takes "camera"; `watch` is a stream (see `_start_control`)
            return unexpected_fields(request, takes=("camera",)) or snapshot_reply(self.snapshots, request)
        if cmd == "reset-counts":
            return unexpected_fields(request, takes=("camera", "name")) or self._reset_counts(request)
        if cmd == "events":
            return (unexpected_fields(request, takes=("camera", "limit"))
                    or events_reply(self.events, request.get("camera"), request.get("limit"), self.snapshots.known))
        if cmd not in ("status", "reload"):
            return {"ok": False, "error": f"unknown command {cmd!r} (status, reload, snapshot, events, reset-counts, "
                                          f"watch)"}
        refused = unexpected_fields(request)
        if refused is not None:
            return refused
        return self.status() if cmd == "status" else self.reloader.reload_and_wait()

    def _reset_counts(self, request: dict) -> dict:
        """`{"cmd": "reset-counts", "camera": NAME, "name": LINE_OR_ZONE | null}`: zeroed, saved
        and published (retained) at once; `since` is now."""
        camera, name = request.get("camera"), request.get("name")
        if not isinstance(camera, str) or not (name is None or isinstance(name, str)):
            return {"ok": False, "error": 'reset-counts needs a "camera" name and an optional line or zone "name"'}
        try:
            messages = self.tracking.reset(camera, name)
        except KeyError:
            return {"ok": False, "reason": "unknown_camera",
                    "error": f"no camera named {quoted_name(camera)} with tracking on"}
        except UnknownCounts as exc:
            return {"ok": False, "error": f"camera {quoted_name(camera)}: {exc}"}
        return {"ok": True, "camera": camera, "reset": [m.name for m in messages]}

    # -- status (daemon.status) --------------------------------------------------------------
    def report(self) -> DaemonStatus:
        """A typed snapshot of the daemon, taken on the calling thread."""
        return collect(self)

    def status(self) -> dict:
        """`yoloedge-ctl status` and /api/status: the snapshot as JSON-ready dicts."""
        return self.report().as_dict()

    def _status_line(self) -> str:
        return status_line(self)

    def _stats_message(self) -> dict:
        return stats_message(self.report())

    # -- shutdown ----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Staged and bounded; safe to call after a partial start-up."""
        if self.state is DaemonState.STOPPED:
            return
        self._transition(DaemonState.STOPPING)
        self.signals.act(flush=True)  # e.g. the SIGXCPU that stops it
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        self.notifier.stopping("stopping: draining")
        log.info("stopping: readers, then draining queued frames (up to %.1f s)", self.config.shutdown_timeout_s)
        cameras = self.cameras.snapshot()
        for cam in cameras:
            cam.stop()
        for cam in cameras:
            cam.join(max(0.1, deadline - time.monotonic()))
        self._drain(deadline)
        self._wait_for_captures(cameras, deadline)
        for group in self.groups.values():
            group.stop_preparers(max(0.5, deadline - time.monotonic()))
        for group in self.groups.values():
            group.stop_workers(max(0.5, deadline - time.monotonic()))
        for group in self.groups.values():
            group.close_media()  # the cards' decoder channels and DVPP memory, before acl.finalize
        for group in self.groups.values():
            group.stop_post(max(0.5, deadline - time.monotonic()))
        for group in self.groups.values():  # a device waits for post-processing to hand its outputs back
            group.await_devices_closed(max(CLOSE_WAIT_S, deadline - time.monotonic()))
        self.tracking.end_all()  # every event ends, on MQTT while the client still runs
        publisher = self._current_publisher()
        if publisher is not None:
            publisher.stop(timeout_s=max(1.0, deadline - time.monotonic()), final_status="stopped")
        self.http.stop()
        if self.control is not None:
            self.control.stop()
        self._transition(DaemonState.STOPPED)
        log.info("stopped")

    @staticmethod
    def _wait_for_captures(cameras: list[CameraRuntime], deadline: float) -> None:
        """Let capture threads leave OpenCV: a thread killed inside FFmpeg at exit aborts the process."""
        while time.monotonic() < deadline and any(c.open_captures() for c in cameras):
            time.sleep(0.05)

    def _drain(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not any(g.busy() for g in self.groups.values() if g.running_workers):
                return
            time.sleep(0.05)
        left = sum(g.pending() for g in self.groups.values())
        log.warning("shutdown timeout reached with %d frame(s) still queued", left)


def run_daemon(config_path: str, environ: Mapping[str, str]) -> int:
    """Load the configuration (exit 78 on any error, before touching a device) and run."""
    from ..health.logsetup import setup_logging
    from ..health.stderr_guard import StderrGuard

    try:
        config = load_config(config_path, environ)
    except ConfigError as exc:
        print(f"yoloedge: configuration error, not starting:\n{exc}", flush=True, file=sys.stderr)
        return 78
    setup_logging(config.logging, environ)
    ort_clash = config_clash(a.backend for a in config.accelerators)
    if ort_clash is not None:  # pip install .[gpu] next to the CPU build: see backends.ort_install
        log.warning("ONNX Runtime: %s", ort_clash)
    # FFmpeg and OpenCV write to fd 2 themselves, past logging's redaction: see health.stderr_guard.
    guard = StderrGuard()
    guard.install()
    try:
        code = Daemon(config, config_path, environ, before_forced_exit=guard.remove).run()
    except Exception:
        # logged here, through the log filter and the guard: an uncaught traceback would be printed
        # after the guard is gone, unredacted
        log.exception("daemon failed")
        code = 1
    # Everything is released; a capture thread may still sit in a frozen camera's read until its
    # timeout. Interpreter finalisation would tear it down inside FFmpeg's C++ code and abort
    # the process, so leave without finalising once our own shutdown is complete.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    guard.remove()  # last: what is still in its pipe is written out before the process leaves
    os._exit(code)
