"""The tracker's frozen types: the seam between tracking, events and the result router."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = True
    min_hits: int = 3        # detections before a track is confirmed
    lost_s: float = 2.0      # a confirmed track not matched for this long ends


@dataclass(frozen=True)
class Track:
    id: str                  # unique across restarts (e.g. "<start unix s base36>-<counter>")
    label_id: int            # the model's class id, decided by score-weighted vote
    box: tuple[float, float, float, float]  # x1 y1 x2 y2 source px: the matched detection's box
    # this frame, or the motion model's prediction while not matched
    score: float             # the matched detection's score this frame; 0.0 when not matched
    top_score: float         # the best score so far
    start_time: float        # frame time of its first detection
    last_time: float         # frame time it was last matched
    matched: bool            # matched a detection in this frame
    detection: int           # index of that detection in the Detections given to update(); -1


@dataclass(frozen=True)
class TrackFrame:
    time: float                          # the frame time given to update()
    width: int                           # the frame's size (from Detections)
    height: int
    tracks: tuple[Track, ...]            # every confirmed track still alive (matched or not)
    started: tuple[Track, ...]           # confirmed in this frame (also in `tracks`)
    ended: tuple[Track, ...]             # ended in this frame (lost for lost_s, or end_all)
    det_track_ids: tuple[str | None, ...]  # per detection given to update(): its confirmed
    # track's id, None when unconfirmed/unmatched
