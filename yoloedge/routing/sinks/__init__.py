"""The result sinks: one module each, registered once in `REGISTRY` (see `routing.router`).

A sink is built from the `SinkContext` (what the daemon lends the sinks); `build_sinks` makes the
daemon's list in registry order, which is the order they are called in per frame.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...control.watch import WatchHub
from ...pipeline.snapshots import SnapshotStore
from ...publish.mqtt import MqttPublisher
from ..router import Sink
from .detections import DetectionsSink
from .eventlog import EventLogSink
from .events import EventsSink
from .homeassistant import HomeAssistantSink
from .metrics import MetricsSink
from .snapshots import SnapshotSink
from .state import CameraStateSink
from .watch import WatchSink


@dataclass
class SinkContext:
    """What the daemon lends its sinks."""

    publisher: Callable[[], MqttPublisher | None]  # the current client: a reload may replace it
    snapshots: SnapshotStore | None = None
    watchers: WatchHub | None = None
    event_log: Any = None  # events.recent.EventLog: the recent events and their best shots
    clock: Callable[[], float] = field(default=time.monotonic)


#: every sink, in the order each frame reaches them. Adding a sink: its module, one line here.
REGISTRY: tuple[Callable[[SinkContext], Sink | None], ...] = (
    SnapshotSink.create,
    MetricsSink.create,
    DetectionsSink.create,
    EventsSink.create,
    EventLogSink.create,
    HomeAssistantSink.create,
    CameraStateSink.create,
    WatchSink.create,
)


def build_sinks(context: SinkContext) -> list[Sink]:
    return [sink for sink in (make(context) for make in REGISTRY) if sink is not None]
