"""The `tracking:` section: defaults for every camera at the top level, overridden key by key by
`cameras[].tracking`. Each camera's CameraConfig.tracking is the merged result.

The keys follow ByteTrack's (see tracking/tracker.py and docs/integrations/tracking.md). A camera's
section is read on its own (types and bounds) and merged once the top level is known, so the order
rule (low_score <= high_score) is checked on what the camera really gets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .fields import INVALID, Boolean, Context, Key, Integer, Number, mapping_or_report, read_fields
from .schema import CameraConfig, TrackingConfig
from .yamltree import Item

#: the longest lost time (an hour: far past any real occlusion) and the most hits to confirm.
MAX_LOST_S = 3600
MAX_MIN_HITS = 1000

TRACKING_FIELDS: dict[str, Key] = {
    "enabled": Key(Boolean(),
                   "track this camera's objects; detections carry `track_id`"),
    "min_hits": Key(Integer(ge=1, le=MAX_MIN_HITS, example=3),
                    "detections in a row before a track is confirmed and gets its id (its event starts)"),
    "lost_s": Key(Number(gt=0, le=MAX_LOST_S, example=2),
                  "a confirmed track not matched for this long, in frame time, ends",
                  default="`2.0`"),
    "high_score": Key(Number(ge=0, le=1, example=0.25),
                      "detections at least this confident are matched first; from `high_score` + 0.1 up they start "
                      "tracks (ByteTrack's `track_thresh`)"),
    "low_score": Key(Number(ge=0, le=1, example=0.1),
                     "the lowest score used: from here up to `high_score` a detection only keeps a track alive "
                     "(ByteTrack's second association); post-processing keeps candidates down to it"),
    "match_thresh": Key(Number(ge=0, le=1, example=0.8),
                        "first association: a detection matches a track at cost 1 - IoU x score at most this "
                        "(ByteTrack's `match_thresh`)"),
}


def read_tracking(ctx: Context, item: Item) -> Any:
    """The top-level section: absent or null takes every default."""
    if item.value is None:
        return TrackingConfig()
    values = read_fields(ctx, item, TRACKING_FIELDS)
    if values is None:
        return INVALID
    config = dataclasses.replace(TrackingConfig(), **values)
    return config if _order_ok(ctx, item, config) else INVALID


def read_camera_tracking(ctx: Context, item: Item) -> Any:
    """A camera's overrides, checked key by key; held over the defaults until `merge_cameras`."""
    if mapping_or_report(ctx, item, optional=True) is None:
        return TrackingConfig() if item.value is None else INVALID
    values = read_fields(ctx, item, TRACKING_FIELDS)
    return INVALID if values is None or len(values) != len(item.value) else TrackingConfig(**values)


def merge_cameras(ctx: Context, cameras_item: Item, cameras: tuple[CameraConfig, ...],
                  top: TrackingConfig) -> Any:
    """Each camera's tracking: the top level's, with the keys its own section gives (a bad key was
    reported by read_camera_tracking, which refuses the file; it is passed over here)."""
    merged = []
    for item, camera in zip(cameras_item.value, cameras):
        own = item.value.get("tracking")
        given = [key for key in own.value if key in TRACKING_FIELDS] if own is not None and own.is_mapping else []
        config = dataclasses.replace(top, **{key: getattr(camera.tracking, key) for key in given})
        if own is not None and own.is_mapping and not _order_ok(ctx, own, config):
            return INVALID
        merged.append(dataclasses.replace(camera, tracking=config))
    return tuple(merged)


def _order_ok(ctx: Context, item: Item, config: TrackingConfig) -> bool:
    """low_score above high_score would leave no second association: a typo."""
    if config.low_score <= config.high_score:
        return True
    entries = item.value
    key = "low_score" if "low_score" in entries else "high_score"
    ctx.bad_value(entries[key], f"low_score ({config.low_score:g}) must be <= high_score ({config.high_score:g})",
                  "e.g. high_score: 0.25 and low_score: 0.1")
    return False
