"""What a camera reader produces, and the one callable it hands frames to.

The reader knows nothing of queues, batches or devices: it is given a *sink* and calls
`sink(frame, timeout_s)` for every frame it keeps. That keeps `sources/` free of any import from
`pipeline/`, and lets the pipeline decide the overflow policy (keep-latest for live cameras,
back-pressure for lossless files) where the capacity is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(slots=True)
class Frame:
    camera: str
    seq: int  # per-camera sequence number, from 0, counting every frame read from the camera
    #: BGR (or gray/BGRA), any size, as the decoder returned it. A reader given a `FramePool`
    #: reuses this array once the sink returns (lent to the next frame of any camera, or decoded
    #: into again): a sink must be done with it (or have copied what it needs) by then.
    image: np.ndarray
    capture_time: float  # wall clock (time.time()) when the frame was read: published as `ts`
    capture_mono: float  # time.monotonic() at the same moment: for latency measurements
    #: the frame's own time (Unix s), what tracking and events run on: the capture time for live
    #: sources; for files the wall clock when the file was opened plus the frame's media position
    #: (continuing across loops), so a file read faster than real time has the same times as one
    #: played at its rate. None: the capture time.
    frame_time: float | None = None

    @property
    def time(self) -> float:
        return self.capture_time if self.frame_time is None else self.frame_time

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])


class SinkClosed(Exception):
    """The sink takes no more frames: the camera is being removed."""


#: sink(frame, timeout_s) -> True when the frame was taken (a keep-latest sink always takes it,
#: dropping an older one and counting the drop); False when a lossless sink had no room within
#: timeout_s (the reader checks whether it is stopping and offers the frame again). Raises
#: SinkClosed when the camera is being removed.
FrameSink = Callable[[Frame, float], bool]
