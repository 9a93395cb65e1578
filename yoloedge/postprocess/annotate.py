"""Detections drawn on a frame and encoded: what a camera's snapshot and an event's best shot show.

Both the latest-frame snapshots (`pipeline.snapshots`) and the events' best shots
(`events.recent`) draw the same boxes in the same colours and encode at the same quality, so
the one implementation sits here, below both: pipeline and events may not import each other.
"""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np

from .detections import Detections, label_of

#: the quality of every JPEG shown (snapshots and best shots)
JPEG_QUALITY = 85

#: BGR colours, one per class id (modulo its length): the same class keeps its colour across
#: frames, cameras and restarts.
PALETTE = ((56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207),
           (10, 249, 72), (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0),
           (168, 153, 44), (255, 194, 0), (147, 69, 52), (255, 115, 100), (236, 24, 0),
           (255, 56, 132), (133, 0, 82), (255, 56, 203), (200, 149, 255), (199, 55, 255))


def class_colour(class_id: int) -> tuple[int, int, int]:
    return PALETTE[class_id % len(PALETTE)]


def annotate(image: np.ndarray, dets: Detections, labels: Sequence[str]) -> np.ndarray:
    """Draw each box and a filled label tag ("person 0.87") on `image` (BGR), in place."""
    height, width = image.shape[:2]
    thickness = max(2, round(min(width, height) / 300))
    scale = max(0.4, min(width, height) / 900)
    for box, score, cid in zip(dets.boxes.tolist(), dets.scores.tolist(), dets.class_ids.tolist()):
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        colour = class_colour(int(cid))
        cv2.rectangle(image, (x1, y1), (x2, y2), colour, thickness)
        text = f"{label_of(labels, cid)} {score:.2f}"
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        top = y1 - th - base - 2 if y1 - th - base - 2 >= 0 else y1  # inside the box at the top edge
        cv2.rectangle(image, (x1, top), (x1 + tw + 2, top + th + base + 2), colour, cv2.FILLED)
        cv2.putText(image, text, (x1 + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1,
                    cv2.LINE_AA)
    return image


def encode_jpeg(image: np.ndarray, quality: int = JPEG_QUALITY) -> bytes | None:
    """`image` as a JPEG; None where OpenCV cannot encode it (an odd channel count)."""
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return encoded.tobytes() if ok else None
