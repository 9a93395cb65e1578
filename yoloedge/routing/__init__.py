"""The result router's stages that need tracking and events (`TrackingStage`), and the full frames
they keep for event best shots (`FrameKeeper`). Above `pipeline`, `tracking` and `events`, below
the daemon: `events.recent` imports `pipeline`, so a stage that imports `events` cannot live in
`pipeline` without a package cycle."""

from .keeper import FrameKeeper
from .tracking import TrackingStage

__all__ = ["FrameKeeper", "TrackingStage"]
