"""Line and zone counts of one camera, and their persistence across restarts.

`CountsState` holds a camera's totals: per line the crossings in and out by label, per zone the
tracks that entered it by label (each track once) and the objects inside it now. A camera fed to
several models has one `CountsState`, shared by each model's `CameraEvents`: its counts are per
label summed over the models (different models normally have different labels; two models both
counting "person" count each person twice), on the same topics and in the same file as one model's. `CameraEvents`
changes it on the router's thread; `CountsStore.reset` (the control thread), `CountsStore.save`
and status read or change it from others, so it has a lock of its own. Lock order: the store's
lock, then a state's lock; a state's lock is a leaf (nothing is called while it is held).

The totals (in, out, entered, since) are kept in one JSON file per camera under the store's
directory (the service's state directory), replaced atomically and durably (temporary file, fsync,
rename, fsync of the folder), so a crash or power cut leaves the old totals or the new ones. The
objects inside a zone are not kept: after a restart every object is a new track.

A file that cannot be read as counts (corrupt, truncated by a full disk, written for another
camera or by another version) is logged, renamed to `<file>.bad-<unix time>` so nothing is lost,
and the camera starts from zero; counts of zones and lines no longer configured are dropped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import YoloedgeError
from ..files import FileProblem, read_bounded, write_atomically
from .types import CountKind, CountsMessage

log = logging.getLogger(__name__)

#: the version of the payloads and of the file format.
COUNTS_VERSION = 1
#: the suffix of a camera's counts file (`gate.counts.json`).
FILE_SUFFIX = ".counts.json"
#: the largest counts file read: thousands of labels on a hundred lines stay far below it.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: the longest label kept from a file (the config's own bound on strings).
MAX_LABEL_BYTES = 4096
#: counts above this in a file are corrupt (a line crossed 10^18 times is not a real count).
MAX_COUNT = 10 ** 18


class UnknownCounts(YoloedgeError):
    """`reset-counts` named a camera without counts, or a line or zone the camera does not have."""


@dataclass
class _Line:
    inbound: dict[str, int] = field(default_factory=dict)
    outbound: dict[str, int] = field(default_factory=dict)
    since: float | None = None


@dataclass
class _Zone:
    entered: dict[str, int] = field(default_factory=dict)
    objects: dict[str, int] = field(default_factory=dict)  # inside now, summed over the models; not persisted
    since: float | None = None
    inside: dict[str, dict[str, int]] = field(default_factory=dict)  # per model: inside now


class CountsState:
    """One camera's counts. `revision` grows with every change to what is persisted, so a save
    can skip a state that did not change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self._zones: dict[str, _Zone] = {}
        self.revision = 0

    # -- configuration ---------------------------------------------------------------------------

    def configure(self, lines: Iterable[tuple[str, Sequence[str]]], zones: Iterable[tuple[str, Sequence[str]]],
                  now: float | None) -> None:
        """Keep the counts of these lines and zones (name, labels shown at zero), drop the others.
        New ones start at zero `since` now (None: at `start`)."""
        with self._lock:
            wanted_lines = dict(lines)
            wanted_zones = dict(zones)
            changed = set(self._lines) != set(wanted_lines) or set(self._zones) != set(wanted_zones)
            self._lines = {name: self._lines.get(name) or _Line(since=now) for name in wanted_lines}
            self._zones = {name: self._zones.get(name) or _Zone(since=now) for name in wanted_zones}
            for name, labels in wanted_lines.items():
                for label in labels:
                    self._lines[name].inbound.setdefault(label, 0)
                    self._lines[name].outbound.setdefault(label, 0)
            for name, labels in wanted_zones.items():
                for label in labels:
                    self._zones[name].entered.setdefault(label, 0)
                    self._zones[name].objects.setdefault(label, 0)
            if changed:
                self.revision += 1

    def start(self, now: float) -> None:
        """Counts without a `since` (new, never saved) start now."""
        with self._lock:
            entries: list[_Line | _Zone] = [*self._lines.values(), *self._zones.values()]
            for counts in entries:
                if counts.since is None:
                    counts.since = now
                    self.revision += 1

    # -- changes from CameraEvents ---------------------------------------------------------------

    def add_crossing(self, line: str, inbound: bool, label: str, n: int = 1) -> None:
        """`n` crossings more (less, when a track's label changed: never below 0)."""
        with self._lock:
            counts = self._lines[line]
            table = counts.inbound if inbound else counts.outbound
            table[label] = max(0, table.get(label, 0) + n)
            (counts.outbound if inbound else counts.inbound).setdefault(label, 0)
            self.revision += 1

    def add_entry(self, zone: str, label: str, n: int = 1) -> None:
        with self._lock:
            entered = self._zones[zone].entered
            entered[label] = max(0, entered.get(label, 0) + n)
            self.revision += 1

    def set_objects(self, zone: str, objects: dict[str, int], model: str = "") -> bool:
        """Set the objects `model` sees inside `zone` now; the zone's `objects` are the sum over
        the camera's models (labels once seen stay, at 0). True when that sum changed."""
        with self._lock:
            counts = self._zones[zone]
            counts.inside = {**counts.inside, model: dict(objects)}
            return _resum(counts)

    def forget_model(self, model: str) -> list[str]:
        """`model` no longer feeds the camera: what it saw inside the zones leaves their
        `objects`; returns the zones whose objects changed."""
        with self._lock:
            changed = []
            for name, counts in self._zones.items():
                if model in counts.inside:
                    counts.inside = {m: seen for m, seen in counts.inside.items() if m != model}
                    if _resum(counts):
                        changed.append(name)
            return changed

    # -- reading ---------------------------------------------------------------------------------

    def line_names(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def zone_names(self) -> list[str]:
        with self._lock:
            return list(self._zones)

    def line_payload(self, name: str) -> dict:
        """`{"v": 1, "in": {label: n}, "out": {label: n}, "since": t}` (issue 17, item 6)."""
        with self._lock:
            counts = self._lines[name]
            return {"v": COUNTS_VERSION, "in": dict(counts.inbound), "out": dict(counts.outbound),
                    "since": counts.since}

    def zone_payload(self, name: str) -> dict:
        """`{"v": 1, "objects": {label: inside now}, "entered": {label: n}, "since": t}`."""
        with self._lock:
            counts = self._zones[name]
            return {"v": COUNTS_VERSION, "objects": dict(counts.objects), "entered": dict(counts.entered),
                    "since": counts.since}

    def message(self, kind: CountKind, name: str) -> CountsMessage:
        payload = self.line_payload(name) if kind is CountKind.LINE else self.zone_payload(name)
        return CountsMessage(kind, name, payload)

    def messages(self) -> list[CountsMessage]:
        """Every line's and zone's counts (published at start, and after a reconnect)."""
        return ([self.message(CountKind.LINE, name) for name in self.line_names()]
                + [self.message(CountKind.ZONE, name) for name in self.zone_names()])

    # -- reset -----------------------------------------------------------------------------------

    def reset(self, name: str | None, now: float) -> list[CountsMessage]:
        """Zero the totals of line or zone `name` (None: all of them) and start them `now`; the
        objects inside stay (they are still there). UnknownCounts for a name it does not have."""
        with self._lock:
            if name is not None and name not in self._lines and name not in self._zones:
                known = ", ".join([*self._lines, *self._zones]) or "none"
                raise UnknownCounts(f"no line or zone named {name!r} (this camera has: {known})")
            kinds = []
            for line_name, line in self._lines.items():
                if name in (None, line_name):
                    line.inbound = dict.fromkeys(line.inbound, 0)
                    line.outbound = dict.fromkeys(line.outbound, 0)
                    line.since = now
                    kinds.append((CountKind.LINE, line_name))
            for zone_name, zone in self._zones.items():
                if name in (None, zone_name):
                    zone.entered = dict.fromkeys(zone.entered, 0)
                    zone.since = now
                    kinds.append((CountKind.ZONE, zone_name))
            self.revision += 1
        return [self.message(kind, kind_name) for kind, kind_name in kinds]

    # -- the file --------------------------------------------------------------------------------

    def to_document(self, camera: str) -> dict:
        with self._lock:
            return {
                "v": COUNTS_VERSION, "camera": camera,
                "lines": {name: {"in": dict(c.inbound), "out": dict(c.outbound), "since": c.since}
                          for name, c in self._lines.items()},
                "zones": {name: {"entered": dict(c.entered), "since": c.since} for name, c in self._zones.items()},
            }

    @classmethod
    def from_document(cls, document: Any, camera: str) -> "CountsState":
        """The state a file holds; ValueError saying what is wrong with it."""
        if not isinstance(document, dict) or document.get("v") != COUNTS_VERSION:
            raise ValueError(f"not a version {COUNTS_VERSION} counts file")
        if document.get("camera") != camera:
            raise ValueError(f"holds the counts of camera {str(document.get('camera'))[:80]!r}")
        state = cls()
        for name, entry in _entries(document, "lines"):
            state._lines[name] = _Line(_table(entry, "in"), _table(entry, "out"), _since(entry))
        for name, entry in _entries(document, "zones"):
            state._zones[name] = _Zone(_table(entry, "entered"), {}, _since(entry))
        return state


def _resum(counts: _Zone) -> bool:
    """A zone's `objects` from what each model sees inside it; True when they changed."""
    summed: dict[str, int] = {}
    for seen in counts.inside.values():
        for label, n in seen.items():
            summed[label] = summed.get(label, 0) + n
    new = {label: 0 for label in counts.objects}
    new.update(summed)
    if new == counts.objects:
        return False
    counts.objects = new
    for label in summed:
        counts.entered.setdefault(label, 0)
    return True


def _entries(document: dict, key: str) -> list[tuple[str, dict]]:
    entries = document.get(key, {})
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise ValueError(f"{key} is not a mapping of names to counts")
    return list(entries.items())


def _table(entry: dict, key: str) -> dict[str, int]:
    table = entry.get(key, {})
    if not isinstance(table, dict):
        raise ValueError(f"{key} is not a mapping of labels to counts")
    for label, count in table.items():
        if len(label.encode("utf-8", "surrogatepass")) > MAX_LABEL_BYTES:
            raise ValueError(f"{key} has a label longer than {MAX_LABEL_BYTES} bytes")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise ValueError(f"{key}.{label[:80]} is not a count")
    return dict(table)


def _since(entry: dict) -> float:
    since = entry.get("since")
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since) or since < 0:
        raise ValueError("since is not a time")
    return float(since)


class CountsStore:
    """The cameras' counts, each kept in `<directory>/<camera>.counts.json`; `directory` None keeps
    them in memory only. Thread-safe (see the module docstring for the lock order)."""

    def __init__(self, directory: Path | None, clock: Callable[[], float] = time.time):
        self.directory = directory
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, CountsState] = {}
        self._saved: dict[str, int] = {}  # camera -> the revision last written

    def path(self, camera: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{camera}{FILE_SUFFIX}"

    def load(self, camera: str) -> CountsState:
        """The camera's state: the one already loaded, else its file's, else zeros. Never raises
        for a bad file (see the module docstring)."""
        with self._lock:
            state = self._states.get(camera)
            if state is None:
                state = self._read(camera)
                self._states[camera] = state
                self._saved[camera] = state.revision
            return state

    def _read(self, camera: str) -> CountsState:
        path = self.path(camera)
        if path is None:
            return CountsState()
        try:
            data = read_bounded(str(path), MAX_FILE_BYTES)
        except FileProblem as exc:
            if exc.reason == "not found":
                return CountsState()
            if not exc.too_large:
                log.warning("camera %s: cannot read its counts: %s; counting from zero", camera, exc,
                            extra={"camera": camera})
                return CountsState()
            return self._set_aside(camera, path, str(exc))
        try:
            return CountsState.from_document(json.loads(data.decode("utf-8")), camera)
        except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            return self._set_aside(camera, path, str(exc))

    def _set_aside(self, camera: str, path: Path, reason: str) -> CountsState:
        aside = path.with_name(f"{path.name}.bad-{int(self._clock())}")
        try:
            os.replace(path, aside)
        except OSError as exc:
            log.warning("camera %s: %s is not a counts file (%s) and cannot be moved aside (%s); counting "
                        "from zero", camera, path, reason[:200], exc.strerror or exc, extra={"camera": camera})
        else:
            log.warning("camera %s: %s is not a counts file (%s); kept as %s, counting from zero",
                        camera, path, reason[:200], aside.name, extra={"camera": camera})
        return CountsState()

    def save(self, camera: str, state: CountsState) -> bool:
        """Write the camera's totals when they changed since the last save; True when they are on
        disk (or nothing needed writing). A failed write is logged and tried again next time."""
        path = self.path(camera)
        with self._lock:
            if path is None or self._saved.get(camera) == state.revision:
                return True
            revision = state.revision
            document = state.to_document(camera)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(str(path), json.dumps(document, sort_keys=True).encode("utf-8"),
                                 mode=0o644, durable=True)
            except OSError as exc:
                log.warning("camera %s: cannot save its counts to %s: %s", camera, path, exc.strerror or exc,
                            extra={"camera": camera})
                return False
            self._saved[camera] = revision
            return True

    def reset(self, camera: str, name: str | None, now: float) -> list[CountsMessage]:
        """Zero a camera's line or zone (None: all), saved at once; the messages to publish.
        UnknownCounts for a camera that has no counts or a name it does not have."""
        with self._lock:
            state = self._states.get(camera)
            if state is None:
                known = ", ".join(self._states) or "none"
                raise UnknownCounts(f"camera {camera!r} has no counts (cameras with counts: {known})")
        messages = state.reset(name, now)
        self.save(camera, state)
        return messages

    def forget(self, camera: str) -> None:
        """The camera was removed by a reload: its state goes (its file stays, for when it returns)."""
        with self._lock:
            self._states.pop(camera, None)
            self._saved.pop(camera, None)
