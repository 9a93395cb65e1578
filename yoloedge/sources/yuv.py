"""I420 pictures out of a GStreamer buffer into BGR arrays: the conversion OpenCV's FFmpeg does.

The GStreamer presets hand Python I420 rather than BGR: GStreamer's videoconvert to BGR cost
1.35 ms of CPU per 720p frame, and rounds and upsamples chroma its own way, so its pictures were
1.4 grey levels (up to 5) from `decoder: opencv`'s. Here the conversion follows FFmpeg's
(swscale's) choice of coefficients: the stream's matrix and range as the caps state them, and
BT.601 limited range when the caps say nothing (FFmpeg's default for an unspecified stream).

BT.601 limited range is cv2's COLOR_YUV2BGR_I420 (0.4 ms of CPU at 720p). Any other
colorimetry (BT.709 for most HD streams, full range) goes through one 3x4 matrix on the YUV with
its chroma repeated over each 2x2 block, as COLOR_YUV2BGR_I420 does (0.6 ms): cv2 has no
BT.709 I420 conversion, and BT.601 on a BT.709 stream is off by up to 22 levels in saturated colours.

cv2 takes the three planes as one (height * 3/2, width) array: the Y rows, then U, then V, each
packed. That is GStreamer's default layout for even sizes whose width is a multiple of 8; any other
layout (row padding, a producer's own strides, an odd size) is first copied into that shape, in an
array kept for the next frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np


@dataclass(frozen=True)
class PlaneLayout:
    """Where a picture's planes lie in its buffer: their byte offsets and row strides (one entry
    per plane: one for BGR, Y/U/V for I420)."""

    width: int
    height: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Colorimetry:
    """How a stream's YUV maps to RGB: its matrix's luma weights of red and blue, and its range."""

    kr: float
    kb: float
    full_range: bool = False


BT601 = Colorimetry(0.299, 0.114)


def bgr_matrix(colorimetry: Colorimetry) -> np.ndarray:
    """The 3x4 matrix giving (B, G, R) bytes from (Y, U, V, 1) bytes."""
    kr, kb = colorimetry.kr, colorimetry.kb
    kg = 1.0 - kr - kb
    rgb_from_yuv = np.array([[1.0, 0.0, 2 * (1 - kr)],  # u, v in -0.5..0.5
                             [1.0, -2 * kb * (1 - kb) / kg, -2 * kr * (1 - kr) / kg],
                             [1.0, 2 * (1 - kb), 0.0]])
    luma_offset, luma_scale, chroma_scale = (0, 255, 255) if colorimetry.full_range else (16, 219, 224)
    linear = 255.0 * rgb_from_yuv[::-1] @ np.diag([1 / luma_scale, 1 / chroma_scale, 1 / chroma_scale])
    offset = -linear @ np.array([luma_offset, 128.0, 128.0])
    return np.hstack([linear, offset[:, None]]).astype(np.float32)


def plane(data: Any, offset: int, stride: int, rows: int, columns: int) -> np.ndarray:
    """A (rows, columns) view of one plane, no copy. numpy raises TypeError when the buffer is
    smaller than the layout says (a producer's caps that lie)."""
    return np.ndarray((rows, columns), np.uint8, data, offset, (stride, 1))


def is_packed(layout: PlaneLayout) -> bool:
    """Whether the buffer already holds the planes as cv2 wants them, so it is converted in place."""
    w, h = layout.width, layout.height
    return (w % 2 == 0 and h % 2 == 0 and layout.strides == (w, w // 2, w // 2)
            and layout.offsets[1] == layout.offsets[0] + w * h
            and layout.offsets[2] == layout.offsets[1] + w * h // 4)


class I420Converter:
    """Converts one source's I420 frames; keeps the arrays a copied layout needs between frames
    (one source, one thread, as every source)."""

    def __init__(self) -> None:
        self._packed: np.ndarray | None = None  # the planes, copied into cv2's shape
        self._padded: np.ndarray | None = None  # BGR of an odd-sized picture, one row/column more
        self._chroma: list[np.ndarray] = []  # U and V repeated to full size (not BT.601)
        self._yuv: np.ndarray | None = None  # Y, U, V interleaved (not BT.601)
        self._pairs = np.empty((0, 0, 2), np.uint8)  # a chroma plane, each sample twice (not BT.601)
        self._matrices: dict[Colorimetry, np.ndarray] = {}

    def to_bgr(self, data: Any, layout: PlaneLayout, colorimetry: Colorimetry = BT601,
               out: np.ndarray | None = None) -> np.ndarray:
        """The picture as (height, width, 3) BGR: into `out` when its shape fits (no allocation),
        else a new array. TypeError: the buffer is smaller than `layout`."""
        w, h = layout.width, layout.height
        even_w, even_h = w + w % 2, h + h % 2
        if is_packed(layout):
            yuv = plane(data, layout.offsets[0], w, h * 3 // 2, w)
        else:
            yuv = self._pack(data, layout, even_w, even_h)
        fits = out is not None and out.shape == (h, w, 3) and out.dtype == np.uint8
        if (even_w, even_h) != (w, h):  # cv2 converts even sizes only: convert one more, cut it off
            if self._padded is None or self._padded.shape != (even_h, even_w, 3):
                self._padded = np.empty((even_h, even_w, 3), np.uint8)
            self._convert(yuv, colorimetry, self._padded)
            target = out if fits and out is not None else np.empty((h, w, 3), np.uint8)
            np.copyto(target, self._padded[:h, :w])
            return target
        target = out if fits and out is not None else np.empty((h, w, 3), np.uint8)
        self._convert(yuv, colorimetry, target)
        return target

    def _convert(self, yuv: np.ndarray, colorimetry: Colorimetry, bgr: np.ndarray) -> None:
        """cv2's (height * 3/2, width) I420 into `bgr`, (height, width, 3), even sizes."""
        if colorimetry == BT601:
            cv2.cvtColor(yuv, cv2.COLOR_YUV2BGR_I420, dst=bgr)
            return
        height, width = bgr.shape[:2]
        if self._yuv is None or self._yuv.shape != bgr.shape:
            self._yuv = np.empty(bgr.shape, np.uint8)
            self._chroma = [np.empty((height, width), np.uint8) for _ in range(2)]
            self._pairs = np.empty((height // 2, width // 2, 2), np.uint8)
        chroma_size = width * height // 4
        flat = yuv.reshape(-1)
        for index, full in enumerate(self._chroma):
            start = width * height + index * chroma_size
            half = flat[start:start + chroma_size].reshape(height // 2, width // 2)
            # each sample twice along its row, each row twice: a 2x2 block (8x faster than cv2.resize)
            cv2.merge([half, half], dst=self._pairs)
            np.copyto(full.reshape(height // 2, 2, width), self._pairs.reshape(height // 2, 1, width))
        cv2.merge([yuv[:height], *self._chroma], dst=self._yuv)
        matrix = self._matrices.get(colorimetry)
        if matrix is None:
            matrix = self._matrices[colorimetry] = bgr_matrix(colorimetry)
        cv2.transform(self._yuv, matrix, dst=bgr)

    def _pack(self, data: Any, layout: PlaneLayout, even_w: int, even_h: int) -> np.ndarray:
        """The planes copied into cv2's (even_h * 3/2, even_w) shape; an odd size's extra row and
        column repeat the last ones (I420's chroma planes already cover them)."""
        w, h = layout.width, layout.height
        shape = (even_h * 3 // 2, even_w)
        if self._packed is None or self._packed.shape != shape:
            self._packed = np.empty(shape, np.uint8)
        packed = self._packed
        luma = packed[:even_h]
        luma[:h, :w] = plane(data, layout.offsets[0], layout.strides[0], h, w)
        if w < even_w:
            luma[:h, w] = luma[:h, w - 1]
        if h < even_h:
            luma[h] = luma[h - 1]
        chroma_w, chroma_h = even_w // 2, even_h // 2
        flat = packed.reshape(-1)
        for index in (1, 2):
            start = even_w * even_h + (index - 1) * chroma_w * chroma_h
            target = flat[start:start + chroma_w * chroma_h].reshape(chroma_h, chroma_w)
            target[:] = plane(data, layout.offsets[index], layout.strides[index], chroma_h, chroma_w)
        return packed
