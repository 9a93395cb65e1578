"""Tracking: ByteTrack per camera, turning each frame's detections into tracks with ids.

`Tracker.update(detections, frame_time)` -> `TrackFrame` (types.py: the seam with events and the
router). See tracker.py for the algorithm and README "Tracking" for the keys.
"""

from .ids import TrackIds
from .tracker import Tracker
from .types import Track, TrackFrame, TrackingConfig

__all__ = ["Track", "TrackFrame", "TrackIds", "Tracker", "TrackingConfig"]
