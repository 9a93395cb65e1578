"""Home Assistant: the retained objects-in-view counts and the discovery of each camera's
entities (rendering and rate limits: `publish.homeassistant`; the client keeps the registry)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ...postprocess import label_of
from ...publish.mqtt import MqttPublisher
from ...sources.state import CameraState
from ..router import FrameResult, Sink

if TYPE_CHECKING:
    from ...config.schema import CameraConfig
    from . import SinkContext


class HomeAssistantSink(Sink):
    name = "homeassistant"

    def __init__(self, publisher: Callable[[], MqttPublisher | None]):
        self._publisher = publisher

    @classmethod
    def create(cls, context: SinkContext) -> HomeAssistantSink:
        return cls(context.publisher)

    def frame(self, result: FrameResult) -> None:
        """The labels of the frames whose detections message goes out (publish_empty decides)."""
        publisher = self._publisher()
        if publisher is None or not result.wanted:
            return
        labels = result.labels
        publisher.count_objects(result.camera, [label_of(labels, c) for c in result.detections.class_ids.tolist()])

    def camera_state(self, camera: str, state: CameraState, reason: str | None, now: float) -> None:
        publisher = self._publisher()
        if publisher is not None:
            publisher.objects_state(camera, state)

    def camera_added(self, config: CameraConfig) -> None:
        publisher = self._publisher()
        if publisher is not None:
            publisher.announce_camera(config.name, config.classes,
                                      [z.name for z in getattr(config, "zones", ())],
                                      [line.name for line in getattr(config, "lines", ())])
