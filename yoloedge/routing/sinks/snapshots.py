"""Each camera's latest processed frame with what was found in it (`pipeline.snapshots`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...pipeline.snapshots import SnapshotStore
from ..router import FrameResult, Sink

if TYPE_CHECKING:
    from . import SinkContext


class SnapshotSink(Sink):
    name = "snapshots"

    def __init__(self, store: SnapshotStore):
        self._store = store

    @classmethod
    def create(cls, context: SinkContext) -> SnapshotSink | None:
        return cls(context.snapshots) if context.snapshots is not None else None

    def frame(self, result: FrameResult) -> None:
        self._store.published(result.camera, result.seq, result.capture_mono, result.capture_time,
                              result.detections, result.labels)
