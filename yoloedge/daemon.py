"""`yoloedge run`: the long-running daemon, from start-up to a staged, bounded shutdown.

The daemon only wires the parts together, starts them, reloads and stops them; the frames' path
lives in `pipeline/` (readers -> queues -> preparers -> device workers -> post-processing ->
`pipeline.results` -> its stages and sinks: MQTT, Home Assistant, watch, snapshots, metrics).

Start-up order: control socket (so `yoloedge-ctl status` answers while models load), MQTT
(connects in the background), accelerators (load + warm up every model), then READY=1 and
`online`, then the cameras. Shutdown reverses it: stop the readers, drain what is queued
(bounded by `shutdown_timeout_s`), stop the preparers, stop the device workers (each frees its
device on its own thread), stop post-processing, publish `stopped`, disconnect, close the socket.

Signals only set flags (on a thread of their own, see `health.signals`); the main loop acts on
them. SIGHUP reloads the configuration: cameras and MQTT settings change without touching models
or devices; an invalid file is rejected and the running configuration stays. SIGUSR1 writes the
status to the log; other signals that would kill the daemon silently are logged and ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import signal
import sys
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Callable, Mapping

from . import __version__
from .backends.ort_install import config_clash
from .control.statustext import format_status
from .config.errors import ConfigError, ConfigIssue
from .config.loader import load_config
from .config.schema import CameraConfig, Config, MqttConfig
from .control.instance import AlreadyRunning, ControlServerError, InstanceLock
from .control.protocol import quoted_name
from .control.server import ControlServer, unexpected_fields
from .control.watch import WatchHub
from .events.recent import EventLog, events_reply
from .heap import release_free_heap
from .health.logsetup import redact_text
from .health.notify import SystemdNotifier, watchdog_interval_s
from .health.progress import Problem, ProgressTracker
from .health.signals import SIGNAL_ACTIONS, SignalAction, SignalDispatcher, SignalInbox, signal_name
from .pipeline.cameras import CameraRuntime, is_lossless, queue_size_for
from .pipeline.groups import AcceleratorGroup
from .pipeline.results import ResultRouter
from .pipeline.sinks import SinkContext, build_sinks
from .events import CountsStore, UnknownCounts
from .routing import FrameKeeper, TrackingStage
from .control.snapshot import snapshot_reply
from .pipeline.snapshots import SnapshotStore
from .pipeline.worker import WorkerState
from .publish.homeassistant import Discovery
from .publish.mqtt import MqttPublisher
from .sources.framepool import FramePool
from .sources.reader import CameraReader
from .sources.state import CameraState
from .timeutil import utc_timestamp
from .web.endpoint import HttpEndpoint, listen_text
from .web.metrics import Meters

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1
#: another daemon owns the control socket, or its lock file cannot be created (sysexits
#: EX_CANTCREAT). Not 78 (the configuration is fine) and not 1; the unit lists it in
#: RestartPreventExitStatus so systemd does not retry every RestartSec while the other one runs.
EXIT_ALREADY_RUNNING = 73
#: how long a `reload` request waits for its attempt before answering "still running".
RELOAD_WAIT_S = 30.0
TICK_S = 0.1
#: a removed camera's capture thread still in a read holds its last frame until the read returns
#: (a frozen camera: up to a few read timeouts); the freed heap goes back once all have ended,
#: or after this long regardless
RELEASE_WAIT_S = 30.0
#: the line and zone totals live here under the service's state directory (`STATE_DIRECTORY`)
COUNTS_SUBDIR = "counts"
#: camera keys a reload applies without restarting the camera: its tracks go on
LIVE_CAMERA_KEYS = ("zones", "lines", "publish", "tracking")
#: camera states that make the daemon report a problem (for an enabled camera)
UNHEALTHY_CAMERA_STATES = frozenset({CameraState.STALLED, CameraState.BACKOFF, CameraState.FAILED,
                                     CameraState.CONNECTING})


class DaemonState(str, Enum):
    STARTING = "starting"  # loading models; the control socket already answers
    RUNNING = "running"
    RELOADING = "reloading"  # applying a new configuration file
    STOPPING = "stopping"  # staged shutdown under way
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


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


def live_change(before: CameraConfig, after: CameraConfig) -> bool:
    """The two differ only in keys a reload applies without restarting the camera."""
    keep = {key: getattr(before, key) for key in LIVE_CAMERA_KEYS if hasattr(before, key)}
    return before != after and dataclasses.replace(after, **keep) == before


def accelerator_names(config: Config) -> list[str]:
    return [a.name or f"{a.backend.split(':')[-1].lower()}{i}" for i, a in enumerate(config.accelerators)]


class Daemon:
    def __init__(self, config: Config, config_path: str, environ: Mapping[str, str], *,
                 before_forced_exit: Callable[[], None] = lambda: None):
        #: run before a second signal ends the process at once: the stderr guard writes out what
        #: its pipe still holds (that signal's own message included), bounded
        self._before_forced_exit = before_forced_exit
        self.config = config
        self.config_path = config_path
        self.environ = dict(environ)
        self.notifier = SystemdNotifier(environ.get("NOTIFY_SOCKET"))
        self.tracker = ProgressTracker()
        self.state = DaemonState.STARTING
        self.started_mono = time.monotonic()
        self.generation = 1
        self.config_error: str | None = None
        self.ignored_changes: list[str] = []
        self.groups: dict[str, AcceleratorGroup] = {}
        self.cameras: dict[str, CameraRuntime] = {}
        self.publisher: MqttPublisher | None = None
        #: Home Assistant entities announced; outlives a publisher replaced by a reload.
        self.discovery = Discovery(config.device_id, __version__, os.path.basename(config.model.path))
        self.control: ControlServer | None = None
        self.snapshots = SnapshotStore()  # each camera's latest processed frame (ctl snapshot, HTTP)
        #: the BGR buffers the cameras' OpenCV captures retrieve their kept frames into, lent for a
        #: sink call each: a few serve every camera (see `sources.framepool`)
        self.frames = FramePool()
        #: each camera's recent events and their best shots, fed by the router (`events.recent`)
        self.events = EventLog()
        # /metrics, /api/status, /api/cameras/<name>/latest.jpg, /api/events (web.endpoint)
        self.http = HttpEndpoint(self.status, self._meters, self.snapshots, self.events)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._reload_done = threading.Condition()  # guards the two counters below
        self._reloads_started = 0  # attempts begun (each loads the file after counting itself)
        self._reloads_finished = 0
        self._reload_outcome: tuple[int, str | None] = (self.generation, None)  # of the last attempt
        self.instance = InstanceLock(config.control.socket)
        #: cameras removed since the freed heap last went back, and since when (`_give_back_memory`)
        self._removed: list[CameraRuntime] = []
        self._removed_since = 0.0
        self._signals = 0  # stop signals received
        self._signal_inbox = SignalInbox()  # signals that neither stop nor reload, for the main loop
        self._cpu_limit = False  # SIGXCPU: stopping because the CPU time limit is reached
        #: guards `cameras` and `publisher` against the control and HTTP threads: a reload that
        #: changes the MQTT settings sets `publisher` to None, then to the new client, so other
        #: threads take one reference under it (`_current_publisher`) and never read it twice
        self._lock = threading.RLock()
        self.watchers = WatchHub()  # `yoloedge-ctl watch` subscriptions
        # one plain read per frame (no lock on the frames' path): a single read cannot see it change
        #: full frames held for event best shots, only while a camera has objects (routing.keeper)
        self.keeper = FrameKeeper()
        self.counts = CountsStore(counts_directory(self.environ))  # line and zone totals
        #: per camera a tracker and its zones, lines and events (routing.tracking)
        self.tracking = TrackingStage(self.counts, self.keeper,
                                      emit=lambda camera, batch: self.results.events(camera, batch))
        self.results = ResultRouter(self.cameras, config.model.path, stages=[self.tracking], sinks=build_sinks(
            SinkContext(lambda: self.publisher, snapshots=self.snapshots, watchers=self.watchers,
                        event_log=self.events)))

    # -- public entry ------------------------------------------------------------------------
    def run(self) -> int:
        """The instance lock is held from here to the end, whatever becomes of the socket: without
        it a daemon whose socket failed would let a second one start beside it."""
        self._install_signal_handlers()
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
        return EXIT_FAILURE if self._cpu_limit else code

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    # -- signals -----------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
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
        counted for the main loop to log (`_act_on_signals`)."""
        action = SIGNAL_ACTIONS.get(signum, SignalAction.IGNORE)
        if action is SignalAction.STOP:
            self._on_stop_signal()
        elif action is SignalAction.RELOAD:
            self._reload.set()
        else:
            self._signal_inbox.record(signum)  # before the stop below: the shutdown logs it
            if action is SignalAction.CPU_LIMIT:
                # sent again every CPU second until the hard limit's SIGKILL: not a second stop
                self._cpu_limit = True
                self._stop.set()

    def _act_on_signals(self, flush: bool = False) -> None:
        """The main loop's side of the signals that are only counted: log them (SIGUSR1: the status)."""
        for signum, count in self._signal_inbox.due(flush):
            name = signal_name(signum)
            times = f" ({count} times)" if count > 1 else ""
            action = SIGNAL_ACTIONS.get(signum)
            if action is SignalAction.LOG_STATUS:
                log.info("%s%s: status follows\n%s", name, times, format_status(self.status()))
            elif action is SignalAction.CPU_LIMIT:
                log.error("%s: the CPU time limit (LimitCPU=, ulimit -t) is reached; stopping cleanly "
                          "before the kernel kills the daemon", name)
            else:
                log.warning("received %s%s: ignored (SIGHUP reloads, SIGTERM stops, SIGUSR1 logs the status)",
                            name, times)

    def _on_stop_signal(self) -> None:
        self._signals += 1
        if self._signals > 1:
            os.write(2, b"yoloedge: second signal, exiting immediately\n")
            self._before_forced_exit()
            os._exit(EXIT_FAILURE)
        self._stop.set()

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
            self._add_camera(camera)
        self.state = DaemonState.RUNNING
        publisher.set_status("online")
        self.notifier.ready(self._status_line())
        log.info("ready: %d accelerator device(s), %d camera(s)",
                 sum(len(g.running_workers) for g in self.groups.values()), len(self.cameras))
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
        with self._lock:
            cameras = list(self.cameras.values())
        return Meters(cameras, [(g.name, w) for g in self.groups.values() for w in g.workers])

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
        self.groups = {name: AcceleratorGroup(name, acc, cfg.model, self.tracker, self.results,
                                                self.results.floor)
                       for name, acc in zip(accelerator_names(cfg), cfg.accelerators)}
        for group in self.groups.values():
            group.start()
        for group in self.groups.values():
            group.wait_ready(self._stop)
        failed = [w for g in self.groups.values() for w in g.workers if w.state is WorkerState.FAILED]
        for w in failed:
            log.error("accelerator %s failed to start: %s", w.worker_name, w.startup_error)
        if all(not g.running_workers for g in self.groups.values()) and not self._stop.is_set():
            message = "; ".join(f"{w.worker_name}: {w.startup_error}" for w in failed) or "no devices"
            log.critical("no accelerator could load the model, giving up: %s", message)
            self.notifier.status(f"failed: {message}"[:200])
            return False
        return True

    # -- cameras -----------------------------------------------------------------------------
    def _group_for(self, camera: CameraConfig) -> AcceleratorGroup:
        name = camera.accelerator or next(iter(self.groups))
        return self.groups[name]

    def _add_camera(self, camera: CameraConfig) -> None:
        group = self._group_for(camera)
        self._warn_unknown_classes(camera, group)
        intake = queue = reader = None
        failed = None if group.serving else f"accelerator {group.name} did not start"
        if camera.enabled and failed is None:
            intake = group.add_camera(camera.name, queue_size_for(camera, group.config.batch), is_lossless(camera))
            queue = intake.queue
            reader = CameraReader(camera, self.snapshots.tap(camera.name, self.keeper.tap(camera.name, intake,
                                                                                is_lossless(camera))),
                                  self.config.health.stall_timeout_s, self.results.camera_state, pool=self.frames)
        runtime = CameraRuntime(camera, group.name, queue, reader, failed=failed if camera.enabled else None,
                                intake=intake)
        self.snapshots.add(camera.name)
        self.events.configure_camera(camera)
        with self._lock:
            self.cameras[camera.name] = runtime
        self.results.camera_added(camera)  # before its first state: Home Assistant discovery
        if group.detector is not None:  # its tracker and events (kept through a restart)
            self.tracking.configure(camera, group.detector.labels)
        if reader is None:
            self.results.camera_state(camera.name, runtime.state, failed or "enabled: false")
        runtime.start()

    @staticmethod
    def _warn_unknown_classes(camera: CameraConfig, group: AcceleratorGroup) -> None:
        """The config check cannot know the model's labels; a typo would silently hide everything."""
        detector = group.detector
        if camera.classes is None or detector is None:
            return
        for name in camera.classes:
            if name not in detector.labels:
                close = difflib.get_close_matches(name, detector.labels, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                log.warning("camera %s: class %r is not one of the model's labels%s; it will never match",
                            camera.name, name, hint, extra={"camera": camera.name})

    def _remove_camera(self, name: str, clear_state: bool = True) -> None:
        with self._lock:
            runtime = self.cameras.pop(name, None)
        if runtime is None:
            return
        self.snapshots.forget(name)
        runtime.stop()
        if not runtime.join(self.config.shutdown_timeout_s):
            log.warning("camera %s reader did not stop in time", name, extra={"camera": name})
        dropped = self.groups[runtime.group].batcher.remove_camera(name)
        runtime.close()  # its pictures go now, not when a lingering capture thread lets go
        if not self._removed:
            self._removed_since = time.monotonic()
        self._removed.append(runtime)
        if dropped:
            log.info("camera %s removed with %d queued frame(s) discarded", name, dropped, extra={"camera": name})
        self.keeper.forget(name)  # the frames it held for best shots (a restart makes it again)
        if clear_state:  # its events end; its retained state and Home Assistant entities go
            self.tracking.remove(name)
            self.events.forget_camera(name)
            self.results.camera_removed(name)

    # -- main loop ---------------------------------------------------------------------------
    def _main_loop(self) -> None:
        watchdog_every = watchdog_interval_s(self.environ, os.getpid()) if self.config.health.watchdog else None
        last_ping = last_status = last_stats = 0.0
        withheld = False  # pings are being withheld and that was logged: say it once, not per tick
        while not self._stop.is_set():
            now = time.monotonic()
            self._act_on_signals()
            if self._reload.is_set():
                self._reload.clear()
                self._do_reload()
            self._give_back_memory(now)
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

    def _status_line(self) -> str:
        with self._lock:
            cameras = list(self.cameras.values())
            publisher = self.publisher
        streaming = sum(1 for c in cameras if c.state is CameraState.STREAMING)
        enabled = sum(1 for c in cameras if c.config.enabled)
        rate = sum(w.frames_done.rate() for g in self.groups.values() for w in g.workers)
        mqtt = "connected" if publisher is not None and publisher.stats().get("connected") else "disconnected"
        problems = self.tracker.check()
        health = f", PROBLEM: {problems[0]}" if problems else ""
        return (f"{self.state}: {streaming}/{enabled} cameras streaming, {rate:.1f} frames/s, "
                f"mqtt {mqtt}{health}")

    # -- reload ------------------------------------------------------------------------------
    def _do_reload(self) -> None:
        """Load and apply the file; nothing in it may end the daemon. Any failure, expected (a
        ConfigError) or not (a camera or client that cannot start), rejects the file: what was
        changed is put back, the daemon runs on with generation N, and status shows why."""
        self.state = DaemonState.RELOADING
        self.notifier.reloading()
        with self._reload_done:
            self._reloads_started += 1
        try:
            new = load_config(self.config_path, self.environ)
            self._check_reloadable(new)
            self._apply(new)
        except ConfigError as exc:
            self._reject(str(exc))
        except Exception as exc:  # noqa: BLE001 - a reload must never end the daemon; reported below
            log.debug("reload: applying the new configuration failed", exc_info=True)
            self._reject(f"{self.config_path}: cannot apply the new configuration: "
                         f"{redact_text(str(exc)) or type(exc).__name__}")
        else:
            self.generation += 1
            self.config_error = None
            log.info("configuration reloaded: generation %d", self.generation)
        self.state = DaemonState.RUNNING
        self.notifier.ready(self._status_line())
        with self._reload_done:
            self._reloads_finished += 1
            self._reload_outcome = (self.generation, self.config_error)
            self._reload_done.notify_all()

    def _give_back_memory(self, now: float) -> None:
        """Main loop: once the cameras removed by a reload have let go of their frames (their
        capture threads have ended), hand the freed heap back: the C allocator keeps it otherwise
        (see `heap`)."""
        if not self._removed:
            return
        if now - self._removed_since < RELEASE_WAIT_S and any(r.open_captures() for r in self._removed):
            return
        self._removed = []
        self.frames.clear()  # the buffers the removed cameras used are not needed any more
        released = release_free_heap()
        if released:
            log.info("%.0f MB of memory freed by removed cameras returned to the system", released / 2**20)

    def _reject(self, reason: str) -> None:
        self.config_error = reason
        log.error("reload rejected, keeping the running configuration (generation %d):\n%s",
                  self.generation, reason)

    def _check_reloadable(self, new: Config) -> None:
        unknown = [c.name for c in new.cameras if c.accelerator and c.accelerator not in self.groups]
        if unknown:
            raise ConfigError([ConfigIssue(self.config_path, 0, 0, "cameras", None,
                                           f"camera(s) {', '.join(unknown)} name an accelerator that is not "
                                           f"running; accelerators change only on restart", None)])

    def _apply(self, new: Config) -> None:
        """The HTTP endpoint first (a new address that cannot be bound rejects the reload before
        anything else changed), then the rest; the endpoint goes back when the rest fails."""
        old = self.config.http
        if new.http != old:
            self.http.apply(new.http)
        try:
            self._apply_settings(new)
        except Exception:
            if new.http != old:
                self.http.apply(old)
            raise

    def _apply_settings(self, new: Config) -> None:
        """Publisher first, then cameras; when either fails, both go back to the running config
        and the failure is raised for `_do_reload` to report."""
        old = self.config
        ignored = [key for key in ("device_id", "model", "accelerators", "control")
                   if getattr(new, key) != getattr(old, key)]
        if new.mqtt != old.mqtt:
            self._replace_publisher(new.mqtt, old.mqtt)
        try:
            self.config = dataclasses.replace(new, device_id=old.device_id, model=old.model,
                                              accelerators=old.accelerators, control=old.control)
            self._apply_cameras(old.cameras, new.cameras)
        except Exception:
            self.config = old
            try:
                self._apply_cameras(self._running_cameras(), old.cameras, strict=False)
            finally:  # the publisher goes back even when putting the cameras back failed
                if new.mqtt != old.mqtt:
                    self._replace_publisher(old.mqtt, new.mqtt)
            raise
        self.ignored_changes = ignored
        if ignored:
            log.warning("reload: %s changed; restart the service to apply (kept running as before)",
                        ", ".join(ignored))

    def _running_cameras(self) -> tuple[CameraConfig, ...]:
        with self._lock:
            return tuple(runtime.config for runtime in self.cameras.values())

    def _apply_cameras(self, old: tuple[CameraConfig, ...], new: tuple[CameraConfig, ...],
                       strict: bool = True) -> None:
        """Move the cameras from `old` to `new`, one by one. A camera that cannot start raises
        (after its old settings are back) when `strict`; when rolling back, it is logged and the
        others still go back."""
        before = {c.name: c for c in old}
        after = {c.name: c for c in new}
        for name in before.keys() - after.keys():
            log.info("reload: removing camera %s", name, extra={"camera": name})
            self._remove_camera(name)
        for name, cam in after.items():
            if name in before and live_change(before[name], cam):
                log.info("reload: camera %s: new zones, lines or tracking settings", name, extra={"camera": name})
                self._apply_live(cam)
            elif name in before and before[name] != cam:
                log.info("reload: restarting camera %s with its new settings", name, extra={"camera": name})
                self._remove_camera(name, clear_state=False)
                self._start_camera(cam, before[name], strict)
            elif name not in before:
                log.info("reload: adding camera %s", name, extra={"camera": name})
                self._start_camera(cam, None, strict)

    def _apply_live(self, camera: CameraConfig) -> None:
        """Zones, lines, publish and tracking change under a running camera: its tracks go on."""
        with self._lock:
            runtime = self.cameras[camera.name]
            runtime.config = camera
        self.results.camera_added(camera)  # Home Assistant's zone and line sensors, publish mode
        detector = self.groups[runtime.group].detector
        if detector is not None:
            self.tracking.configure(camera, detector.labels)

    def _start_camera(self, camera: CameraConfig, previous: CameraConfig | None, strict: bool) -> None:
        try:
            self._add_camera(camera)
        except Exception as exc:
            self._forget_half_added(camera)
            if previous is not None:
                self._start_camera(previous, None, strict=False)
            if strict:
                raise
            log.error("reload: camera %s could not be started: %s", camera.name, exc, extra={"camera": camera.name})

    def _forget_half_added(self, camera: CameraConfig) -> None:
        """`_add_camera` registers the camera's queue before it builds the reader: undo what it did."""
        with self._lock:
            registered = camera.name in self.cameras
        if registered:
            self._remove_camera(camera.name, clear_state=False)
            return
        try:
            group = self._group_for(camera)
        except (KeyError, StopIteration):
            return  # no such accelerator: `_add_camera` failed before it registered anything
        group.batcher.remove_camera(camera.name)

    def _replace_publisher(self, settings: MqttConfig, fallback: MqttConfig) -> None:
        """Reconnect with `settings`; when the new client cannot start, reconnect with `fallback`
        (the settings that worked) and raise."""
        log.info("reload: MQTT settings changed, reconnecting")
        # The old client goes first: both would use the same client id, and the broker would
        # bounce the connection between them (and fire the Last Will) while both lived.
        old = self._current_publisher()
        if old is not None:
            try:
                old.stop(timeout_s=5.0, final_status=None)
            except Exception:  # stop() logs its own failures; this guards the reload regardless
                log.exception("reload: stopping the MQTT client failed; replacing it anyway")
        self._set_publisher(None)  # results and states wait (dropped) until a client runs again
        try:
            self._set_publisher(self._online_publisher(settings))
        except Exception:
            self._set_publisher(self._online_publisher(fallback))
            raise

    def _online_publisher(self, settings: MqttConfig) -> MqttPublisher:
        """A started client that said "online"; one that fails half-way is stopped before the
        error is raised, so its spool lock and threads do not outlive it (the fallback client
        needs that spool directory)."""
        publisher = MqttPublisher(settings, self.config.device_id, __version__, discovery=self.discovery)
        try:
            publisher.start()
            publisher.set_status("online")
        except BaseException:
            publisher.stop(timeout_s=0.0, final_status=None)
            raise
        return publisher

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
        return self.status() if cmd == "status" else self._reload_and_wait()

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

    def _reload_and_wait(self) -> dict:
        """Ask the main loop for a reload and answer with the outcome of an attempt that began
        after this request, so it read the file as it is now. Requests that arrive together
        share one attempt; an attempt already under way may have read the file before, so it
        does not count. `ControlServer(slow=...)` keeps these waits out of status's way."""
        with self._reload_done:
            wanted = self._reloads_started + 1
            self._reload.set()
            if not self._reload_done.wait_for(lambda: self._reloads_finished >= wanted, RELOAD_WAIT_S):
                # requested, still running (start-up, or a slow camera): ctl says so
                return {"ok": True, "generation": self.generation, "reloaded": False, "config_error": None}
            now, error = self._reload_outcome
        return {"ok": error is None, "generation": now, "reloaded": error is None, "config_error": error}

    def status(self) -> dict:
        problems = self._problems()
        with self._lock:
            cameras = [{**c.status(), "rebalanced": self.groups[c.group].batcher.rebalanced_of(c.name),
                        **self.tracking.camera_status(c.name)}
                       for c in self.cameras.values()]
        accelerators = []
        for group in self.groups.values():
            for w in group.workers:
                entry = w.status()
                entry["accelerator"] = group.name
                entry["healthy"] = (w.state is WorkerState.RUNNING
                                    and not any(p.source == w.worker_name for p in problems))
                accelerators.append(entry)
        publisher = self._current_publisher()  # once: a reload may replace it meanwhile
        mqtt = publisher.stats() if publisher is not None else {}
        return {
            "ok": True,
            "daemon": {
                "state": self.state.value,
                "pid": os.getpid(),
                "version": __version__,
                "device_id": self.config.device_id,
                "uptime_s": round(time.monotonic() - self.started_mono, 1),
                "config": self.config_path,
                "generation": self.generation,
                "config_error": self.config_error,
                "restart_needed_for": self.ignored_changes,
                "healthy": not problems,
                "problems": [str(p) for p in problems],
            },
            "accelerators": accelerators,
            "cameras": cameras,
            "mqtt": mqtt,
            "sinks": self.results.stats(),  # each result sink's and stage's errors
            "watchers": self.watchers.stats(),  # `yoloedge-ctl watch` clients: queued, dropped
            "events": self.events.stats(),  # recent events and best shots kept, per camera
            **self._listener_stats(),  # "http", "control": where, and how accept() fares
        }

    def _listener_stats(self) -> dict:
        control = self.control
        return {"http": self.http.stats(), "control": control.stats() if control is not None else {"socket": None}}

    def _problems(self) -> list[Problem]:
        problems = list(self.tracker.check())
        for group in self.groups.values():
            for w in group.workers:
                if w.state is WorkerState.FAILED:
                    problems.append(Problem(w.worker_name, f"failed to start: {w.startup_error}"))
        now = time.monotonic()
        with self._lock:
            for cam in self.cameras.values():
                if (cam.config.enabled and cam.state in UNHEALTHY_CAMERA_STATES
                        and not cam.first_connection(now)):
                    problems.append(Problem(f"camera {cam.name}", str(cam.state)))
        publisher = self._current_publisher()
        mqtt = publisher.stats() if publisher is not None else None
        if mqtt is not None and not mqtt.get("connected"):
            problems.append(Problem("mqtt", "not connected to the broker"))
        elif mqtt is not None and mqtt.get("ack_stalled"):  # connected, yet nothing arrives
            problems.append(Problem("mqtt", "connected, but the broker does not acknowledge "
                                            "messages (see mqtt.last_error)"))
        if mqtt is not None and mqtt.get("unstable"):  # e.g. a client id taken over again and again
            problems.append(Problem("mqtt", "the broker keeps closing the connection right after "
                                            "accepting it (see mqtt.last_error)"))
        if self.config_error:
            problems.append(Problem("config", "the last reload was rejected (configuration error)"))
        for source, listener in self._listener_stats().items():  # out of file descriptors, most likely
            if listener.get("accept_failing"):
                problems.append(Problem(source, f"cannot accept connections: {listener['accept_error']} "
                                                f"({listener['refused']} refused)"))
        return problems

    def _stats_message(self) -> dict:
        status = self.status()
        return {"v": 1, "ts": utc_timestamp(), "uptime_s": status["daemon"]["uptime_s"],
                "healthy": status["daemon"]["healthy"], "problems": status["daemon"]["problems"],
                "accelerators": status["accelerators"],
                "cameras": status["cameras"], "mqtt": status["mqtt"]}

    # -- shutdown ----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Staged and bounded; safe to call after a partial start-up."""
        if self.state is DaemonState.STOPPED:
            return
        self.state = DaemonState.STOPPING
        self._act_on_signals(flush=True)  # e.g. the SIGXCPU that stops it
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        self.notifier.stopping("stopping: draining")
        log.info("stopping: readers, then draining queued frames (up to %.1f s)", self.config.shutdown_timeout_s)
        with self._lock:
            cameras = list(self.cameras.values())
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
            group.stop_post(max(0.5, deadline - time.monotonic()))
        self.tracking.end_all()  # every event ends, on MQTT while the client still runs
        publisher = self._current_publisher()
        if publisher is not None:
            publisher.stop(timeout_s=max(1.0, deadline - time.monotonic()), final_status="stopped")
        self.http.stop()
        if self.control is not None:
            self.control.stop()
        self.state = DaemonState.STOPPED
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
        left = sum(g.batcher.pending() for g in self.groups.values())
        log.warning("shutdown timeout reached with %d frame(s) still queued", left)


def run_daemon(config_path: str, environ: Mapping[str, str]) -> int:
    """Load the configuration (exit 78 on any error, before touching a device) and run."""
    from .health.logsetup import setup_logging
    from .health.stderr_guard import StderrGuard

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
