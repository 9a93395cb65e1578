"""Matching our detections against a peer's reference detections (the parity rule of issue 2).

Rule: every reference detection with score >= 0.30 has one of ours with the same class,
IoU >= 0.90 and |score difference| <= 0.02; and none of ours with score >= 0.30 is left without a
reference partner under the same rule (partners below 0.30 count, so a detection that sits right at
the threshold on one side and just under it on the other is not an error).
"""

from __future__ import annotations

import numpy as np

MIN_SCORE = 0.30
MIN_IOU = 0.90
MAX_SCORE_DIFF = 0.02


def iou(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _pairs_ok(x, y) -> bool:
    return (x["class_id"] == y["class_id"] and abs(x["score"] - y["score"]) <= MAX_SCORE_DIFF
            and iou(x["box"], y["box"]) >= MIN_IOU)


def mismatches(ours: list[dict], reference: list[dict]) -> list[str]:
    """Human-readable list of parity violations; empty when the two agree."""
    problems = []
    used: set[int] = set()
    for ref in sorted(reference, key=lambda d: -d["score"]):
        if ref["score"] < MIN_SCORE:
            continue
        candidates = [i for i, o in enumerate(ours) if i not in used and _pairs_ok(o, ref)]
        if not candidates:
            problems.append(f"reference {ref} has no match among ours")
            continue
        best = max(candidates, key=lambda i: iou(ours[i]["box"], ref["box"]))
        used.add(best)
    for i, o in enumerate(ours):
        if i in used or o["score"] < MIN_SCORE:
            continue
        if not any(_pairs_ok(o, r) for r in reference):
            problems.append(f"ours {o} has no reference partner")
    return problems


def box_array(dets) -> np.ndarray:
    return np.array([d["box"] for d in dets], np.float32).reshape(-1, 4)
