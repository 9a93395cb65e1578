"""Payloads of the MQTT messages the pipeline publishes (documented in docs/integrations/mqtt.md)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..postprocess import Detections, label_of
from ..timeutil import utc_timestamp

SCHEMA_VERSION = 1


def class_mask(dets: Detections, labels: Sequence[str], classes: frozenset[str] | None) -> np.ndarray:
    """Which detections a camera's `classes` keeps (every one without it)."""
    keep = np.ones(len(dets), bool)
    if classes is not None and len(dets):
        names = np.array([label_of(labels, c) for c in dets.class_ids.tolist()], dtype=object)
        keep &= np.isin(names, list(classes))
    return keep


def filter_detections(dets: Detections, labels: Sequence[str], classes: frozenset[str] | None,
                      min_score: float | None) -> Detections:
    """Apply a camera's own filters (on top of the model's thresholds)."""
    keep = class_mask(dets, labels, classes)
    if min_score is not None:
        keep &= dets.scores >= min_score
    if keep.all():
        return dets
    return dets.take(keep)


def detection_message(camera: str, seq: int, capture_time: float, dets: Detections,
                      labels: Sequence[str], model: str, latency_ms: float) -> dict:
    return {
        "v": SCHEMA_VERSION,
        "camera": camera,
        "frame": seq,
        "ts": utc_timestamp(capture_time),
        "width": dets.width,
        "height": dets.height,
        "model": model,
        "latency_ms": round(latency_ms, 1),
        "detections": dets.to_dicts(labels),
    }


def camera_state_message(camera: str, state: str, reason: str | None, ts: float) -> dict:
    return {"v": SCHEMA_VERSION, "camera": camera, "state": state, "reason": reason, "ts": utc_timestamp(ts)}
