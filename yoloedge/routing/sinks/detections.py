"""MQTT: each frame's detections message (`cameras/{camera}/detections`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ...publish.mqtt import MqttPublisher
from ..router import FrameResult, Sink, publishes_detections

if TYPE_CHECKING:
    from . import SinkContext


class DetectionsSink(Sink):
    name = "mqtt_detections"

    def __init__(self, publisher: Callable[[], MqttPublisher | None]):
        self._publisher = publisher

    @classmethod
    def create(cls, context: SinkContext) -> DetectionsSink:
        return cls(context.publisher)

    def frame(self, result: FrameResult) -> None:
        publisher = self._publisher()
        if publisher is None or not result.wanted or not publishes_detections(result.config):
            return
        if not publisher.publish_detections(result.camera, result.message):
            result.runtime.publish_failures += 1
