"""Tracking: ByteTrack per camera, turning each frame's detections into tracks with ids.

`Tracker.update(detections, frame_time)` -> `TrackFrame` (types.py: the seam with events and the
router). See tracker.py for the algorithm and docs/integrations/tracking.md for the rules.

`Tracker` is imported on first use: `import yoloedge.tracking` (for `Track`, `TrackIds`) need not
load NumPy and OpenCV (through post-processing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .ids import TrackIds
from .types import Track, TrackFrame

if TYPE_CHECKING:
    from .tracker import Tracker

__all__ = ["Track", "TrackFrame", "TrackIds", "Tracker"]


def __getattr__(name: str) -> Any:
    if name == "Tracker":
        from .tracker import Tracker
        return Tracker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
