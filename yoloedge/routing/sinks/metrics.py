"""Per-camera counters for status and /metrics: frames out, latency per stage, detections per label."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..router import FrameResult, Sink

if TYPE_CHECKING:
    from . import SinkContext


class MetricsSink(Sink):
    name = "metrics"

    @classmethod
    def create(cls, context: SinkContext) -> MetricsSink:
        return cls()

    def frame(self, result: FrameResult) -> None:
        runtime = result.runtime
        if not result.wanted:
            runtime.filtered_out += 1
            return
        runtime.record_frame(result.capture_mono, result.taken_mono, result.started_mono,
                             result.inferred_mono, result.routed_mono, result.model)
        runtime.count_labels(result.detections.class_ids, result.labels, result.model)
