"""What the tracker hands on: the seam between tracking, events and the result router (what it is
configured with, `TrackingConfig`, is the config's: `config.schema`). A frozen dataclass, and a
NamedTuple for `Track` (made 20 times a frame, where a frozen dataclass's construction alone took a
tenth of the tracker's time); no numpy here.

Times are Unix seconds (float) of the *frames*: capture time for live cameras, wall clock at open
plus media position for files. The tracker never reads a clock of its own, so a file played faster
than real time gives the same tracks as when it plays at its rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

#: ByteTrack's fixed rules, kept as they are upstream (ifzhang/ByteTrack, byte_tracker.py), not keys:
#: a new track needs a score this far above `high_score` (upstream det_thresh = track_thresh + 0.1);
NEW_TRACK_MARGIN = 0.1
#: the second association (low-score detections to tracks the first left unmatched) needs IoU >= 0.5;
SECOND_MATCH_IOU = 0.5
#: tentative tracks take the high-score detections left over at cost 1 - IoU x score <= 0.7.
TENTATIVE_MATCH_COST = 0.7
#: not upstream: two boxes of different classes overlapping at least this much in one frame are one
#: object detected twice (class-wise NMS keeps both); the weaker one is absorbed by the stronger.
DUPLICATE_IOU = 0.7


class Track(NamedTuple):
    id: str                  # unique across restarts and cameras ("<start base36>-<counter>")
    label_id: int            # the model's class id, decided by a score-weighted vote
    box: tuple[float, float, float, float]  # x1 y1 x2 y2 source px: the matched detection's box
    #                          this frame, or the motion model's prediction while not matched
    score: float             # the matched detection's score this frame; 0.0 when not matched
    top_score: float         # the best score so far
    start_time: float        # frame time of its first detection
    last_time: float         # frame time it was last matched
    matched: bool            # matched a detection in this frame
    detection: int           # index of that detection in the Detections given to update(); -1


@dataclass(frozen=True, slots=True)
class TrackFrame:
    time: float                          # the frame time given to update()
    width: int                           # the frame's size (from Detections)
    height: int
    tracks: tuple[Track, ...]            # every confirmed track still alive (matched or not)
    started: tuple[Track, ...]           # confirmed in this frame (also in `tracks`)
    ended: tuple[Track, ...]             # ended in this frame (lost for lost_s, or end_all)
    det_track_ids: tuple[str | None, ...]  # per detection given to update(): its confirmed
    #                                      track's id, None when unconfirmed/unmatched, or a
    #                                      duplicate under another label (one box per track)
