"""How well one set of boxes agrees with another: precision, recall and mAP@0.5.

The INT8 model's boxes are scored against the float model's, taken as the truth. The definition
is PASCAL VOC's (2010 and later), not COCO's:

* per class, the predictions of every frame sorted by score (highest first, ties in input order);
* each goes to the truth box of its class in its frame with the highest IoU; IoU >= `iou` with a
  box not taken yet is a true positive, anything else (below the threshold, or that box already
  taken by a higher score) a false positive;
* AP is the area under the precision/recall curve with all-point interpolation (precision made
  non-increasing from the right, summed over every recall step), not COCO's 101 recall points;
* mAP is the mean AP over the classes that have truth boxes; a class with truth and no
  prediction scores 0; predictions of a class with no truth lower `precision` but not mAP.

`precision` and `recall` are those of the same matching over all classes, counting only the
predictions scored at least `conf` (the threshold the daemon publishes at): greedy matching goes
down the scores, so those matches are the ones a matching of them alone would make. The AP uses
every prediction given, so pass them at a low threshold (as mAP is always computed) and the truth
at the operating one. With no truth box at all, recall is 1.0 (nothing to miss) and mAP is 1.0
when there is no prediction either (the models agree that there is nothing), 0.0 otherwise;
precision is 1.0 when there is no prediction.

Boxes are x1 y1 x2 y2 in continuous pixels (area = (x2-x1)*(y2-y1), no VOC "+1").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Boxes:
    """One frame's boxes: (n, 4) x1 y1 x2 y2, (n,) scores, (n,) class ids."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray

    @classmethod
    def of(cls, boxes, scores, class_ids) -> "Boxes":
        return cls(np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64).reshape(-1),
                   np.asarray(class_ids, np.int64).reshape(-1))


@dataclass(frozen=True)
class Agreement:
    precision: float
    recall: float
    map50: float
    true_positives: int
    predictions: int
    truths: int
    ap_per_class: dict[int, float]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of a (n, 4) with every box of b (m, 4)."""
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def all_point_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the precision/recall curve, all-point interpolation (VOC 2010+)."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.nonzero(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _match_class(preds: list[tuple[float, int, np.ndarray]], truth: dict[int, np.ndarray],
                 iou: float) -> tuple[np.ndarray, np.ndarray]:
    """True/false positive flags of one class's predictions and their scores, in descending
    score order."""
    order = sorted(range(len(preds)), key=lambda i: -preds[i][0])  # stable: ties keep input order
    taken = {frame: np.zeros(len(boxes), bool) for frame, boxes in truth.items()}
    hits = np.zeros(len(preds), bool)
    for rank, i in enumerate(order):
        _, frame, box = preds[i]
        boxes = truth.get(frame)
        if boxes is None or not len(boxes):
            continue
        overlaps = iou_matrix(box[None, :], boxes)[0]
        best = int(np.argmax(overlaps))
        if overlaps[best] >= iou and not taken[frame][best]:
            taken[frame][best] = True
            hits[rank] = True
    return hits, np.array([preds[i][0] for i in order], np.float64)


def agreement(predicted: Sequence[Boxes], truth: Sequence[Boxes], iou: float = 0.5,
              conf: float = 0.0) -> Agreement:
    """Precision and recall (predictions scored >= `conf`) and mAP@`iou` (all of them) of
    `predicted` against `truth`, frame by frame."""
    if len(predicted) != len(truth):
        raise ValueError(f"{len(predicted)} predicted frames against {len(truth)} truth frames")
    classes = sorted({int(c) for t in (*truth, *predicted) for c in t.class_ids})
    aps: dict[int, float] = {}
    tp = npred = ntruth = 0
    for cid in classes:
        gt = {f: t.boxes[t.class_ids == cid] for f, t in enumerate(truth)}
        preds = [(float(s), f, b) for f, p in enumerate(predicted)
                 for b, s in zip(p.boxes[p.class_ids == cid], p.scores[p.class_ids == cid])]
        positives = sum(len(b) for b in gt.values())
        hits, scores = _match_class(preds, gt, iou)
        confident = scores >= conf
        tp += int(hits[confident].sum())
        npred += int(confident.sum())
        ntruth += positives
        if positives:
            cum = np.cumsum(hits)
            ranks = np.arange(1, len(hits) + 1)
            aps[cid] = all_point_ap(cum / positives, cum / ranks) if len(hits) else 0.0
    if ntruth:
        recall = tp / ntruth
        map50 = float(np.mean(list(aps.values())))
    else:
        recall = 1.0
        map50 = 1.0 if npred == 0 else 0.0
    precision = tp / npred if npred else 1.0
    return Agreement(precision, recall, map50, tp, npred, ntruth, aps)
