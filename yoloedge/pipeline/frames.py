"""The unit of work that flows from a camera reader to the publisher."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Frame:
    camera: str
    seq: int  # per-camera sequence number, from 0, counting every frame handed to the pipeline
    image: np.ndarray  # BGR (or gray/BGRA), any size
    capture_time: float  # wall clock (time.time()) when the frame was read: published as `ts`
    capture_mono: float  # time.monotonic() at the same moment: for latency measurements
    timings: dict[str, float] = field(default_factory=dict)  # stage -> monotonic time

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])
