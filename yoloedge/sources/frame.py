"""What a camera reader produces, and the one callable it hands frames to.

The reader knows nothing of queues, batches or devices: it is given a *sink* and calls
`sink(frame, timeout_s)` for every frame it keeps. That keeps `sources/` free of any import from
`pipeline/`, and lets the pipeline decide the overflow policy (keep-latest for live cameras,
back-pressure for lossless files) where the capacity is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..preprocess import Geometry


class DevicePicture(Protocol):
    """A decoded picture that lives in an accelerator's memory (`decoder: dvpp`: NV12 in the
    card's DVPP memory). The host never reads its pixels on the frame path: a preparer letterboxes
    it on the card straight into a model input slot; `to_bgr` copies it back only for whoever asks
    (snapshots, event best shots). It belongs to a small ring of its camera: `release` gives it
    back once every holder let go: the reader holds it while it delivers the frame, and each
    model's queue entry `hold`s it until it was placed (or a keep-latest queue dropped it)."""

    width: int
    height: int
    pts_s: float | None  # media time of the access unit it was decoded from (files), if known
    #: the device (worker name, e.g. "npu/0") whose input sets alone can take it
    device: str

    def letterbox_into(self, address: int, width: int, height: int) -> Geometry:
        """Letterbox onto the card into the NV12 canvas of width x height at device `address`;
        the geometry actually used (the card's alignment rules may move the paste area)."""
        ...

    def to_bgr(self) -> np.ndarray:
        """A host copy, BGR (BT.601, as the host decoders give it)."""
        ...

    def hold(self) -> None:
        """One more holder."""
        ...

    def release(self) -> None:
        """One holder less; the last one gives it back to its ring."""
        ...


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
    #: set by `decoder: dvpp`: the picture is on the card, and `image` is an empty (h, w, 0)
    #: placeholder; `host_image()` copies it back when somebody needs the pixels
    picture: DevicePicture | None = None
    _host: np.ndarray | None = None

    def host_image(self) -> np.ndarray:
        """The BGR pixels: `image`, or the device picture copied back (once per frame, shared by
        whoever asks: the snapshot tap and the frame keeper)."""
        if self.picture is None:
            return self.image
        if self._host is None:
            self._host = self.picture.to_bgr()
        return self._host

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
