"""MQTT: the events of tracked objects (`cameras/{camera}/events`, QoS 1) and the retained counts
of each line and zone (`cameras/{camera}/lines/{line}`, `.../zones/{zone}`), as the events stage
(`stages`, `yoloedge.events`) makes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ...publish.mqtt import MqttPublisher
from ..router import FrameResult, Sink, publishes_events

if TYPE_CHECKING:
    from ...config.schema import CameraConfig
    from . import SinkContext


class EventsSink(Sink):
    name = "mqtt_events"

    def __init__(self, publisher: Callable[[], MqttPublisher | None]):
        self._publisher = publisher
        self.published = 0
        self.dropped = 0  # refused by the client (its queue limits; see publish.mqtt)
        self._quiet: frozenset[str] = frozenset()  # cameras with `publish: detections`

    @classmethod
    def create(cls, context: SinkContext) -> EventsSink:
        return cls(context.publisher)

    def camera_added(self, config: CameraConfig) -> None:
        quiet = self._quiet - {config.name}
        self._quiet = quiet if publishes_events(config) else quiet | {config.name}

    def frame(self, result: FrameResult) -> None:
        if result.events is not None:
            self.events(result.camera, result.events)

    def events(self, camera: str, batch: Any) -> None:
        if camera in self._quiet:
            return
        publisher = self._publisher()
        if publisher is None:
            self.dropped += len(batch.messages)
            return
        for message in batch.messages:
            if publisher.publish_event(camera, message):
                self.published += 1
            else:
                self.dropped += 1
        for counts in batch.counts:
            publisher.publish_counts(camera, counts.kind.value, counts.name, counts.payload)

    def stats(self) -> dict:
        return {"published": self.published, "dropped": self.dropped}
