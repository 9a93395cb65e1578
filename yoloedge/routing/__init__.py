"""The result path above the pipeline: the router (`router.ResultRouter`: a frame's filters, its
stages, every sink), its sinks (`sinks/`: MQTT, Home Assistant, watch, snapshots, metrics, events),
the stages that need tracking and events (`TrackingStage`), and the full frames they keep for
event best shots (`FrameKeeper`). Above `pipeline`, `tracking`, `events`, `publish` and `control`,
below the daemon: `pipeline` hands its frames over and imports none of them, so nothing here can
make a package cycle with it."""

from .keeper import FrameKeeper
from .tracking import TrackingStage

__all__ = ["FrameKeeper", "TrackingStage"]
