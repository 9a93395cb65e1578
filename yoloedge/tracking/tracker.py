"""ByteTrack (Zhang et al., ECCV 2022) for one camera, vectorised, class-agnostic, in frame time.

Each `update(dets, time)`:

1. Duplicates: a box overlapping a stronger box of another class by IoU >= DUPLICATE_IOU is the
   same object seen twice (class-wise NMS keeps both); it is absorbed by the stronger one: it
   votes for that one's label and starts nothing. Only the detection a track shows carries the
   track's id in det_track_ids (the one of the track's label): the duplicate's entry is None, so
   one object is one tracked box in the published detections.
2. Every track is predicted to `time` by the Kalman filter (kalman.py).
3. First association: detections scoring >= high_score against the confirmed tracks, matched or
   lost, at cost 1 - IoU x score <= match_thresh (ByteTrack's fused score).
4. Second association: detections from low_score up to high_score against the confirmed tracks
   matched in the previous frame that step 3 left over, at IoU >= 0.5. Low-score boxes (an object
   half hidden, blurred) keep a track alive but never start one.
5. Tentative tracks take the high-score detections still left, at cost <= 0.7; a tentative track
   that matches nothing is dropped at once (ByteTrack's unconfirmed tracks).
6. High-score detections still left, scoring >= high_score + 0.1, start tentative tracks. A track
   is confirmed (gets its id, appears in `started`) at its `min_hits`-th detection in a row.
7. A confirmed track not matched for `lost_s` seconds of frame time ends (`ended`).

Association ignores classes, so a car that is "truck" for a frame keeps its track; the track's
label is the class with the highest summed score over its detections (absorbed duplicates
included). Frame times drive everything (the Kalman step, lost_s), so the same frames at the same
times give the same tracks however fast they are fed, and a change of frame rate changes neither
the motion model nor the lost time.

Not thread-safe: one tracker per camera, called in frame order from one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import numpy as np

from ..config.schema import TrackingConfig
from ..postprocess import Detections
from . import kalman
from .assignment import match
from .ids import TrackIds
from .types import DUPLICATE_IOU, NEW_TRACK_MARGIN, SECOND_MATCH_IOU, TENTATIVE_MATCH_COST, Track, TrackFrame

#: float noise in frame times (a media position in ms turned into seconds) must not decide
#: whether a track has been lost for exactly lost_s.
_TIME_EPS = 1e-6


class TrackState(Enum):
    TENTATIVE = "tentative"   # fewer than min_hits detections so far
    TRACKED = "tracked"       # confirmed, matched in the latest frame
    LOST = "lost"             # confirmed, not matched in the latest frame


@dataclass(eq=False)
class _Track:
    """A track's bookkeeping; its Kalman state lives in the tracker's arrays at the same index."""

    start_time: float
    last_time: float
    top_score: float
    votes: dict[int, float] = field(default_factory=dict)
    hits: int = 1
    state: TrackState = TrackState.TENTATIVE
    id: str | None = None
    label_id: int = -1

    def vote(self, class_id: int, score: float) -> None:
        self.votes[class_id] = self.votes.get(class_id, 0.0) + score
        if self.label_id < 0 or self.votes[class_id] > self.votes[self.label_id]:
            self.label_id = class_id


#: the smallest union of two boxes an IoU divides by (px^2)
_TINY = 1e-12


def _nonzero(mask: np.ndarray) -> np.ndarray:
    """Indices where a 1-d mask is true (np.flatnonzero without its ravel: called ~10 times a frame)."""
    return mask.nonzero()[0]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a (n, 4) with every box in b (m, 4), x1 y1 x2 y2; 0 for empty unions."""
    ax1, ay1, ax2, ay2 = (a[:, k:k + 1] for k in range(4))  # (n, 1) columns against (m,) rows
    bx1, by1, bx2, by2 = b.T
    inter = np.maximum(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0)
    inter *= np.maximum(np.minimum(ay2, by2) - np.maximum(ay1, by1), 0)
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / np.maximum(union, _TINY)  # an empty union has no intersection: 0


def duplicate_owners(boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray,
                     overlap: np.ndarray | None = None) -> np.ndarray:
    """For each box, the index of the stronger box of another class it duplicates, else -1. A box
    absorbed by another absorbs nothing itself (strongest first, so chains resolve to one owner).
    `overlap`: the boxes' IoU with each other, when already computed."""
    n = len(scores)
    owners = np.full(n, -1, np.intp)
    if n < 2:
        return owners
    if overlap is None:
        overlap = iou_matrix(boxes, boxes)
    close = (overlap >= DUPLICATE_IOU) & (class_ids[:, None] != class_ids[None, :])
    if not close.any():  # the usual frame: nothing to absorb
        return owners
    order = np.argsort(-scores, kind="stable")
    rank = np.empty(n, np.intp)
    rank[order] = np.arange(n)
    close &= rank[:, None] < rank[None, :]  # close[i, j]: i is stronger and duplicates j
    for j in order[close.any(axis=0)[order]]:
        for i in order[:rank[j]]:
            if close[i, j] and owners[i] < 0:
                owners[j] = i
                break
    return owners


class Tracker:
    """One camera's ByteTrack. `labels` are the model's (for the class ids); `ids` hands out track
    ids (share one between every tracker of a process)."""

    def __init__(self, config: TrackingConfig, labels: Sequence[str], *, ids: TrackIds | None = None):
        self.config = config
        self.labels = tuple(labels)
        self._ids = ids if ids is not None else TrackIds()
        self._tracks: list[_Track] = []
        self._mean = np.zeros((0, 8))
        self._cov = np.zeros((0, 3, 4))
        self._time: float | None = None
        self._size = (0, 0)
        self._first_frame = True  # the first update after start or end_all

    @property
    def LOW_SCORE(self) -> float:  # noqa: N802 -- the seam's name
        """The lowest score update() uses: post-processing must keep candidates down to it."""
        return self.config.low_score

    def reconfigure(self, config: TrackingConfig) -> None:
        """New thresholds from a reload; every track is kept."""
        self.config = config

    # -- one frame -----------------------------------------------------------------------------

    def update(self, dets: Detections, time: float) -> TrackFrame:
        cfg = self.config
        self._size = (dets.width, dets.height)
        self._predict(time)
        n_det = len(dets)
        boxes = np.asarray(dets.boxes, np.float64).reshape(-1, 4)
        scores = np.asarray(dets.scores, np.float64).reshape(-1)
        class_ids = np.asarray(dets.class_ids).reshape(-1)
        usable = scores >= cfg.low_score
        owners = np.full(n_det, -1, np.intp)
        used = _nonzero(usable)
        # one IoU call for both: every predicted track and every detection x every detection
        n_tracks = len(self._tracks)
        both = iou_matrix(np.concatenate((kalman.xyah_to_xyxy(self._mean), boxes)), boxes)
        overlap = both[:n_tracks]
        if len(used) > 1:
            sub = duplicate_owners(boxes[used], scores[used], class_ids[used], both[n_tracks:][used][:, used])
            owners[used] = np.where(sub >= 0, used[sub], -1)
        primary = usable & (owners < 0)
        high = _nonzero(primary & (scores >= cfg.high_score))
        low = _nonzero(primary & (scores < cfg.high_score))

        det_of_track = np.full(n_tracks, -1, np.intp)
        states = [t.state for t in self._tracks]
        confirmed = np.array([s is not TrackState.TENTATIVE for s in states], bool)
        was_tracked = np.array([s is TrackState.TRACKED for s in states], bool)

        # 3. high-score detections, confirmed tracks (tracked and lost)
        pool = _nonzero(confirmed)
        high = self._associate(pool, high, overlap, scores, cfg.match_thresh, True, det_of_track)
        # 4. low-score detections, confirmed tracks matched last frame and not in step 3
        pool = _nonzero(was_tracked & (det_of_track < 0))
        self._associate(pool, low, overlap, scores, 1.0 - SECOND_MATCH_IOU, False, det_of_track)
        # 5. the high-score detections left, tentative tracks
        pool = _nonzero(~confirmed)
        high = self._associate(pool, high, overlap, scores, TENTATIVE_MATCH_COST, True, det_of_track)
        new = high[scores[high] >= cfg.high_score + NEW_TRACK_MARGIN]
        return self._finish(time, boxes, scores, class_ids, owners, det_of_track, new)

    def _predict(self, time: float) -> None:
        if self._time is not None and self._tracks:
            lost = np.array([t.state is TrackState.LOST for t in self._tracks], bool)
            self._mean[lost, 7] = 0.0  # upstream: a lost box keeps moving but stops growing/shrinking
            kalman.predict(self._mean, self._cov, time - self._time)
        self._time = time if self._time is None else max(self._time, time)

    @staticmethod
    def _associate(pool: np.ndarray, candidates: np.ndarray, overlap: np.ndarray, scores: np.ndarray,
                   thresh: float, fuse: bool, det_of_track: np.ndarray) -> np.ndarray:
        """Match tracks `pool` to detections `candidates` (writing det_of_track); returns the
        candidates left unmatched. `overlap`: IoU of every predicted track with every detection."""
        if len(pool) == 0 or len(candidates) == 0:
            return candidates
        similarity = overlap[pool][:, candidates]
        if fuse:
            similarity *= scores[candidates][None, :]
        rows, cols = match(1.0 - similarity, thresh)
        det_of_track[pool[rows]] = candidates[cols]
        left = np.ones(len(candidates), bool)
        left[cols] = False
        return candidates[left]

    def _finish(self, time: float, boxes: np.ndarray, scores: np.ndarray,
                class_ids: np.ndarray, owners: np.ndarray, det_of_track: np.ndarray,
                new: np.ndarray) -> TrackFrame:
        """Apply the matches, start and end tracks, and describe the frame."""
        matched = _nonzero(det_of_track >= 0)
        if len(matched):
            self._mean[matched], self._cov[matched] = kalman.update(
                self._mean[matched], self._cov[matched], boxes[det_of_track[matched]])
        absorbed = _absorbed_by(owners)
        started: set[str] = set()
        keep = np.ones(len(self._tracks), bool)
        score_list, class_list = scores.tolist(), class_ids.tolist()
        for index, (track, det) in enumerate(zip(self._tracks, det_of_track.tolist())):
            if det < 0:
                keep[index] = self._unmatched(track, time)
            else:
                self._matched(track, det, time, score_list, class_list, absorbed)
                if self._confirm(track):
                    started.add(track.id or "")
        ended = self._views([i for i in _nonzero(~keep).tolist() if self._tracks[i].id is not None],
                            det_of_track, boxes, scores)
        self._drop(keep)
        det_of_track = det_of_track[keep]
        first = self._first_frame
        self._first_frame = False
        for det in new.tolist():
            track = self._start(det, time, boxes, scores, class_ids, absorbed)
            if self._confirm(track, first):
                started.add(track.id or "")
        det_of_track = np.concatenate((det_of_track, new))
        alive = [i for i, t in enumerate(self._tracks) if t.id is not None]
        tracks = self._views(alive, self._shown(det_of_track, scores, class_ids, absorbed), boxes, scores)
        ids: list[str | None] = [None] * len(scores)
        for track_view in tracks:  # one detection per track: the one it shows (a duplicate stays None)
            if track_view.detection >= 0:
                ids[track_view.detection] = track_view.id
        width, height = self._size
        return TrackFrame(time, width, height, tuple(tracks), tuple(t for t in tracks if t.id in started),
                          tuple(ended), tuple(ids))

    def _shown(self, det_of_track: np.ndarray, scores: np.ndarray, class_ids: np.ndarray,
               absorbed: dict[int, list[int]]) -> np.ndarray:
        """The detection each track shows: the one it was matched with, unless that one's class is
        not the track's label and a duplicate it absorbed has it (the "car" detection of a car
        track seen as a truck too; the strongest such duplicate)."""
        if not absorbed:
            return det_of_track
        shown = det_of_track.copy()
        for index, det in enumerate(det_of_track.tolist()):
            label = self._tracks[index].label_id
            if det in absorbed and class_ids[det] != label:
                same = [d for d in absorbed[det] if class_ids[d] == label]
                if same:
                    shown[index] = max(same, key=lambda d: scores[d])
        return shown

    def _confirm(self, track: _Track, first_frame: bool = False) -> bool:
        """Confirm a tentative track at its min_hits-th detection, or at once in the tracker's first
        frame (upstream's rule: what is in view when a camera starts is not new); whether it
        happened now."""
        if track.state is not TrackState.TENTATIVE or (track.hits < self.config.min_hits and not first_frame):
            return False
        track.state, track.id = TrackState.TRACKED, self._ids.next()
        return True

    @staticmethod
    def _matched(track: _Track, det: int, time: float, scores: list[float], class_ids: list[int],
                 absorbed: dict[int, list[int]]) -> None:
        track.hits += 1
        track.last_time = time
        track.top_score = max(track.top_score, scores[det])
        if track.state is TrackState.LOST:
            track.state = TrackState.TRACKED
        track.vote(class_ids[det], scores[det])
        for d in absorbed.get(det, ()):
            track.vote(class_ids[d], scores[d])

    def _unmatched(self, track: _Track, time: float) -> bool:
        """Whether the track lives on after a frame without a match."""
        if track.state is TrackState.TENTATIVE:
            return False
        track.state = TrackState.LOST
        return time - track.last_time < self.config.lost_s - _TIME_EPS

    def _start(self, det: int, time: float, boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray,
               absorbed: dict[int, list[int]]) -> _Track:
        track = _Track(start_time=time, last_time=time, top_score=float(scores[det]))
        for d in (det, *absorbed.get(det, ())):
            track.vote(int(class_ids[d]), float(scores[d]))
        mean, cov = kalman.initiate(boxes[det:det + 1])
        self._mean = np.concatenate((self._mean, mean))
        self._cov = np.concatenate((self._cov, cov))
        self._tracks.append(track)
        return track

    def _drop(self, keep: np.ndarray) -> None:
        if keep.all():
            return
        self._tracks = [t for t, k in zip(self._tracks, keep) if k]
        self._mean = self._mean[keep]
        self._cov = self._cov[keep]

    # -- results -------------------------------------------------------------------------------

    def _views(self, indices: list[int], det_of_track: np.ndarray, boxes: np.ndarray,
               scores: np.ndarray) -> list[Track]:
        """The frozen views of confirmed tracks at `indices`: the matched detection's box and score,
        or the prediction and 0.0."""
        if not indices:
            return []
        dets = det_of_track[indices]
        hit = dets >= 0
        shown = boxes[np.maximum(dets, 0)] if len(boxes) else np.zeros((len(dets), 4))
        if not hit.all():
            shown[~hit] = kalman.xyah_to_xyxy(self._mean[np.asarray(indices)[~hit]])
        score = np.where(hit, scores[np.maximum(dets, 0)] if len(scores) else 0.0, 0.0)
        tracks = self._tracks
        return [Track(t.id or "", t.label_id, tuple(box), value, t.top_score, t.start_time, t.last_time, det >= 0, det)
                for t, box, value, det in zip((tracks[i] for i in indices), shown.tolist(), score.tolist(),
                                              dets.tolist())]

    def end_all(self, time: float) -> TrackFrame:
        """End every confirmed track (camera stopped, removed, shutdown); tentative ones vanish."""
        alive = [i for i, t in enumerate(self._tracks) if t.id is not None]
        ended = tuple(self._views(alive, np.full(len(self._tracks), -1, np.intp), np.zeros((0, 4)), np.zeros(0)))
        self._tracks = []
        self._mean = np.zeros((0, 8))
        self._cov = np.zeros((0, 3, 4))
        self._first_frame = True
        width, height = self._size
        return TrackFrame(time, width, height, (), (), ended, ())


def _absorbed_by(owners: np.ndarray) -> dict[int, list[int]]:
    """owner detection -> the detections it absorbed."""
    absorbed: dict[int, list[int]] = {}
    for det in _nonzero(owners >= 0).tolist():
        absorbed.setdefault(int(owners[det]), []).append(det)
    return absorbed
