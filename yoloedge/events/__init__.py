"""Zones, lines, events and counts (issue 17): what the tracks did, for MQTT, Home Assistant and
status. `CameraEvents` turns each camera's `TrackFrame`s into event messages, counts and best
shots; `CountsStore` keeps the counts across restarts."""

from .camera import EDGE_MARGIN_PX, EVENT_VERSION, UPDATE_INTERVAL_S, CameraEvents
from .counts import COUNTS_VERSION, CountsState, CountsStore, UnknownCounts
from .types import BestShot, CountKind, CountsMessage, Direction, EventBatch, EventType

__all__ = [
    "BestShot", "CameraEvents", "COUNTS_VERSION", "CountKind", "CountsMessage", "CountsState", "CountsStore",
    "Direction", "EDGE_MARGIN_PX", "EVENT_VERSION", "EventBatch", "EventType", "UnknownCounts", "UPDATE_INTERVAL_S",
]
