"""Candidates -> final detections: class filters, NMS, max_det, back to source pixels."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..preprocess.letterbox import Geometry
from .decode import Decoder
from .detections import Detections
from .nms import batched_nms

#: Upper bound on boxes handed to NMS (Ultralytics' and YOLOv5's `max_nms`): keeps a very low
#: threshold from turning NMS quadratic on tens of thousands of boxes.
MAX_NMS = 30000


@dataclass(frozen=True)
class PostprocessSettings:
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    agnostic_nms: bool = False
    classes: frozenset[int] | None = None  # keep only these class ids
    class_conf: Mapping[int, float] = field(default_factory=dict)  # per-class minimum score
    clip: bool = True


class Postprocessor:
    def __init__(self, decoder: Decoder, settings: PostprocessSettings):
        self.decoder = decoder
        self.settings = settings
        self._needs_nms = decoder.layout.needs_nms
        per_class = settings.class_conf
        self._min_conf = min([settings.conf, *per_class.values()]) if per_class else settings.conf
        self._class_thresholds = None
        if per_class:
            nc = max(decoder.layout.num_classes, max(per_class) + 1, 1)
            t = np.full(nc, settings.conf, np.float32)
            for cid, value in per_class.items():
                t[cid] = value
            self._class_thresholds = t

    def __call__(self, outputs: Sequence[np.ndarray], geometry: Geometry, floor: float | None = None) -> Detections:
        """The frame's detections. With `floor` under the model's thresholds (a tracker's low
        score), candidates down to it are kept too, in the same decode and NMS, and
        `Detections.confident` tells which pass the thresholds: those are exactly the detections
        a call without `floor` gives (NMS keeps a box only for a stronger one, so weaker
        candidates change nothing above them)."""
        s = self.settings
        threshold = floor if floor is not None and floor < self._min_conf else self._min_conf
        low = threshold < self._min_conf
        boxes, scores, class_ids = self.decoder(outputs, threshold)
        keep = self._filter_mask(scores, class_ids, thresholds=not low)
        if keep is not None:
            boxes, scores, class_ids = boxes[keep], scores[keep], class_ids[keep]
        if len(scores) > MAX_NMS:
            top = np.argsort(-scores, kind="stable")[:MAX_NMS]
            boxes, scores, class_ids = boxes[top], scores[top], class_ids[top]
        if self._needs_nms:
            order = batched_nms(boxes, scores, class_ids, s.iou, s.agnostic_nms)
        else:
            order = np.argsort(-scores, kind="stable")
        order = order[:s.max_det]
        boxes = geometry.boxes_to_source(boxes[order].astype(np.float32), clip=s.clip)
        scores, class_ids = scores[order], class_ids[order]
        confident = self._confident(scores, class_ids) if low else None
        return Detections(boxes, scores, class_ids, geometry.src_w, geometry.src_h, confident)

    def _confident(self, scores: np.ndarray, class_ids: np.ndarray) -> np.ndarray:
        """Above the model's thresholds, compared as the decoders do (score > conf)."""
        t = self._class_thresholds
        if t is None:
            return scores > self.settings.conf
        return scores > t[np.clip(class_ids, 0, len(t) - 1)]

    def _filter_mask(self, scores: np.ndarray, class_ids: np.ndarray, thresholds: bool = True) -> np.ndarray | None:
        s = self.settings
        mask = None
        if s.classes is not None:
            mask = np.isin(class_ids, list(s.classes))
        if thresholds and self._class_thresholds is not None:
            above = self._confident(scores, class_ids)
            mask = above if mask is None else mask & above
        return mask
