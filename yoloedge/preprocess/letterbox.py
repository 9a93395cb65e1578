"""Letterbox resize, written once and shared by every backend.

The exact rounding matters: int8 models move by up to 0.15 in score when the resized size or the
pad position differs by one pixel, so each family's upstream convention is reproduced:

* Ultralytics / YOLOv5 ("center"): new size = round(w*r), pad split round(d/2 -/+ 0.1), so an odd
  pixel of padding goes to the bottom/right.
* YOLOX ("topleft"): new size = int(w*r) (truncated), image at the top-left, all padding after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

PAD_VALUE = 114

Placement = Literal["center", "topleft"]


@dataclass(frozen=True)
class LetterboxStyle:
    """How a family expects its input: placement, colour order and value scaling."""

    placement: Placement = "center"
    rgb: bool = True  # channel order the model wants (frames arrive BGR, as OpenCV decodes them)
    normalize: bool = True  # divide by 255

    @property
    def truncate(self) -> bool:
        # YOLOX's preproc truncates the resized size; Ultralytics/YOLOv5 round it.
        return self.placement == "topleft"


def family_style(fmt: str, placement: str | None = None, color: str | None = None,
                 normalize: bool | None = None) -> LetterboxStyle:
    """Each family's upstream preprocessing (YOLOX: top-left, BGR, 0-255; the others: centred,
    RGB, /255), with explicit overrides on top."""
    yolox = fmt == "yolox"
    return LetterboxStyle(
        placement="topleft" if (placement or ("topleft" if yolox else "center")) == "topleft" else "center",
        rgb=(color or ("bgr" if yolox else "rgb")) == "rgb",
        normalize=normalize if normalize is not None else not yolox)


@dataclass(frozen=True)
class Geometry:
    """Where a source frame landed inside the model input, to map boxes back."""

    src_w: int
    src_h: int
    new_w: int
    new_h: int
    left: int
    top: int

    @property
    def scale_x(self) -> float:
        return self.new_w / self.src_w

    @property
    def scale_y(self) -> float:
        return self.new_h / self.src_h

    def boxes_to_source(self, boxes: np.ndarray, clip: bool = True) -> np.ndarray:
        """Map xyxy boxes from model-input pixels to source pixels, in place."""
        boxes[:, 0::2] -= self.left
        boxes[:, 1::2] -= self.top
        boxes[:, 0::2] /= self.scale_x
        boxes[:, 1::2] /= self.scale_y
        if clip:
            np.clip(boxes[:, 0::2], 0, self.src_w, out=boxes[:, 0::2])
            np.clip(boxes[:, 1::2], 0, self.src_h, out=boxes[:, 1::2])
        return boxes


def compute_geometry(
    src_w: int, src_h: int, dst_w: int, dst_h: int, style: LetterboxStyle = LetterboxStyle()
) -> Geometry:
    if src_w <= 0 or src_h <= 0:
        raise ValueError(f"frame has no pixels ({src_w}x{src_h})")
    r = min(dst_h / src_h, dst_w / src_w)
    if style.truncate:
        new_w, new_h = int(src_w * r), int(src_h * r)
    else:
        new_w, new_h = int(round(src_w * r)), int(round(src_h * r))
    new_w = min(max(new_w, 1), dst_w)
    new_h = min(max(new_h, 1), dst_h)
    if style.placement == "topleft":
        left = top = 0
    else:
        left = int(round((dst_w - new_w) / 2 - 0.1))
        top = int(round((dst_h - new_h) / 2 - 0.1))
    return Geometry(src_w, src_h, new_w, new_h, left, top)


def as_bgr(frame: np.ndarray) -> np.ndarray:
    """Accept grayscale (HxW or HxWx1) and BGRA frames as well as BGR."""
    if frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] == 1):
        return cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
    if frame.ndim == 3 and frame.shape[2] == 4:
        return cv2.cvtColor(frame, cv2.COLOR_BGRA2BGR)
    if frame.ndim == 3 and frame.shape[2] == 3:
        return frame
    raise ValueError(f"unsupported frame shape {frame.shape}: expected HxW, HxWx1, HxWx3 or HxWx4")


class Resizer:
    """The first half of the letterbox: a frame -> its picture at the size it takes in the model
    input (BGR uint8, no padding) and its geometry.

    The daemon runs this on each camera's reader thread, so that only a model-sized picture
    (0.7 MB for a 1080p frame into 640x640, instead of 6.2 MB) waits in the camera's queue and
    the decoder's frame can be reused for the next read. `Letterboxer.place` does the rest.
    """

    def __init__(self, height: int, width: int, style: LetterboxStyle = LetterboxStyle()):
        self.height, self.width, self.style = height, width, style
        self._last_geometry: Geometry | None = None  # a camera's frames all have one size

    def geometry(self, frame: np.ndarray) -> Geometry:
        last = self._last_geometry
        if last is not None and last.src_w == frame.shape[1] and last.src_h == frame.shape[0]:
            return last
        self._last_geometry = compute_geometry(frame.shape[1], frame.shape[0], self.width, self.height, self.style)
        return self._last_geometry

    def resize(self, frame: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, Geometry]:
        """`frame` resized into `out` (reused when it has the right shape, else a new array)."""
        frame = as_bgr(frame)
        geo = self.geometry(frame)
        shape = (geo.new_h, geo.new_w, 3)
        if out is None or out.shape != shape or out.dtype != np.uint8:
            out = np.empty(shape, np.uint8)
        resize_into(frame, geo, out)
        return out, geo


def resize_into(frame: np.ndarray, geo: Geometry, out: np.ndarray) -> None:
    """The one resize of the letterbox (bilinear, to geo.new_w x geo.new_h), into `out`."""
    if (geo.new_w, geo.new_h) == (geo.src_w, geo.src_h):
        out[...] = frame
        return
    res = cv2.resize(frame, (geo.new_w, geo.new_h), dst=out, interpolation=cv2.INTER_LINEAR)
    if res.ctypes.data != out.ctypes.data:  # OpenCV could not write in place
        out[...] = res


class Letterboxer:
    """Letterboxes frames into one slot of a preallocated batch buffer.

    One instance per worker: it keeps a uint8 canvas and three plane buffers, allocated once, so
    the per-frame cost is cv2.resize into the canvas plus one scaled copy per plane. Nothing is
    allocated per frame (bar cv2.resize's own scratch).

    Slot layouts:
    * NCHW float32/float16: normalised planes (``style.normalize``) in the model's channel order;
    * NHWC uint8 (Ascend AIPP, which normalises on the device): the letterboxed canvas itself;
    * a 1-channel model gets the grayscale image.
    """

    def __init__(self, height: int, width: int, channels: int = 3, nhwc: bool = False,
                 style: LetterboxStyle = LetterboxStyle()):
        if channels not in (1, 3):
            raise ValueError(f"models with {channels} input channels are not supported (1 or 3)")
        self.height, self.width, self.channels, self.nhwc, self.style = height, width, channels, nhwc, style
        self._canvas = np.full((height, width, 3), PAD_VALUE, np.uint8)
        self._planes = [np.empty((height, width), np.uint8) for _ in range(3)]
        self._gray = np.empty((height, width), np.uint8)
        self._canvas_geometry: Geometry | None = None
        self._scale = np.float32(1.0 / 255.0 if style.normalize else 1.0)
        self.resizer = Resizer(height, width, style)
        self._flat_planes = [p.reshape(-1) for p in self._planes]
        self._pad_values: dict[np.dtype, np.ndarray] = {}

    def geometry(self, frame: np.ndarray) -> Geometry:
        return self.resizer.geometry(frame)

    def __call__(self, frame: np.ndarray, slot: np.ndarray) -> Geometry:
        """Write `frame` (BGR, gray or BGRA, any size) into `slot` and return its geometry."""
        frame = as_bgr(frame)
        geo = self.geometry(frame)
        canvas = self._canvas_for(geo, slot)
        resize_into(frame, geo, canvas[geo.top:geo.top + geo.new_h, geo.left:geo.left + geo.new_w])
        self._to_slot(canvas, slot)
        return geo

    def place(self, resized: np.ndarray, geo: Geometry, slot: np.ndarray) -> Geometry:
        """The second half of the letterbox: a `Resizer` result into `slot`, padded, in the
        model's colour order and scale. Bit for bit what `__call__` writes for the same frame.

        For the usual NCHW slot the picture's planes are scaled straight into their place in the
        slot and only the padding is filled with a constant: no canvas copy, and no scaling of
        padding that is the same every time."""
        if self.nhwc or self.channels == 1:
            canvas = self._canvas_for(geo, slot)
            canvas[geo.top:geo.top + geo.new_h, geo.left:geo.left + geo.new_w] = resized
            self._to_slot(canvas, slot)
            return geo
        planes = self._region_planes(geo.new_h, geo.new_w)
        cv2.split(resized, planes)
        pad = self._pad_value(slot.dtype)
        order = (2, 1, 0) if self.style.rgb else (0, 1, 2)
        for c, plane in enumerate(order):
            out = slot[c]
            _fill_padding(out, geo, pad)
            _scale_into(planes[plane], self._scale, out[geo.top:geo.top + geo.new_h, geo.left:geo.left + geo.new_w])
        return geo

    def _region_planes(self, height: int, width: int) -> list[np.ndarray]:
        """Three uint8 planes of the picture's size, views of the full-size planes (no allocation)."""
        return [p[:height * width].reshape(height, width) for p in self._flat_planes]

    def _pad_value(self, dtype: np.dtype) -> np.ndarray:
        """The scaled pad value, computed by the very conversion the picture goes through."""
        value = self._pad_values.get(dtype)
        if value is None:
            # not 1x1: OpenCV 5 reads a 1x1 (up to 4x1) array next to a scalar as a scalar itself
            few = np.empty((PAD_PROBE, PAD_PROBE), dtype)
            _scale_into(np.full((PAD_PROBE, PAD_PROBE), PAD_VALUE, np.uint8), self._scale, few)
            value = self._pad_values[dtype] = few[0, 0]
        return value

    def _canvas_for(self, geo: Geometry, slot: np.ndarray) -> np.ndarray:
        if self.nhwc and self.channels == 3:
            if slot.shape != self._canvas.shape or slot.dtype != np.uint8:
                raise ValueError(f"NHWC slot must be uint8 {self._canvas.shape}, got {slot.dtype} {slot.shape}")
            # The slot is written directly; its padding is whatever the previous frame left.
            slot[...] = PAD_VALUE
            return slot
        if self._canvas_geometry != geo:
            self._canvas.fill(PAD_VALUE)
            self._canvas_geometry = geo
        return self._canvas

    def _to_slot(self, canvas: np.ndarray, slot: np.ndarray) -> None:
        if self.channels == 1:
            cv2.cvtColor(canvas, cv2.COLOR_BGR2GRAY, dst=self._gray)
            _scale_into(self._gray, self._scale, slot.reshape(self.height, self.width))
            return
        if self.nhwc:
            if self.style.rgb:
                cv2.cvtColor(slot, cv2.COLOR_BGR2RGB, dst=slot)
            return
        cv2.split(canvas, self._planes)
        order = (2, 1, 0) if self.style.rgb else (0, 1, 2)
        for c, plane in enumerate(order):
            _scale_into(self._planes[plane], self._scale, slot[c])


def _fill_padding(plane: np.ndarray, geo: Geometry, value: np.ndarray) -> None:
    """Write `value` around the picture's region of one slot plane (rows above and below, then
    the columns left and right of it)."""
    bottom, right = geo.top + geo.new_h, geo.left + geo.new_w
    plane[:geo.top] = value
    plane[bottom:] = value
    plane[geo.top:bottom, :geo.left] = value
    plane[geo.top:bottom, right:] = value


#: the side of the plane the pad value is converted on (`Letterboxer._pad_value`)
PAD_PROBE = 8


def _scale_into(plane: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
    """out = plane * scale, converting uint8 to the slot's float type without a temporary."""
    if out.dtype == np.float16:
        # NumPy's uint8 -> float16 cast is ~4x slower than OpenCV's CV_16F conversion.
        # OpenCV takes a scalar src2; the stubs of some releases list only arrays (ignore, not allocate one).
        res = cv2.multiply(plane, float(scale), dst=out, dtype=cv2.CV_16F)  # type: ignore[call-overload, unused-ignore]
        if res.ctypes.data != out.ctypes.data:
            out[...] = res
        return
    np.multiply(plane, scale, out=out, casting="unsafe")
