"""Greedy NMS: ordering, ties, edge cases, class handling, and agreement with independent references."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from yoloedge.postprocess import batched_nms, nms
from yoloedge.postprocess.nms import nms_numpy

# `nms` hands all-positive scores to cv2.dnn.NMSBoxes and the rest to `nms_numpy`; the rule must
# be the same either way, so the behavioural tests run against both.
IMPLS = pytest.mark.parametrize("impl", [nms, nms_numpy], ids=["nms", "nms_numpy"])


def arr(rows) -> np.ndarray:
    return np.asarray(rows, np.float32).reshape(-1, 4)


def sc(values) -> np.ndarray:
    return np.asarray(values, np.float32)


def iou_pair(a, b) -> float:
    """IoU of two xyxy boxes in float64, zero when the union is empty."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def brute_force_nms(boxes, scores, thr, class_ids=None):
    """Textbook greedy NMS: visit boxes by descending score (ties: lower index first), keep a box
    unless a kept box of the same class (any class when class_ids is None) overlaps it by > thr."""
    rows = [tuple(float(v) for v in b) for b in boxes]
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    kept = []
    for i in order:
        ok = True
        for k in kept:
            if class_ids is not None and class_ids[k] != class_ids[i]:
                continue
            if iou_pair(rows[i], rows[k]) > thr:
                ok = False
                break
        if ok:
            kept.append(i)
    return kept


def test_empty():
    keep = nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), 0.5)
    assert keep.shape == (0,) and np.issubdtype(keep.dtype, np.integer)
    keep = batched_nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), 0.5)
    assert keep.shape == (0,)


@IMPLS
def test_one_box(impl):
    assert impl(arr([1, 2, 3, 4]), sc([0.3]), 0.5).tolist() == [0]


@IMPLS
def test_identical_boxes_keep_the_first(impl):
    boxes = arr([[0, 0, 10, 10], [0, 0, 10, 10]])
    assert impl(boxes, sc([0.7, 0.7]), 0.5).tolist() == [0]
    # with different scores the higher one wins wherever it is
    assert impl(boxes, sc([0.4, 0.7]), 0.5).tolist() == [1]


@IMPLS
def test_tied_scores_are_stable(impl):
    # Four disjoint boxes with the same score: all kept, in input order.
    boxes = arr([[0, 0, 1, 1], [10, 10, 11, 11], [20, 20, 21, 21], [30, 30, 31, 31]])
    assert impl(boxes, sc([0.5] * 4), 0.5).tolist() == [0, 1, 2, 3]
    # Ties with an overlap: box 1 equals box 2, same score -> 1 (lower index) kept, 2 dropped.
    boxes = arr([[50, 50, 60, 60], [0, 0, 10, 10], [0, 0, 10, 10], [100, 0, 110, 10]])
    assert impl(boxes, sc([0.5] * 4), 0.5).tolist() == [0, 1, 3]
    # Reversing the duplicates' order must keep the new first one, i.e. index 1 again by position.
    assert impl(boxes[[0, 2, 1, 3]], sc([0.5] * 4), 0.5).tolist() == [0, 1, 3]


@IMPLS
def test_mixed_ties_order(impl):
    # scores 0.9, 0.5, 0.9, 0.5 disjoint -> 0, 2 (tie, index order), then 1, 3.
    boxes = arr([[0, 0, 1, 1], [10, 10, 11, 11], [20, 20, 21, 21], [30, 30, 31, 31]])
    assert impl(boxes, sc([0.5, 0.9, 0.5, 0.9]), 0.5).tolist() == [1, 3, 0, 2]


@IMPLS
def test_scores_above_one(impl):
    boxes = arr([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]])
    assert impl(boxes, sc([2.0, 3.5, 0.5]), 0.5).tolist() == [1, 0, 2]
    # overlapping: 3.5 suppresses 2.0
    boxes = arr([[0, 0, 10, 10], [1, 0, 11, 10]])
    assert impl(boxes, sc([2.0, 3.5]), 0.5).tolist() == [1]
    # negative scores (raw logits) are ordered too
    boxes = arr([[0, 0, 1, 1], [10, 0, 11, 1], [20, 0, 21, 1]])
    assert impl(boxes, sc([-3.0, 1.5, -0.5]), 0.5).tolist() == [1, 2, 0]


@IMPLS
def test_zero_area_boxes_do_not_crash(impl):
    boxes = arr([[5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 10, 10], [3, 3, 3, 9]])
    with np.errstate(all="raise"):  # no division warnings either
        keep = impl(boxes, sc([0.9, 0.8, 0.7, 0.6]), 0.5)
    # two empty boxes have no overlap to speak of, an empty box has IoU 0 with anything.
    assert keep.tolist() == [0, 1, 2, 3]


@IMPLS
def test_inverted_boxes_have_zero_area(impl):
    # x2 < x1: treated as empty, not as a negative area that would inflate IoU.
    boxes = arr([[0, 0, 10, 10], [10, 10, 0, 0]])
    assert impl(boxes, sc([0.9, 0.8]), 0.1).tolist() == [0, 1]


@IMPLS
def test_iou_exactly_at_threshold_is_kept(impl):
    # B inside A: inter 2, union 4 + 2 - 2 = 4 -> IoU exactly 0.5 (exact in binary).
    boxes = arr([[0, 0, 4, 1], [1, 0, 3, 1]])
    assert iou_pair(boxes[0], boxes[1]) == 0.5
    assert impl(boxes, sc([0.9, 0.8]), 0.5).tolist() == [0, 1]  # IoU <= thr survives
    assert impl(boxes, sc([0.9, 0.8]), 0.49).tolist() == [0]
    # 0.25 exactly: A 0..4, B 0..1 (inter 1, union 4)
    boxes = arr([[0, 0, 4, 1], [0, 0, 1, 1]])
    assert impl(boxes, sc([0.9, 0.8]), 0.25).tolist() == [0, 1]
    assert impl(boxes, sc([0.9, 0.8]), 0.2499).tolist() == [0]


@IMPLS
def test_suppression_is_greedy_not_transitive(impl):
    # A suppresses B, B would have suppressed C, but C survives because B is gone.
    # A 0..10, B 4..14 (IoU 6/14 = 0.43), C 9..19 (IoU with A: 1/19, with B: 5/15 = 0.33).
    boxes = arr([[0, 0, 10, 1], [4, 0, 14, 1], [9, 0, 19, 1]])
    assert impl(boxes, sc([0.9, 0.8, 0.7]), 0.3).tolist() == [0, 2]


def test_class_aware_vs_agnostic():
    # IoU(A, B) = 81 / 100 = 0.81
    boxes = arr([[0, 0, 10, 10], [1, 1, 10, 10], [100, 100, 110, 110]])
    scores = sc([0.9, 0.8, 0.7])
    classes = np.array([0, 1, 1], np.int32)
    assert batched_nms(boxes, scores, classes, 0.45).tolist() == [0, 1, 2]
    assert batched_nms(boxes, scores, classes, 0.45, agnostic=True).tolist() == [0, 2]
    # same class: suppressed even class-aware
    same = np.array([3, 3, 1], np.int32)
    assert batched_nms(boxes, scores, same, 0.45).tolist() == [0, 2]


def test_class_aware_with_high_class_ids_and_large_boxes():
    # Boxes as big as a 4K frame, classes 0 and 79: still never suppress each other.
    boxes = arr([[0, 0, 3840, 2160], [0, 0, 3840, 2160], [10, 10, 3830, 2150]])
    scores = sc([0.9, 0.8, 0.7])
    classes = np.array([79, 0, 79], np.int32)
    assert batched_nms(boxes, scores, classes, 0.5).tolist() == [0, 1]


def test_does_not_modify_inputs():
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, 20)
    scores = rng.uniform(0, 1, 20).astype(np.float32)
    classes = rng.integers(0, 3, 20).astype(np.int32)
    b0, s0, c0 = boxes.copy(), scores.copy(), classes.copy()
    batched_nms(boxes, scores, classes, 0.5)
    nms(boxes, scores, 0.5)
    nms_numpy(boxes, scores, 0.5)
    np.testing.assert_array_equal(boxes, b0)
    np.testing.assert_array_equal(scores, s0)
    np.testing.assert_array_equal(classes, c0)


def random_boxes(rng, n, size=200.0, max_wh=60.0) -> np.ndarray:
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(1, max_wh, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


@pytest.mark.parametrize("seed, thr", [(0, 0.45), (1, 0.3), (2, 0.7), (3, 0.5)])
def test_random_against_brute_force(seed, thr):
    rng = np.random.default_rng(seed)
    n = 300
    boxes = random_boxes(rng, n)
    scores = rng.uniform(0, 1, n).astype(np.float32)
    scores[rng.integers(0, n, 40)] = 0.5  # some ties
    expected = brute_force_nms(boxes, scores, thr)
    assert nms(boxes, scores, thr).tolist() == expected
    assert nms_numpy(boxes, scores, thr).tolist() == expected
    # a zero score anywhere sends `nms` down the NumPy path: same answer
    scores0 = scores.copy()
    scores0[7] = 0.0
    assert nms(boxes, scores0, thr).tolist() == brute_force_nms(boxes, scores0, thr)
    classes = rng.integers(0, 4, n).astype(np.int32)
    assert batched_nms(boxes, scores, classes, thr).tolist() == brute_force_nms(boxes, scores, thr, classes)
    assert batched_nms(boxes, scores, classes, thr, agnostic=True).tolist() == expected


@pytest.mark.parametrize("seed, thr", [(10, 0.45), (11, 0.6)])
def test_random_against_opencv(seed, thr):
    # cv2.dnn.NMSBoxes: [x, y, w, h] boxes, stable descending sort, keeps IoU <= thr: the same
    # rule, so the kept indices must match exactly (OpenCV returns them in score order too).
    rng = np.random.default_rng(seed)
    n = 200
    boxes = random_boxes(rng, n).astype(np.float64)
    scores = rng.uniform(0.01, 1, n).astype(np.float32)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    ref = cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, thr)
    ref = np.asarray(ref).reshape(-1).tolist()
    assert len(ref) > 10
    assert nms(boxes.astype(np.float32), scores, thr).tolist() == ref
