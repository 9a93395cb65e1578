"""Home Assistant: the retained objects-in-view counts and the discovery of each camera's
entities. The counting is here, on the result path, because it follows the frames and the camera
states the router sees; the rendering and rate limits are `publish.homeassistant`'s, and the
client keeps the registry and hands the messages over (`MqttPublisher.publish_discovery`).

A camera fed to several models (`runtime.models`) counts each model's frames apart, into per-model
sensors (see `publish.homeassistant`); the registry learns its models from its frames, so a
reload that changes them changes its sensors with the first frame after it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from ...postprocess import label_of
from ...publish.mqtt import MqttPublisher
from ...sources.state import CameraState
from ..router import FrameResult, Sink

if TYPE_CHECKING:
    from ...config.schema import CameraConfig
    from . import SinkContext


class HomeAssistantSink(Sink):
    name = "homeassistant"

    def __init__(self, publisher: Callable[[], MqttPublisher | None],
                 clock: Callable[[], float] = time.monotonic):
        self._publisher = publisher
        self._clock = clock  # the objects-in-view rate limit (OBJECTS_MIN_INTERVAL_S)

    @classmethod
    def create(cls, context: SinkContext) -> HomeAssistantSink:
        return cls(context.publisher, context.clock)

    def frame(self, result: FrameResult) -> None:
        """The labels of the frames whose detections message goes out (publish_empty decides)."""
        publisher = self._publisher()
        if publisher is None or not result.wanted:
            return
        labels = result.labels
        models = result.runtime.models
        self._set_models(publisher, result.camera, models)
        self._count_objects(publisher, result.camera,
                            [label_of(labels, c) for c in result.detections.class_ids.tolist()],
                            result.model if len(models) > 1 else "", labels)

    @staticmethod
    def _set_models(publisher: MqttPublisher, camera: str, models: Sequence[str]) -> None:
        """The camera's models as its frames say: from one to several (or back), or another set,
        its label sensors change (the old ones removed, those known now announced)."""
        changed, gone = publisher.discovery.set_models(camera, models)
        ha = publisher.homeassistant
        if not changed or ha is None:
            return
        if gone:
            publisher.publish_discovery(ha.removals(camera, gone, whole_camera=False), removal=True)
        publisher.publish_discovery(ha.label_configs(camera, publisher.discovery.labels(camera) or []))

    def _count_objects(self, publisher: MqttPublisher, camera: str, labels: Sequence[str], model: str = "",
                       model_labels: Sequence[str] = ()) -> None:
        """The objects-in-view counts from the message as published; a label seen for the first
        time (a camera without `classes`) gets its sensor first."""
        ha = publisher.homeassistant
        if ha is None:
            return
        new, counts = ha.discovery.count(camera, labels, self._clock(), model, model_labels)
        out = ha.label_configs(camera, new) if new else []
        if counts is not None:
            out.append(ha.objects(camera, counts))
        if out:
            publisher.publish_discovery(out)

    def camera_state(self, camera: str, state: CameraState, reason: str | None, now: float) -> None:
        """A camera that stops streaming sees nothing now: zeros at once, and no counts until it
        streams again (the registry is kept while discovery is off, so a reload can turn it on)."""
        publisher = self._publisher()
        if publisher is None:
            return
        if state is CameraState.STREAMING:
            publisher.discovery.resume_counts(camera)
            return
        ha = publisher.homeassistant
        if ha is not None:
            zeros = ha.discovery.clear_counts(camera, self._clock())
            if zeros is not None:
                publisher.publish_discovery([ha.objects(camera, zeros)])

    def camera_added(self, config: CameraConfig) -> None:
        """Register the camera for discovery (again, after its settings changed): its configs,
        and removals for the label sensors its new `classes` no longer list and for the zones
        and lines it no longer has."""
        publisher = self._publisher()
        if publisher is None:
            return
        camera, discovery = config.name, publisher.discovery
        gone = discovery.set_camera(camera, config.classes)
        gone_zones, gone_lines = discovery.set_counters(
            camera, [z.name for z in getattr(config, "zones", ())],
            [line.name for line in getattr(config, "lines", ())])
        ha = publisher.homeassistant
        if ha is None:
            return
        if gone:
            publisher.publish_discovery(ha.removals(camera, gone, whole_camera=False), removal=True)
        if gone_zones or gone_lines:
            publisher.publish_discovery(ha.counter_removals(camera, gone_zones, gone_lines),
                                        removal=True)
        publisher.publish_discovery(ha.configs(camera, discovery.labels(camera) or []))

    def camera_removed(self, camera: str) -> None:
        """Forget the camera, and delete its entities (empty retained configs); before its
        retained state goes (the state sink comes after this one)."""
        publisher = self._publisher()
        if publisher is None:
            return
        counters = publisher.discovery.counters(camera)
        labels = publisher.discovery.remove_camera(camera)
        ha = publisher.homeassistant
        if ha is not None and labels is not None:
            publisher.publish_discovery(ha.removals(camera, labels, whole_camera=True,
                                                    counters=counters), removal=True)
