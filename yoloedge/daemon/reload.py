"""SIGHUP and `yoloedge-ctl reload`: load the file again and apply it to the running daemon, or put
everything back and keep running on the configuration that worked.

Cameras and MQTT settings change without touching models or devices; what only a restart can
change (device_id, the models, accelerators, control) is kept and listed in status. One attempt runs at
a time, on the main loop; requests from the control socket wait for an attempt that began after
them (`reload_and_wait`).

Locking: `done` guards the attempt counters and the last outcome; it is taken alone (the
publisher's lock is taken by the daemon's accessors, never under it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING

from .. import __version__
from ..config.errors import ConfigError, ConfigIssue
from ..config.loader import load_config
from ..config.schema import Config, MqttConfig
from ..health.logsetup import redact_text
from ..publish.mqtt import MqttPublisher
from .state import DaemonState

if TYPE_CHECKING:
    from .core import Daemon

log = logging.getLogger(__name__)

#: how long a `reload` request waits for its attempt before answering "still running".
RELOAD_WAIT_S = 30.0
#: top-level keys a reload keeps as they are: they change only on restart
RESTART_KEYS = ("device_id", "models", "accelerators", "control")


def kept_on_reload(new: Config, old: Config) -> Config:
    """`new` with what only a restart changes taken from `old` (the first model goes with the models)."""
    return dataclasses.replace(new, model=old.model, **{key: getattr(old, key) for key in RESTART_KEYS})


class Reloader:
    def __init__(self, daemon: Daemon):
        self._daemon = daemon
        self.requested = threading.Event()  # set by SIGHUP and ctl; the main loop clears and acts
        self.generation = 1  # of the configuration running now
        self.config_error: str | None = None  # why the last attempt was rejected
        self.ignored_changes: list[str] = []  # keys the last applied file changed that need a restart
        self.done = threading.Condition()  # guards the three below
        self._started = 0  # attempts begun (each loads the file after counting itself)
        self._finished = 0
        self._outcome: tuple[int, str | None] = (self.generation, None)  # of the last attempt

    def reload(self) -> None:
        """Load and apply the file; nothing in it may end the daemon. Any failure, expected (a
        ConfigError) or not (a camera or client that cannot start), rejects the file: what was
        changed is put back, the daemon runs on with generation N, and status shows why."""
        daemon = self._daemon
        daemon._transition(DaemonState.RELOADING)
        daemon.notifier.reloading()
        with self.done:
            self._started += 1
        try:
            new = load_config(daemon.config_path, daemon.environ)
            self.check_reloadable(new)
            self.apply(new)
        except ConfigError as exc:
            self._reject(str(exc))
        except Exception as exc:  # noqa: BLE001 - a reload must never end the daemon; reported below
            log.debug("reload: applying the new configuration failed", exc_info=True)
            self._reject(f"{daemon.config_path}: cannot apply the new configuration: "
                         f"{redact_text(str(exc)) or type(exc).__name__}")
        else:
            self.generation += 1
            self.config_error = None
            log.info("configuration reloaded: generation %d", self.generation)
        daemon._transition(DaemonState.RUNNING)
        daemon.notifier.ready(daemon._status_line())
        with self.done:
            self._finished += 1
            self._outcome = (self.generation, self.config_error)
            self.done.notify_all()

    def reload_and_wait(self) -> dict:
        """Ask the main loop for a reload and answer with the outcome of an attempt that began
        after this request, so it read the file as it is now. Requests that arrive together
        share one attempt; an attempt already under way may have read the file before, so it
        does not count. `ControlServer(slow=...)` keeps these waits out of status's way."""
        with self.done:
            wanted = self._started + 1
            self.requested.set()
            if not self.done.wait_for(lambda: self._finished >= wanted, RELOAD_WAIT_S):
                # requested, still running (start-up, or a slow camera): ctl says so
                return {"ok": True, "generation": self.generation, "reloaded": False, "config_error": None}
            now, error = self._outcome
        return {"ok": error is None, "generation": now, "reloaded": error is None, "config_error": error}

    def _reject(self, reason: str) -> None:
        self.config_error = reason
        log.error("reload rejected, keeping the running configuration (generation %d):\n%s",
                  self.generation, reason)

    def check_reloadable(self, new: Config) -> None:
        groups = self._daemon.groups
        unknown = [c.name for c in new.cameras if c.accelerator and c.accelerator not in groups]
        if unknown:
            raise ConfigError([ConfigIssue(self._daemon.config_path, 0, 0, "cameras", None,
                                           f"camera(s) {', '.join(unknown)} name an accelerator that is not "
                                           f"running; accelerators change only on restart", None)])
        kept = kept_on_reload(new, self._daemon.config)
        issues = []
        for camera in new.cameras:
            try:
                kept.camera_models(camera)
            except KeyError:
                issues.append(ConfigIssue(self._daemon.config_path, 0, 0, f"cameras ({camera.name}).models", None,
                                          f"camera {camera.name} names a model its running accelerator does not "
                                          f"load; models change only on restart", None))
        if issues:
            raise ConfigError(issues)

    def apply(self, new: Config) -> None:
        """The HTTP endpoint first (a new address that cannot be bound rejects the reload before
        anything else changed), then the rest; the endpoint goes back when the rest fails."""
        http = self._daemon.http
        old = self._daemon.config.http
        if new.http != old:
            http.apply(new.http)
        try:
            self._apply_settings(new)
        except Exception:
            if new.http != old:
                http.apply(old)
            raise

    def _apply_settings(self, new: Config) -> None:
        """Publisher first, then cameras; when either fails, both go back to the running config
        and the failure is raised for `reload` to report."""
        daemon = self._daemon
        old = daemon.config
        ignored = [key for key in RESTART_KEYS if getattr(new, key) != getattr(old, key)]
        if new.mqtt != old.mqtt:
            self._replace_publisher(new.mqtt, old.mqtt)
        try:
            daemon.config = kept_on_reload(new, old)
            daemon.cameras.apply(old.cameras, new.cameras)
        except Exception:
            daemon.config = old
            try:
                daemon.cameras.apply(daemon.cameras.configs(), old.cameras, strict=False)
            finally:  # the publisher goes back even when putting the cameras back failed
                if new.mqtt != old.mqtt:
                    self._replace_publisher(old.mqtt, new.mqtt)
            raise
        self.ignored_changes = ignored
        if ignored:
            log.warning("reload: %s changed; restart the service to apply (kept running as before)",
                        ", ".join(ignored))

    def _replace_publisher(self, settings: MqttConfig, fallback: MqttConfig) -> None:
        """Reconnect with `settings`; when the new client cannot start, reconnect with `fallback`
        (the settings that worked) and raise."""
        log.info("reload: MQTT settings changed, reconnecting")
        daemon = self._daemon
        # The old client goes first: both would use the same client id, and the broker would
        # bounce the connection between them (and fire the Last Will) while both lived.
        old = daemon._current_publisher()
        if old is not None:
            try:
                old.stop(timeout_s=5.0, final_status=None)
            except Exception:  # stop() logs its own failures; this guards the reload regardless
                log.exception("reload: stopping the MQTT client failed; replacing it anyway")
        daemon._set_publisher(None)  # results and states wait (dropped) until a client runs again
        try:
            daemon._set_publisher(self.online_publisher(settings))
        except Exception:
            daemon._set_publisher(self.online_publisher(fallback))
            raise

    def online_publisher(self, settings: MqttConfig) -> MqttPublisher:
        """A started client that said "online"; one that fails half-way is stopped before the
        error is raised, so its spool lock and threads do not outlive it (the fallback client
        needs that spool directory)."""
        daemon = self._daemon
        publisher = MqttPublisher(settings, daemon.config.device_id, __version__, discovery=daemon.discovery)
        try:
            publisher.start()
            publisher.set_status("online")
        except BaseException:
            publisher.stop(timeout_s=0.0, final_status=None)
            raise
        return publisher
