"""The daemon's cameras: the one owner of a camera's lifecycle, from its reader and queue to its
removal, and of moving the running set to a new list when a reload asks for it.

A camera is assembled here (reader -> snapshot tap -> frame keeper -> its accelerator's intake,
then a `CameraRuntime`), registered, announced to the result router and started. Removing it stops
the reader, drops what it still has queued and frees its pictures at once; the C heap they came
from goes back to the system from the main loop (`give_back_memory`) once the capture threads have
let go of them.

Locking: `lock` guards `runtimes` against the control and HTTP threads (status, /metrics). It is a
leaf: nothing under it takes another lock of the daemon's. The frames' path reads `runtimes`
without it: one `dict.get` per frame cannot see the dict change half-way.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import threading
import time
from typing import Callable, Mapping, Sequence

from ..config.schema import CameraConfig, Config
from ..events.recent import EventLog
from ..heap import release_free_heap
from ..pipeline.cameras import CameraRuntime, is_lossless, queue_size_for
from ..pipeline.groups import AcceleratorGroup
from ..pipeline.media import MediaError
from ..routing.router import ResultRouter
from ..pipeline.snapshots import SnapshotStore
from ..routing import FrameKeeper, TrackingStage
from ..sources.framepool import FramePool
from ..sources.reader import CameraReader

log = logging.getLogger(__name__)

#: a removed camera's capture thread still in a read holds its last frame until the read returns
#: (a frozen camera: up to a few read timeouts); the freed heap goes back once all have ended,
#: or after this long regardless
RELEASE_WAIT_S = 30.0
#: camera keys a reload applies without restarting the camera: its tracks go on
LIVE_CAMERA_KEYS = ("zones", "lines", "publish", "tracking")


def live_change(before: CameraConfig, after: CameraConfig) -> bool:
    """The two differ only in keys a reload applies without restarting the camera."""
    keep = {key: getattr(before, key) for key in LIVE_CAMERA_KEYS if hasattr(before, key)}
    return before != after and dataclasses.replace(after, **keep) == before


@dataclasses.dataclass(frozen=True)
class CameraParts:
    """What a camera is wired to besides its accelerator: the stores and stages every camera shares."""

    snapshots: SnapshotStore  # each camera's latest processed frame (ctl snapshot, HTTP)
    events: EventLog  # each camera's recent events and their best shots
    keeper: FrameKeeper  # full frames held for event best shots
    tracking: TrackingStage  # per camera a tracker and its zones, lines and events
    results: ResultRouter  # where each processed frame goes
    frames: FramePool  # the BGR buffers the OpenCV captures retrieve their kept frames into


class CameraSet:
    def __init__(self, runtimes: dict[str, CameraRuntime], parts: CameraParts, *,
                 groups: Callable[[], Mapping[str, AcceleratorGroup]], settings: Callable[[], Config]):
        #: shared with the result router, which looks each frame's camera up in it
        self.runtimes = runtimes
        self.parts = parts
        self._groups = groups  # built once the accelerators start; read at each use
        self._settings = settings  # the running configuration: a reload replaces it
        self.lock = threading.Lock()  # guards `runtimes` (see the module docstring)
        #: cameras removed since the freed heap last went back, and since when (`give_back_memory`)
        self._removed: list[CameraRuntime] = []
        self._removed_since = 0.0

    def snapshot(self) -> list[CameraRuntime]:
        with self.lock:
            return list(self.runtimes.values())

    def configs(self) -> tuple[CameraConfig, ...]:
        """The cameras as they run now (a failed reload puts these back)."""
        with self.lock:
            return tuple(runtime.config for runtime in self.runtimes.values())

    def group_for(self, camera: CameraConfig) -> AcceleratorGroup:
        groups = self._groups()
        name = camera.accelerator or next(iter(groups))
        return groups[name]

    # -- one camera --------------------------------------------------------------------------
    def add(self, camera: CameraConfig) -> None:
        parts = self.parts
        group = self.group_for(camera)
        feed = reader = None
        wanted = [m.name for m in self._settings().camera_models(camera)]
        warn_unknown_classes(camera, model_labels(group, wanted))
        failed = None if group.serving else f"accelerator {group.name} did not start"
        if failed is None and not group.serving_models(wanted):
            failed = f"its model(s) {', '.join(wanted)} could not be loaded on accelerator {group.name}"
        media = None
        queue_size = queue_size_for(camera, group.config.batch)
        if camera.enabled and failed is None:
            try:
                media = group.media_for(camera, wanted, queue_size)
            except MediaError as exc:
                failed = str(exc)
        if camera.enabled and failed is None:
            feed = group.add_camera(camera.name, queue_size, is_lossless(camera), wanted,
                                    device=media.device if media is not None else None)
            reader = CameraReader(camera, parts.snapshots.tap(camera.name, parts.keeper.tap(camera.name, feed,
                                                                                  is_lossless(camera))),
                                  self._settings().health.stall_timeout_s, parts.results.camera_state,
                                  pool=parts.frames, media=media)
        runtime = CameraRuntime(camera, group.name, feed, reader, failed=failed if camera.enabled else None,
                                models=list(feed.intakes) if feed is not None else wanted)
        errors = group.model_errors()
        runtime.model_errors = {name: errors[name] for name in wanted if name in errors}
        parts.snapshots.add(camera.name)
        parts.events.configure_camera(camera)
        with self.lock:
            self.runtimes[camera.name] = runtime
        parts.results.camera_added(camera)  # before its first state: Home Assistant discovery
        labels = model_labels(group, runtime.models)
        if labels:  # its trackers and events, per model (kept through a restart)
            parts.tracking.configure(camera, labels)
        if reader is None:
            parts.results.camera_state(camera.name, runtime.state, failed or "enabled: false")
        runtime.start()

    def remove(self, name: str, clear_state: bool = True) -> None:
        parts = self.parts
        with self.lock:
            runtime = self.runtimes.pop(name, None)
        if runtime is None:
            return
        parts.snapshots.forget(name)
        runtime.stop()
        if not runtime.join(self._settings().shutdown_timeout_s):
            log.warning("camera %s reader did not stop in time", name, extra={"camera": name})
        dropped = self._groups()[runtime.group].remove_camera(name)
        runtime.close()  # its pictures go now, not when a lingering capture thread lets go
        if not self._removed:
            self._removed_since = time.monotonic()
        self._removed.append(runtime)
        if dropped:
            log.info("camera %s removed with %d queued frame(s) discarded", name, dropped, extra={"camera": name})
        parts.keeper.forget(name)  # the frames it held for best shots (a restart makes it again)
        if clear_state:  # its events end; its retained state and Home Assistant entities go
            parts.tracking.remove(name)
            parts.events.forget_camera(name)
            parts.results.camera_removed(name)

    def start(self, camera: CameraConfig, previous: CameraConfig | None, strict: bool) -> None:
        """Add `camera`; when it cannot start, undo what was half built and start `previous` (its
        settings before a reload) instead, then raise when `strict` or log it."""
        try:
            self.add(camera)
        except Exception as exc:
            self._forget_half_added(camera)
            if previous is not None:
                self.start(previous, None, strict=False)
            if strict:
                raise
            log.error("reload: camera %s could not be started: %s", camera.name, exc, extra={"camera": camera.name})

    def _forget_half_added(self, camera: CameraConfig) -> None:
        """`add` registers the camera's queue before it builds the reader: undo what it did."""
        with self.lock:
            registered = camera.name in self.runtimes
        if registered:
            self.remove(camera.name, clear_state=False)
            return
        try:
            group = self.group_for(camera)
        except (KeyError, StopIteration):
            return  # no such accelerator: `add` failed before it registered anything
        group.remove_camera(camera.name)

    def _apply_live(self, camera: CameraConfig) -> None:
        """Zones, lines, publish and tracking change under a running camera: its tracks go on."""
        with self.lock:
            runtime = self.runtimes[camera.name]
            runtime.config = camera
        self.parts.results.camera_added(camera)  # Home Assistant's zone and line sensors, publish mode
        labels = model_labels(self._groups()[runtime.group], runtime.models)
        if labels:
            self.parts.tracking.configure(camera, labels)

    # -- the whole set -----------------------------------------------------------------------
    def apply(self, old: tuple[CameraConfig, ...], new: tuple[CameraConfig, ...], strict: bool = True) -> None:
        """Move the cameras from `old` to `new`, one by one. A camera that cannot start raises
        (after its old settings are back) when `strict`; when rolling back, it is logged and the
        others still go back."""
        before = {c.name: c for c in old}
        after = {c.name: c for c in new}
        for name in before.keys() - after.keys():
            log.info("reload: removing camera %s", name, extra={"camera": name})
            self.remove(name)
        for name, cam in after.items():
            if name in before and live_change(before[name], cam):
                log.info("reload: camera %s: new zones, lines or tracking settings", name, extra={"camera": name})
                self._apply_live(cam)
            elif name in before and before[name] != cam:
                log.info("reload: restarting camera %s with its new settings", name, extra={"camera": name})
                self.remove(name, clear_state=False)
                self.start(cam, before[name], strict)
            elif name not in before:
                log.info("reload: adding camera %s", name, extra={"camera": name})
                self.start(cam, None, strict)

    def give_back_memory(self, now: float) -> None:
        """Main loop: once the cameras removed by a reload have let go of their frames (their
        capture threads have ended), hand the freed heap back: the C allocator keeps it otherwise
        (see `heap`)."""
        if not self._removed:
            return
        if now - self._removed_since < RELEASE_WAIT_S and any(r.open_captures() for r in self._removed):
            return
        self._removed = []
        self.parts.frames.clear()  # the buffers the removed cameras used are not needed any more
        released = release_free_heap()
        if released:
            log.info("%.0f MB of memory freed by removed cameras returned to the system", released / 2**20)


def model_labels(group: AcceleratorGroup, models: Sequence[str]) -> dict[str, list[str]]:
    """{model: its labels} for the models a camera's frames go to that some device has loaded
    (only those: a lossless camera's kept frames wait for every model named here)."""
    labels = {}
    for model in models:
        detector = group.detector_of(model)
        if detector is not None:
            labels[model] = list(detector.labels)
    return labels


def warn_unknown_classes(camera: CameraConfig, models: Mapping[str, Sequence[str]]) -> None:
    """The config check cannot know the labels of a model without metadata in the config; a typo
    would silently hide everything. `models`: the labels of each model the camera gets."""
    labels = list(dict.fromkeys(label for names in models.values() for label in names))
    if camera.classes is None or not labels:
        return
    for name in camera.classes:
        if name not in labels:
            close = difflib.get_close_matches(name, labels, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            log.warning("camera %s: class %r is not one of its models' labels%s; it will never match",
                        camera.name, name, hint, extra={"camera": camera.name})
