"""Tracking: ByteTrack per camera, turning each frame's detections into tracks with ids.

`Tracker.update(detections, frame_time)` -> `TrackFrame` (types.py: the seam with events and the
router). See tracker.py for the algorithm and docs/integrations/tracking.md for the rules.

`Tracker` is imported on first use: the config schema imports `types` from here, and must not load
NumPy and OpenCV (through post-processing) for `yoloedge-ctl` or `yoloedge check`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .ids import TrackIds
from .types import Track, TrackFrame, TrackingConfig

if TYPE_CHECKING:
    from .tracker import Tracker

__all__ = ["Track", "TrackFrame", "TrackIds", "Tracker", "TrackingConfig"]


def __getattr__(name: str) -> Any:
    if name == "Tracker":
        from .tracker import Tracker
        return Tracker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
