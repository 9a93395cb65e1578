"""Matching our detections against a peer's reference detections (the parity rule of issue 2).

Rule: every reference detection with score >= 0.30 has one of ours with the same class,
IoU >= 0.90 and |score difference| <= 0.02; and none of ours with score >= 0.30 is left without a
reference partner under the same rule (partners below 0.30 count, so a detection that sits right at
the threshold on one side and just under it on the other is not an error).

The rule itself lives in `yoloedge.verify` (`compare_detections`), so that `yoloedge verify` and
these tests mean the same thing by "agree".
"""

from __future__ import annotations

import numpy as np

from yoloedge.verify import MAX_SCORE_DIFF, MIN_IOU, MIN_SCORE, compare_detections, iou

__all__ = ["MAX_SCORE_DIFF", "MIN_IOU", "MIN_SCORE", "box_array", "iou", "mismatches"]


def mismatches(ours: list[dict], reference: list[dict]) -> list[str]:
    """Human-readable list of parity violations; empty when the two agree."""
    return compare_detections(ours, reference).problems()


def box_array(dets) -> np.ndarray:
    return np.array([d["box"] for d in dets], np.float32).reshape(-1, 4)
