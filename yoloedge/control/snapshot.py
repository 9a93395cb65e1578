"""The control socket's reply to `{"cmd": "snapshot", "camera": NAME}`.

The reply is the control protocol's business, the snapshot the pipeline's; pipeline may not import
control, so the reply is built here from what `pipeline.snapshots.SnapshotStore.latest` answers,
read through its attributes only (the pipeline's types are named for the type checker alone).
"""

from __future__ import annotations

import base64
from enum import Enum
from typing import TYPE_CHECKING

from ..timeutil import utc_timestamp
from .protocol import quoted_name

if TYPE_CHECKING:
    from ..pipeline.snapshots import SnapshotStore

#: a snapshot JPEG larger than this is not sent over the control socket (8K frames are ~5 MB).
MAX_JPEG_BYTES = 12 * 1024 * 1024


def snapshot_reply(store: SnapshotStore, request: dict) -> dict:
    """The reply to a snapshot request; `reason` tells ctl which exit code to use."""
    camera = request.get("camera")
    if not isinstance(camera, str):
        return {"ok": False, "error": 'snapshot needs a "camera" name'}
    snap = store.latest(camera)
    if isinstance(snap, Enum):  # a SnapshotMiss: why there is none
        return {"ok": False, "reason": snap.value, "error": snap.why(quoted_name(camera))}
    if len(snap.jpeg) > MAX_JPEG_BYTES:
        return {"ok": False, "error": f"the snapshot is {len(snap.jpeg)} bytes, more than the "
                                      f"{MAX_JPEG_BYTES} the control socket carries"}
    return {"ok": True, "camera": snap.camera, "frame": snap.seq, "ts": utc_timestamp(snap.capture_time),
            "width": snap.width, "height": snap.height, "detections": snap.detections,
            "jpeg_base64": base64.b64encode(snap.jpeg).decode("ascii")}
