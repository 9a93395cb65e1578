"""The result of one frame: boxes in source pixels, scores and class ids, as parallel arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def label_of(labels: Sequence[str], class_id: int) -> str:
    """A class id's label; ids past the model's labels are "class<id>" (as in every message)."""
    return labels[class_id] if 0 <= class_id < len(labels) else f"class{class_id}"


@dataclass
class Detections:
    boxes: np.ndarray  # (n, 4) float32, x1 y1 x2 y2 in source pixels
    scores: np.ndarray  # (n,) float32, descending
    class_ids: np.ndarray  # (n,) int32
    width: int
    height: int
    #: which of them pass the model's own thresholds (`conf`, `class_conf`), when post-processing
    #: was asked to keep candidates below them (for a tracker: `Postprocessor(floor=...)`); None:
    #: every one does
    confident: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @classmethod
    def empty(cls, width: int, height: int) -> "Detections":
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32),
                   width, height)

    def take(self, keep: np.ndarray) -> "Detections":
        """The detections where `keep` (a mask or indices), in their order."""
        confident = self.confident[keep] if self.confident is not None else None
        return Detections(self.boxes[keep], self.scores[keep], self.class_ids[keep], self.width, self.height,
                          confident)

    def to_dicts(self, labels: Sequence[str], decimals: int = 2) -> list[dict]:
        """JSON-ready detections: label, class_id, score, box [x1, y1, x2, y2] (source pixels)."""
        out = []
        for box, score, cid in zip(self.boxes.tolist(), self.scores.tolist(), self.class_ids.tolist()):
            out.append({
                "label": label_of(labels, cid),
                "class_id": int(cid),
                "score": round(float(score), 6),
                "box": [round(float(v), decimals) for v in box],
            })
        return out
