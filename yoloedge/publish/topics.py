"""MQTT topic names, in one place so the daemon, the tests and docs/integrations/mqtt.md agree.

Layout (see docs/integrations/mqtt.md)::

    {prefix}/{device_id}/status                       retained, QoS 1
    {prefix}/{device_id}/cameras/{camera}/detections  QoS mqtt.qos
    {prefix}/{device_id}/cameras/{camera}/state       retained, QoS mqtt.qos
    {prefix}/{device_id}/stats                        QoS mqtt.qos
    {prefix}/{device_id}/cameras/{camera}/objects     retained, QoS 1 (Home Assistant only)
    {prefix}/{device_id}/cameras/{camera}/events      QoS 1 (zones/lines/tracking events)
    {prefix}/{device_id}/cameras/{camera}/lines/{line} retained, QoS 1 (a line's in/out counts)
    {prefix}/{device_id}/cameras/{camera}/zones/{zone} retained, QoS 1 (a zone's counts)

Names are checked here because a camera called "a/b" or "cam+1" would silently publish to
another topic level, or make the broker reject the publish as a wildcard topic.
"""

from __future__ import annotations

from dataclasses import dataclass

_FORBIDDEN_IN_LEVEL = ("/", "+", "#", "\x00")
_FORBIDDEN_IN_PREFIX = ("+", "#", "\x00")


def _level(value: str, what: str) -> str:
    """Return `value` if it is usable as exactly one topic level, else raise ValueError."""
    if not value:
        raise ValueError(f"{what} must not be empty (it is one MQTT topic level)")
    bad = [c for c in _FORBIDDEN_IN_LEVEL if c in value]
    if bad:
        raise ValueError(f"{what} {value!r} contains {bad!r}; it must be one MQTT topic level "
                         "without '/', '+', '#' or NUL")
    return value


def _prefix(value: str) -> str:
    """Return the prefix if usable; it may span levels ("site1/yoloedge") but has no wildcards."""
    if not value or value.startswith("/") or value.endswith("/"):
        raise ValueError(f"topic prefix {value!r} must be non-empty and not start or end with '/'")
    bad = [c for c in _FORBIDDEN_IN_PREFIX if c in value]
    if bad:
        raise ValueError(f"topic prefix {value!r} contains {bad!r}; wildcards are not allowed")
    return value


def status_topic(prefix: str, device_id: str) -> str:
    """Retained online/offline/stopped status of the device (also the Last Will topic)."""
    return f"{_prefix(prefix)}/{_level(device_id, 'device id')}/status"


def detections_topic(prefix: str, device_id: str, camera: str) -> str:
    """One message per processed frame of `camera`."""
    return f"{_camera_base(prefix, device_id, camera)}/detections"


def camera_state_topic(prefix: str, device_id: str, camera: str) -> str:
    """Retained state of `camera` (running, reconnecting, failed ...)."""
    return f"{_camera_base(prefix, device_id, camera)}/state"


def camera_objects_topic(prefix: str, device_id: str, camera: str) -> str:
    """Retained {label: count} of the objects `camera` sees (Home Assistant discovery only)."""
    return f"{_camera_base(prefix, device_id, camera)}/objects"


def events_topic(prefix: str, device_id: str, camera: str) -> str:
    """`camera`'s tracked objects' events (new, update, end)."""
    return f"{_camera_base(prefix, device_id, camera)}/events"


def counts_topic(prefix: str, device_id: str, camera: str, kind: str, name: str) -> str:
    """Retained counts of one of `camera`'s lines (`kind` "line") or zones ("zone")."""
    if type(kind) is not str or kind not in ("line", "zone"):  # an Enum's str() is not its value
        raise ValueError(f"counts kind {kind!r}: must be the string 'line' or 'zone'")
    return f"{_camera_base(prefix, device_id, camera)}/{kind}s/{_level(name, f'{kind} name')}"


def stats_topic(prefix: str, device_id: str) -> str:
    """Periodic counters of the whole device."""
    return f"{_prefix(prefix)}/{_level(device_id, 'device id')}/stats"


def _camera_base(prefix: str, device_id: str, camera: str) -> str:
    return f"{_prefix(prefix)}/{_level(device_id, 'device id')}/cameras/{_level(camera, 'camera name')}"


@dataclass(frozen=True)
class Topics:
    """The topic builders bound to one prefix and device id (validated once, at construction)."""

    prefix: str
    device_id: str

    def __post_init__(self) -> None:
        _prefix(self.prefix)
        _level(self.device_id, "device id")

    @property
    def status(self) -> str:
        return status_topic(self.prefix, self.device_id)

    @property
    def stats(self) -> str:
        return stats_topic(self.prefix, self.device_id)

    def detections(self, camera: str) -> str:
        return detections_topic(self.prefix, self.device_id, camera)

    def camera_state(self, camera: str) -> str:
        return camera_state_topic(self.prefix, self.device_id, camera)

    def camera_objects(self, camera: str) -> str:
        return camera_objects_topic(self.prefix, self.device_id, camera)

    def events(self, camera: str) -> str:
        return events_topic(self.prefix, self.device_id, camera)

    def counts(self, camera: str, kind: str, name: str) -> str:
        return counts_topic(self.prefix, self.device_id, camera, kind, name)
