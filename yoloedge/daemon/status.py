"""What the daemon reports about itself: `yoloedge-ctl status`, HTTP /api/status and /metrics, the
sd_notify STATUS= line, the MQTT stats message and SIGUSR1's log entry.

One typed snapshot (`DaemonStatus`) is taken per request, on the thread that asks (the control
socket's, the HTTP endpoint's, the main loop's); `as_dict()` is the JSON both ctl and /api/status
print, and /metrics reads the same snapshot by attribute, so none of them can disagree.

Locking: the cameras are read under `CameraSet.lock`, the MQTT client is taken once through the
daemon's accessor (a reload may replace it meanwhile: never read it twice). Nothing else is locked
here; the counters read are single values written by their own threads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .. import __version__
from ..health.progress import Problem
from ..pipeline.worker import WorkerState
from ..pipeline.workerreport import runtime_problems
from ..sources.state import CameraState
from ..timeutil import utc_timestamp
from .state import DaemonState

if TYPE_CHECKING:
    from ..pipeline.worker import DeviceWorker
    from .core import Daemon

#: camera states that make the daemon report a problem (for an enabled camera)
UNHEALTHY_CAMERA_STATES = frozenset({CameraState.STALLED, CameraState.BACKOFF, CameraState.FAILED,
                                     CameraState.CONNECTING})


@dataclass(frozen=True)
class CameraStatus:
    """One camera: its runtime's report (in the order ctl prints it), what its accelerator moved to
    other workers, and its zones and lines. The fields are what the daemon and /metrics read."""

    name: str
    accelerator: str
    state: str  # a CameraState's value
    frames_in: int
    published: int
    drops: int
    reconnects: int
    zones: list[dict]
    lines: list[dict]
    report: Mapping[str, Any]  # CameraRuntime.status()
    rebalanced: Any
    tracking: Mapping[str, Any]  # TrackingStage.camera_status(): zones, lines, best-shot frames

    @classmethod
    def of(cls, report: Mapping[str, Any], rebalanced: Any, tracking: Mapping[str, Any]) -> CameraStatus:
        return cls(name=report["name"], accelerator=report["accelerator"], state=report["state"],
                   frames_in=report.get("frames_in") or 0, published=report.get("published") or 0,
                   drops=report.get("drops") or 0, reconnects=report.get("reconnects") or 0,
                   zones=list(tracking.get("zones") or ()), lines=list(tracking.get("lines") or ()),
                   report=report, rebalanced=rebalanced, tracking=tracking)

    @property
    def streaming(self) -> bool:
        return self.state == CameraState.STREAMING.value

    def as_dict(self) -> dict:
        return {**self.report, "rebalanced": self.rebalanced, **self.tracking}


@dataclass(frozen=True)
class WorkerStatus:
    """One device worker of an accelerator: its own report, and whether the daemon counts it healthy."""

    accelerator: str
    device: Any
    state: str  # a WorkerState's value, as its report gives it
    healthy: bool
    report: Mapping[str, Any]  # DeviceWorker.status()

    @property
    def running(self) -> bool:
        return self.state == WorkerState.RUNNING.value

    def as_dict(self) -> dict:
        return {**self.report, "accelerator": self.accelerator, "healthy": self.healthy}


@dataclass(frozen=True)
class DaemonInfo:
    """Status' `daemon` section."""

    state: DaemonState
    pid: int
    version: str
    device_id: str
    uptime_s: float
    config: str
    generation: int
    config_error: str | None
    restart_needed_for: list[str]
    problems: list[Problem]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            "state": self.state.value,
            "pid": self.pid,
            "version": self.version,
            "device_id": self.device_id,
            "uptime_s": self.uptime_s,
            "config": self.config,
            "generation": self.generation,
            "config_error": self.config_error,
            "restart_needed_for": self.restart_needed_for,
            "healthy": self.healthy,
            "problems": [str(p) for p in self.problems],
        }


@dataclass(frozen=True)
class DaemonStatus:
    daemon: DaemonInfo
    accelerators: list[WorkerStatus]
    cameras: list[CameraStatus]
    mqtt: dict  # MqttPublisher.stats(); empty while no client runs
    sinks: dict  # each result sink's and stage's errors
    watchers: Any  # `yoloedge-ctl watch` clients: queued, dropped
    events: dict  # recent events and best shots kept, per camera
    listeners: dict  # "http", "control": where, and how accept() fares

    def as_dict(self) -> dict:
        return {
            "ok": True,
            "daemon": self.daemon.as_dict(),
            "accelerators": [w.as_dict() for w in self.accelerators],
            "cameras": [c.as_dict() for c in self.cameras],
            "mqtt": self.mqtt,
            "sinks": self.sinks,
            "watchers": self.watchers,
            "events": self.events,
            **self.listeners,
        }


def collect(daemon: Daemon) -> DaemonStatus:
    problems = find_problems(daemon)
    cameras_ = daemon.cameras
    groups = daemon.groups
    with cameras_.lock:
        cameras = [CameraStatus.of(c.status(), groups[c.group].rebalanced_of(c.name),
                                   daemon.tracking.camera_status(c.name))
                   for c in cameras_.runtimes.values()]
    accelerators = [worker_status(group.name, w, problems, media.get(w.worker_name))
                    for group in groups.values()
                    for media in [group.media.status() if group.media is not None else {}]
                    for w in group.workers]
    publisher = daemon._current_publisher()  # once: a reload may replace it meanwhile
    mqtt = publisher.stats() if publisher is not None else {}
    reloader = daemon.reloader
    info = DaemonInfo(state=daemon.state, pid=os.getpid(), version=__version__, device_id=daemon.config.device_id,
                      uptime_s=round(time.monotonic() - daemon.started_mono, 1), config=daemon.config_path,
                      generation=reloader.generation, config_error=reloader.config_error,
                      restart_needed_for=reloader.ignored_changes, problems=problems)
    return DaemonStatus(daemon=info, accelerators=accelerators, cameras=cameras, mqtt=mqtt,
                        sinks=daemon.results.stats(), watchers=daemon.watchers.stats(),
                        events=daemon.events.stats(), listeners=listener_stats(daemon))


def worker_status(accelerator: str, worker: DeviceWorker, problems: list[Problem],
                  media: Mapping[str, Any] | None = None) -> WorkerStatus:
    """`media`: the card's media engine (`decoder: dvpp`), where it is open."""
    report = worker.status()
    if media is not None:
        report = {**report, "media": dict(media)}
    return WorkerStatus(accelerator=accelerator, device=report["device"], state=report["state"],
                        healthy=(worker.state is WorkerState.RUNNING
                                 and not any(p.source == worker.worker_name for p in problems)),
                        report=report)


def listener_stats(daemon: Daemon) -> dict:
    control = daemon.control
    return {"http": daemon.http.stats(), "control": control.stats() if control is not None else {"socket": None}}


def find_problems(daemon: Daemon) -> list[Problem]:
    problems = list(daemon.tracker.check())
    for group in daemon.groups.values():
        for w in group.workers:
            if w.state is WorkerState.FAILED:
                problems.append(Problem(w.worker_name, f"failed to start: {w.startup_error}"))
            for model, error in w.failed_models.items():
                problems.append(Problem(w.worker_name, f"model {model} could not be loaded: {error}"))
            problems += [Problem(w.worker_name, text) for text in runtime_problems(w)]
    now = time.monotonic()
    with daemon.cameras.lock:
        for cam in daemon.cameras.runtimes.values():
            if (cam.config.enabled and cam.state in UNHEALTHY_CAMERA_STATES
                    and not cam.first_connection(now)):
                problems.append(Problem(f"camera {cam.name}", str(cam.state)))
    publisher = daemon._current_publisher()  # once: a reload may replace it meanwhile
    mqtt = publisher.stats() if publisher is not None else None
    if mqtt is not None and not mqtt.get("connected"):
        problems.append(Problem("mqtt", "not connected to the broker"))
    elif mqtt is not None and mqtt.get("ack_stalled"):  # connected, yet nothing arrives
        problems.append(Problem("mqtt", "connected, but the broker does not acknowledge "
                                        "messages (see mqtt.last_error)"))
    if mqtt is not None and mqtt.get("unstable"):  # e.g. a client id taken over again and again
        problems.append(Problem("mqtt", "the broker keeps closing the connection right after "
                                        "accepting it (see mqtt.last_error)"))
    if daemon.reloader.config_error:
        problems.append(Problem("config", "the last reload was rejected (configuration error)"))
    for source, listener in listener_stats(daemon).items():  # out of file descriptors, most likely
        if listener.get("accept_failing"):
            problems.append(Problem(source, f"cannot accept connections: {listener['accept_error']} "
                                            f"({listener['refused']} refused)"))
    return problems


def status_line(daemon: Daemon) -> str:
    """sd_notify's STATUS=: what `systemctl status` shows."""
    cameras = daemon.cameras.snapshot()
    publisher = daemon._current_publisher()
    streaming = sum(1 for c in cameras if c.state is CameraState.STREAMING)
    enabled = sum(1 for c in cameras if c.config.enabled)
    rate = sum(w.stats.frames_done.rate() for g in daemon.groups.values() for w in g.workers)
    mqtt = "connected" if publisher is not None and publisher.stats().get("connected") else "disconnected"
    problems = daemon.tracker.check()
    health = f", PROBLEM: {problems[0]}" if problems else ""
    return (f"{daemon.state}: {streaming}/{enabled} cameras streaming, {rate:.1f} frames/s, "
            f"mqtt {mqtt}{health}")


def stats_message(status: DaemonStatus) -> dict:
    """The periodic MQTT stats message: status' health, devices, cameras and MQTT sections."""
    full = status.as_dict()
    return {"v": 1, "ts": utc_timestamp(), "uptime_s": full["daemon"]["uptime_s"],
            "healthy": full["daemon"]["healthy"], "problems": full["daemon"]["problems"],
            "accelerators": full["accelerators"],
            "cameras": full["cameras"], "mqtt": full["mqtt"]}
