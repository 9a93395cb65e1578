"""Synthetic cameras: one pre-decoded frame delivered at a fixed rate (benchmarks and dry runs).

The URL syntax (`synthetic://WIDTHxHEIGHT?fps=F[&image=PATH]`) and its checks are the config's
(`config.sources`); this module makes the frame and delivers it.
"""

from __future__ import annotations

import time
from typing import Callable

import cv2
import numpy as np

from ..config.sources import SyntheticSpec, SyntheticUrlError, parse_synthetic_url, synthetic_image_problem
from ..errors import ImageError
from ..redact import redact_url
from .base import Source, SourceError, SourceKind, UnsupportedSourceError
from .imagesize import read_image


def textured_frame(width: int, height: int) -> np.ndarray:
    """A deterministic BGR test frame with gradients, a checkerboard and smooth detail, so that
    resizing and encoding do real work (a flat frame would flatter them)."""
    x = np.arange(width, dtype=np.float64)[None, :]
    y = np.arange(height, dtype=np.float64)[:, None]
    checker = ((np.arange(width)[None, :] // 48 + np.arange(height)[:, None] // 48) % 2) * 48.0 - 24.0
    channels = (x * (255.0 / max(width - 1, 1)) + checker,
                y * (255.0 / max(height - 1, 1)) + checker,
                127.5 + 127.5 * np.sin(x / 23.0) * np.cos(y / 17.0) - checker)
    frame = np.empty((height, width, 3), dtype=np.uint8)
    for index, channel in enumerate(channels):
        frame[:, :, index] = np.clip(np.broadcast_to(channel, (height, width)), 0, 255)
    return frame


def synthetic_frame(spec: SyntheticSpec) -> np.ndarray:
    """The frame a synthetic source delivers: the image resized once to the requested size
    (cv2.INTER_AREA to shrink, cv2.INTER_LINEAR otherwise), or `textured_frame`. Read-only."""
    if spec.image is None:
        frame = textured_frame(spec.width, spec.height)
    else:
        try:
            image = read_image(spec.image)
        except ImageError as exc:
            raise SourceError(synthetic_image_problem(spec.image) or str(exc)) from None
        frame = resize_to(image, spec.width, spec.height)
    frame = np.ascontiguousarray(frame)
    frame.setflags(write=False)
    return frame


def resize_to(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """`image` at width x height; the image itself when it already is that size."""
    if image.shape[1] == width and image.shape[0] == height:
        return image
    shrink = width <= image.shape[1] and height <= image.shape[0]
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


class SyntheticSource(Source):
    """One pre-decoded frame, delivered `fps` times a second, forever: a camera without decoding.

    Every read returns the same read-only ndarray (never a copy), so decoding and copying cost
    nothing and benchmarks measure the rest of the pipeline. It is a live source: the reader does
    not pace live sources, so read() paces itself. Frame k is due at start + k / fps on the
    (monotonic) clock; read() sleeps until the next frame is due -- never longer than one frame
    period, so a stop request waits at most that long. Oversleeping a little does not accumulate
    (the schedule is kept), and a consumer that falls a whole period or more behind (a pause, a
    slow accelerator) gets the frame at once and the schedule restarts from then: no burst of
    back-to-back frames to catch up, as a live camera whose frames nobody read.

    `clock` and `sleep` are injectable for tests.
    """

    kind = SourceKind.SYNTHETIC
    is_live = True

    def __init__(self, url: str, camera: str | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        try:
            spec = parse_synthetic_url(url)
        except SyntheticUrlError as exc:
            raise UnsupportedSourceError(f"{redact_url(url)}: {exc}") from exc
        super().__init__(spec.url, camera)
        self.spec = spec
        self.nominal_fps = spec.fps
        self._period = 1.0 / spec.fps
        self._clock = clock
        self._sleep = sleep
        self._frame: np.ndarray | None = synthetic_frame(spec)
        self._due: float | None = None  # when the next frame is due; None: at once

    def read(self) -> np.ndarray | None:
        frame = self._frame
        if frame is None:
            self.error = "source released"
            return None
        now = self._clock()
        due = self._due
        if due is None or now - due >= self._period:
            due = now  # the first frame, or a whole period late: start the schedule again from now
        elif due > now:
            self._sleep(min(due - now, self._period))
        self._due = due + self._period
        return frame

    def release(self) -> None:
        self._frame = None

