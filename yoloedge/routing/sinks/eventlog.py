"""The recent events and their best shots (`events.recent.EventLog`: `GET /api/events`,
`yoloedge-ctl events`): every event message, and the JPEG of each event's best frame, encoded
from the full frame while the router still holds it (see `stages.FrameKeeper`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..router import FrameResult, Sink

if TYPE_CHECKING:
    from . import SinkContext


class EventLogSink(Sink):
    name = "event_log"

    def __init__(self, log: Any):
        self._log = log
        self.best_shots = 0
        self.missed_shots = 0  # a better shot whose frame was not kept (see `stages.FrameKeeper`)

    @classmethod
    def create(cls, context: SinkContext) -> EventLogSink | None:
        return cls(context.event_log) if context.event_log is not None else None

    def frame(self, result: FrameResult) -> None:
        batch = result.events
        if batch is None:
            return
        for message in batch.messages:
            self._log.record(message)
        for shot in batch.best:
            if result.image is None:
                self.missed_shots += 1
                continue
            width = result.detections.width  # the kept picture may be scaled down (FrameKeeper)
            scale = result.image.shape[1] / width if width > 0 else 1.0
            self._log.best_shot(result.camera, shot.event_id, result.image, shot.box, shot.score,
                                shot.frame_time, scale=scale)
            self.best_shots += 1

    def events(self, camera: str, batch: Any) -> None:
        for message in batch.messages:
            self._log.record(message)

    def stats(self) -> dict:
        return {"best_shots": self.best_shots, "missed_shots": self.missed_shots}  # the log's own: status.events
