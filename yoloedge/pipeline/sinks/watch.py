"""`yoloedge-ctl watch`: every detections message, as it goes out (see `control.watch`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...control.watch import WatchHub
from ..results import FrameResult, Sink, publishes_detections

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
