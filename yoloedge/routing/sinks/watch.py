"""`yoloedge-ctl watch`: every detections message, and with `--events` every event message, as
they go out (see `control.watch`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...control.watch import WatchHub
from ..router import FrameResult, Sink, publishes_detections

if TYPE_CHECKING:
    from . import SinkContext


class WatchSink(Sink):
    name = "watch"

    def __init__(self, hub: WatchHub):
        self._hub = hub

    @classmethod
    def create(cls, context: SinkContext) -> WatchSink | None:
        return cls(context.watchers) if context.watchers is not None else None

    def frame(self, result: FrameResult) -> None:
        if result.wanted and publishes_detections(result.config) and self._hub.watched:
            self._hub.publish(result.camera, result.message)
        if result.events is not None:
            self.events(result.camera, result.events)

    def events(self, camera: str, batch: Any) -> None:
        for message in batch.messages:
            self._hub.publish_event(camera, message)
