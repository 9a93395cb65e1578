"""Multi-object tracking scores, written independently of yoloedge: IDF1 and identity switches.

    evaluate(truth_frames, predicted_frames, iou=0.5) -> Scores

A frame is a list of objects; truth objects are (gt_id, box, difficult), predictions (track_id, box),
boxes x1 y1 x2 y2. Frame lists are aligned by position.

* Difficult truth objects (mostly outside the frame or hidden) count neither way: they are not
  positives, and a prediction whose best-overlapping truth box is a difficult one (IoU >= `iou`)
  is dropped from that frame instead of being a false positive.
* An id on two boxes of one frame (the daemon publishes every detection with its track's id)
  pairs with a truth object at most once in that frame: the other box is a false positive.
* IDF1 (Ristani et al., "Performance Measures and a Data Set for Multi-Target, Multi-Camera
  Tracking", 2016): truth and predicted trajectories are paired one to one so that the number of
  frames in which a pair overlaps at IoU >= `iou` (IDTP) is largest; IDF1 = 2 IDTP / (truth boxes
  + predicted boxes).
* Identity switches (CLEAR MOT, Bernardin & Stiefelhagen 2008): frame by frame, a truth object
  keeps last frame's prediction if they still overlap at IoU >= `iou`; the others are assigned by
  minimum total 1 - IoU among pairs at IoU >= `iou`. A switch is a truth object matched to a
  different prediction id than the one it was last matched to.

The optimal pairings use SciPy's linear_sum_assignment (a reference implementation, not ours);
IoU is map_eval's, the mAP evaluator's (also written apart from yoloedge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from map_eval import iou_matrix as iou

Box = Sequence[float]
TruthFrame = Sequence[tuple[Hashable, Box, bool]]
PredictedFrame = Sequence[tuple[Hashable, Box]]


@dataclass(frozen=True)
class Scores:
    idf1: float
    idtp: int
    truth_boxes: int
    predicted_boxes: int
    id_switches: int
    matches: int        # per-frame matches (CLEAR MOT)
    false_negatives: int
    false_positives: int


def _assign(cost: np.ndarray) -> list[tuple[int, int]]:
    from scipy.optimize import linear_sum_assignment

    if cost.size == 0:
        return []
    rows, cols = linear_sum_assignment(cost)
    return list(zip(rows.tolist(), cols.tolist()))


def _cleaned(truth: TruthFrame, predicted: PredictedFrame, threshold: float):
    """The frame's positives and its predictions, less those that sit on a difficult object."""
    positives = [(g, box) for g, box, difficult in truth if not difficult]
    if not predicted or not truth:
        return positives, list(predicted)
    overlap = iou([p[1] for p in predicted], [t[1] for t in truth])
    kept = []
    for row, prediction in enumerate(predicted):
        best = int(np.argmax(overlap[row]))
        if not (truth[best][2] and overlap[row, best] >= threshold):
            kept.append(prediction)
    return positives, kept


def evaluate(truth_frames: Sequence[TruthFrame], predicted_frames: Sequence[PredictedFrame],
             threshold: float = 0.5) -> Scores:
    if len(truth_frames) != len(predicted_frames):
        raise ValueError(f"{len(truth_frames)} truth frames, {len(predicted_frames)} predicted")
    pair_frames: dict[tuple[Hashable, Hashable], int] = {}
    truth_boxes = predicted_boxes = 0
    switches = matches = 0
    last: dict[Hashable, Hashable] = {}   # truth id -> prediction id it was last matched to
    current: dict[Hashable, Hashable] = {}
    for truth, predicted in zip(truth_frames, predicted_frames):
        positives, kept = _cleaned(truth, predicted, threshold)
        truth_boxes += len(positives)
        predicted_boxes += len(kept)
        if not positives or not kept:
            current = {}
            continue
        overlap = iou([b for _, b in positives], [b for _, b in kept])
        # a pair counts once a frame, even where one id is on two boxes (the second is a false positive)
        for key in {(positives[r][0], kept[c][0]) for r, c in zip(*np.nonzero(overlap >= threshold))}:
            pair_frames[key] = pair_frames.get(key, 0) + 1
        frame_match = _clear_mot_matches(positives, kept, overlap, current, threshold)
        for gt, pid in frame_match.items():
            if gt in last and last[gt] != pid:
                switches += 1
            last[gt] = pid
        matches += len(frame_match)
        current = frame_match
    idtp = _best_pairing(pair_frames)
    total = truth_boxes + predicted_boxes
    return Scores(idf1=2 * idtp / total if total else 1.0, idtp=idtp, truth_boxes=truth_boxes,
                  predicted_boxes=predicted_boxes, id_switches=switches, matches=matches,
                  false_negatives=truth_boxes - matches, false_positives=predicted_boxes - matches)


def _clear_mot_matches(positives, kept, overlap: np.ndarray, previous: dict, threshold: float) -> dict:
    """truth id -> prediction id in this frame: last frame's pairs that still overlap, then the rest."""
    result = {}
    used_rows, used_cols = set(), set()
    column_of = {pid: c for c, (pid, _) in enumerate(kept)}
    for r, (gt, _) in enumerate(positives):
        c = column_of.get(previous.get(gt))
        if c is not None and c not in used_cols and overlap[r, c] >= threshold:
            result[gt] = kept[c][0]
            used_rows.add(r)
            used_cols.add(c)
    rows = [r for r in range(len(positives)) if r not in used_rows]
    cols = [c for c in range(len(kept)) if c not in used_cols]
    if rows and cols:
        sub = overlap[np.ix_(rows, cols)]
        cost = np.where(sub >= threshold, 1.0 - sub, 1e6)
        for i, j in _assign(cost):
            if sub[i, j] >= threshold:
                result[positives[rows[i]][0]] = kept[cols[j]][0]
    return result


def _best_pairing(pair_frames: dict[tuple[Hashable, Hashable], int]) -> int:
    """The largest total of shared frames over one-to-one pairings of truth and predicted ids."""
    if not pair_frames:
        return 0
    truth_ids = sorted({g for g, _ in pair_frames}, key=repr)
    predicted_ids = sorted({p for _, p in pair_frames}, key=repr)
    gain = np.zeros((len(truth_ids), len(predicted_ids)))
    for (g, p), n in pair_frames.items():
        gain[truth_ids.index(g), predicted_ids.index(p)] = n
    return int(sum(gain[r, c] for r, c in _assign(-gain)))
