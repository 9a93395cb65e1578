"""MQTT: each camera's retained `state` topic, and its removal with the camera."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ...publish.messages import camera_state_message
from ...publish.mqtt import MqttPublisher
from ...sources.state import CameraState
from ..router import Sink

if TYPE_CHECKING:
    from . import SinkContext


class CameraStateSink(Sink):
    name = "mqtt_state"

    def __init__(self, publisher: Callable[[], MqttPublisher | None]):
        self._publisher = publisher

    @classmethod
    def create(cls, context: SinkContext) -> CameraStateSink:
        return cls(context.publisher)

    def camera_state(self, camera: str, state: CameraState, reason: str | None, now: float) -> None:
        publisher = self._publisher()
        if publisher is not None:
            publisher.publish_camera_state(camera, camera_state_message(camera, str(state), reason, now))

    def camera_removed(self, camera: str) -> None:
        """An empty retained message deletes the removed camera's state."""
        publisher = self._publisher()
        if publisher is not None:
            publisher.clear_camera(camera)
