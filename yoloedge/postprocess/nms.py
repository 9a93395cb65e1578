"""Greedy non-maximum suppression in NumPy.

Ordering follows torchvision/Ultralytics: a stable sort on descending score, so among tied scores
the box that came first in the model output wins. Scores are only compared, never assumed to lie
in [0, 1].
"""

from __future__ import annotations

import numpy as np

#: Class offset used for class-aware NMS (Ultralytics' and YOLOv5's `max_wh`): boxes of different
#: classes are shifted apart so that they can never overlap.
CLASS_OFFSET = 7680.0


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices of the boxes kept, highest score first. `boxes` is (n, 4) xyxy."""
    n = len(scores)
    if n == 0:
        return np.empty(0, np.intp)
    order = np.argsort(-scores, kind="stable")
    if n == 1:
        return order
    b = boxes[order].astype(np.float32, copy=False)
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    keep = np.empty(n, np.intp)
    kept = 0
    remaining = np.arange(n)
    while remaining.size:
        i = remaining[0]
        keep[kept] = i
        kept += 1
        rest = remaining[1:]
        if not rest.size:
            break
        w = np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])
        h = np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])
        inter = np.clip(w, 0, None) * np.clip(h, 0, None)
        union = areas[i] + areas[rest] - inter
        # A zero union (two empty boxes) has no overlap to speak of: keep both.
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = np.where(union > 0, inter / union, 0.0)
        remaining = rest[iou <= iou_threshold]
    return order[keep[:kept]]


def batched_nms(boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray,
                iou_threshold: float, agnostic: bool = False) -> np.ndarray:
    """Class-aware NMS (boxes of different classes never suppress each other) unless `agnostic`."""
    if agnostic or len(scores) == 0:
        return nms(boxes, scores, iou_threshold)
    offset = class_ids.astype(np.float32)[:, None] * CLASS_OFFSET
    return nms(boxes + offset, scores, iou_threshold)
