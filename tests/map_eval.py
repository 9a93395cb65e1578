"""Mean average precision, PASCAL VOC style, written independently of yoloedge and of Ultralytics.

    average_precision(predictions_by_frame, truth_by_frame, iou=0.5) -> (map, per_class)

The standard VOC 2010+ computation:
  * per class, every prediction of the class over all frames, sorted by score (highest first;
    ties keep their input order);
  * greedy matching: each prediction goes to the unmatched-or-matched ground-truth box of its class
    in its frame with the highest IoU; IoU >= `iou` with a box not matched yet is a true positive,
    otherwise (below the threshold, or that box already taken by a higher-scored prediction) a
    false positive;
  * a prediction whose best box is marked "difficult" counts neither way, and difficult boxes are
    not counted among the positives (VOC's rule for its own "difficult" objects);
  * AP = area under the precision/recall curve with all-point interpolation (precision made
    monotonically decreasing from the right, summed over every recall step);
  * mAP = mean of the per-class APs over the classes that have at least one non-difficult
    ground-truth box (a class that has boxes but no prediction scores 0).

Boxes are [x1, y1, x2, y2] in continuous pixel coordinates (area = (x2-x1)*(y2-y1), no VOC "+1").

Frames are given as sequences (index = position) or mappings (frame id -> objects); a frame missing
on one side has no objects there. An object is a mapping with "class_id" (or "label", resolved
with `names`), "box", "score" (predictions) and optionally "difficult" (truth), or a tuple that
starts with the class id followed, in any order, by the box (4 numbers), the score (predictions)
and optionally a bool "difficult" (truth): (0, 0.9, [x1, y1, x2, y2]), (0, [x1, y1, x2, y2], True).
Pass the ground truth's "difficult" flags (or its objects as they are): without them, shapes that
are mostly outside the frame or hidden count as positives no detector is expected to find.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

Objects = Iterable[Any]
Frames = Sequence[Objects] | Mapping[Any, Objects]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a (n, 4) with every box in b (m, 4), x1 y1 x2 y2."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def voc_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the PR curve, all-point interpolation (VOC 2010 and later)."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    steps = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _frames(frames: Frames) -> dict:
    if isinstance(frames, Mapping):
        return dict(frames)
    return dict(enumerate(frames))


def _parse(obj: Any, names: Sequence[str] | None, prediction: bool):
    """-> (class_id, box, score, difficult)"""
    if isinstance(obj, Mapping):
        if "class_id" in obj:
            cid = int(obj["class_id"])
        elif names is not None and "label" in obj:
            cid = list(names).index(obj["label"])
        else:
            raise ValueError(f"object without class_id (or label and names): {obj!r}")
        box = [float(v) for v in obj["box"]]
        score = float(obj["score"]) if prediction else 1.0
        difficult = bool(obj.get("difficult", False))
    else:  # (class_id, ...) with, in any order, the box (4 numbers), a score, a difficult flag
        cid, rest = int(obj[0]), list(obj[1:])
        boxes = [v for v in rest if isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, str)]
        flags = [v for v in rest if isinstance(v, (bool, np.bool_))]
        scores = [v for v in rest if not isinstance(v, (bool, np.bool_)) and np.isscalar(v)]
        if len(boxes) != 1 or len(scores) > 1 or len(flags) > 1:
            raise ValueError(f"cannot read {obj!r} as (class_id, box[, score][, difficult])")
        box = [float(v) for v in boxes[0]]
        if prediction and not scores:
            raise ValueError(f"prediction without a score: {obj!r}")
        score = float(scores[0]) if prediction else 1.0
        difficult = bool(flags[0]) if flags and not prediction else False
    if len(box) != 4:
        raise ValueError(f"a box needs 4 numbers: {box!r}")
    return cid, box, score, difficult


def average_precision(predictions_by_frame: Frames, truth_by_frame: Frames, iou: float = 0.5,
                      names: Sequence[str] | None = None) -> tuple[float, dict[int, float]]:
    """(mAP, {class_id: AP}) of the predictions against the ground truth; see the module doc."""
    preds = _frames(predictions_by_frame)
    truth = _frames(truth_by_frame)
    # ground truth per (frame, class): boxes and difficult flags
    gt: dict[tuple[Any, int], tuple[np.ndarray, np.ndarray]] = {}
    npos: dict[int, int] = {}
    for frame, objects in truth.items():
        per_class: dict[int, list] = {}
        for obj in objects:
            cid, box, _, difficult = _parse(obj, names, prediction=False)
            per_class.setdefault(cid, []).append((box, difficult))
        for cid, items in per_class.items():
            boxes = np.array([b for b, _ in items], np.float64)
            hard = np.array([d for _, d in items], bool)
            gt[(frame, cid)] = (boxes, hard)
            npos[cid] = npos.get(cid, 0) + int((~hard).sum())
    # predictions per class, in input order (a stable sort keeps it among equal scores)
    dets: dict[int, list[tuple[float, Any, list[float]]]] = {}
    for frame, objects in preds.items():
        for obj in objects:
            cid, box, score, _ = _parse(obj, names, prediction=True)
            dets.setdefault(cid, []).append((score, frame, box))

    per_class_ap: dict[int, float] = {}
    for cid in sorted(c for c, n in npos.items() if n > 0):
        items = dets.get(cid, [])
        order = sorted(range(len(items)), key=lambda i: -items[i][0])
        taken = {key: np.zeros(len(v[0]), bool) for key, v in gt.items() if key[1] == cid}
        tp, fp = [], []
        for i in order:
            _, frame, box = items[i]
            key = (frame, cid)
            if key not in gt:
                tp.append(0), fp.append(1)
                continue
            boxes, hard = gt[key]
            overlaps = iou_matrix(np.array([box]), boxes)[0]
            j = int(np.argmax(overlaps))
            if overlaps[j] >= iou:
                if hard[j]:
                    continue  # a difficult object: neither a hit nor a miss
                if not taken[key][j]:
                    taken[key][j] = True
                    tp.append(1), fp.append(0)
                else:
                    tp.append(0), fp.append(1)
            else:
                tp.append(0), fp.append(1)
        if not tp:
            per_class_ap[cid] = 0.0
            continue
        ctp, cfp = np.cumsum(tp), np.cumsum(fp)
        recall = ctp / npos[cid]
        precision = ctp / np.maximum(ctp + cfp, np.finfo(np.float64).eps)
        per_class_ap[cid] = voc_ap(recall, precision)
    mean = float(np.mean(list(per_class_ap.values()))) if per_class_ap else 0.0
    return mean, per_class_ap
