"""Recognise a YOLO output layout from tensor shapes (and metadata), or check a configured one.

| format  | per-image output            | family                                   |
|---------|-----------------------------|------------------------------------------|
| v8      | [4+nc, N] (or [N, 4+nc])    | YOLOv8 / v11 / v12 (anchor-free, no obj) |
| v5      | [N, 5+nc], N = 3 x grid     | YOLOv5 / v7 (anchors, objectness)        |
| e2e     | [K, 6] x1 y1 x2 y2 score cls| YOLOv10 / YOLO26 end-to-end (no NMS)     |
| yolox   | [N, 5+nc], N = grid, raw    | YOLOX (grid + stride decode)             |
| raw     | 3 maps [na*(5+nc), H, W]    | YOLOv5 head without Detect (e.g. .om)    |
| raw_v8  | 3 maps [64+nc, H, W]        | YOLOv8 head without Detect (DFL)         |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..config.model import FORMATS
from ..errors import LayoutError
from ..model.spec import ModelMetadata, TensorSpec

#: YOLOv5's default anchors (pixels), P3/8, P4/16, P5/32, and the P6 set for 4-level models.
YOLOV5_ANCHORS = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)
YOLOV5_P6_ANCHORS = (
    ((19, 27), (44, 40), (38, 94)),
    ((96, 68), (86, 152), (180, 137)),
    ((140, 301), (303, 264), (238, 542)),
    ((436, 615), (739, 380), (925, 792)),
)
DFL_BINS = 16
STRIDE_SETS = ((8, 16, 32), (8, 16, 32, 64))


@dataclass(frozen=True)
class Layout:
    format: str
    num_classes: int
    transposed: bool = False  # v8 only: rows are candidates ([N, 4+nc])
    strides: tuple[int, ...] = ()  # raw / yolox
    grid_shapes: tuple[tuple[int, int], ...] = ()  # (h, w) per level, raw / yolox
    anchors: tuple[tuple[tuple[float, float], ...], ...] = ()  # raw only
    map_order: str = "chw"  # raw heads: 'chw' [C,H,W], 'hwc' [H,W,C] or 'ahwc' [na,H,W,no]

    @property
    def needs_nms(self) -> bool:
        return self.format != "e2e"


def grid_shapes(h: int, w: int, strides: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((math.ceil(h / s), math.ceil(w / s)) for s in strides)


def grid_count(h: int, w: int, strides: Sequence[int]) -> int:
    return sum(gh * gw for gh, gw in grid_shapes(h, w, strides))


def describe(outputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{o.name} {list(o.shape)}" for o in outputs)


def detect_layout(
    outputs: Sequence[TensorSpec],
    input_hw: tuple[int, int],
    metadata: ModelMetadata,
    num_classes: int | None = None,
    format: str | None = None,
    anchors: Sequence[Sequence[float] | Sequence[Sequence[float]]] | None = None,
) -> Layout:
    """Work out the layout; `format` forces one and is checked against the shapes.

    `num_classes` comes from configured labels or metadata names when known; it resolves the
    cases where shapes alone are ambiguous (e.g. [N, 84] is v8 transposed for 80 classes but
    YOLOX/v5 for 79).
    """
    if format is not None and format not in FORMATS:
        raise LayoutError(f"unknown format {format!r}: choose one of {', '.join(FORMATS)}")
    if not outputs:
        raise LayoutError("the model has no outputs")
    maps = [o for o in outputs if len(o.shape) in (4, 5)]
    if format in ("raw", "raw_v8") or (format is None and len(maps) >= 2 and len(maps) == len(outputs)):
        return _raw_layout(maps or list(outputs), input_hw, num_classes, format, anchors)
    out = outputs[0]
    if len(out.shape) != 3:
        raise LayoutError(
            f"unrecognised YOLO output layout: outputs {describe(outputs)}; expected one [1, A, B] "
            f"tensor (v5/v8/e2e/yolox) or 3-4 feature maps (raw heads); set model.format to force one")
    a, b = out.shape[1], out.shape[2]
    if a > 0 and b <= 0:
        # Ultralytics' `dynamic=True` also opens the anchor axis of [1, 4+nc, N]; N follows from
        # the input size, and the decoders read it from the actual output anyway.
        b = grid_count(input_hw[0], input_hw[1], STRIDE_SETS[0])
    if a <= 0 or b <= 0:
        raise LayoutError(f"output {out.name} has open dimensions {list(out.shape)}; set model.format")
    h, w = input_hw
    counts = {grid_count(h, w, s) for s in STRIDE_SETS}
    anchor_counts = {3 * c for c in counts}
    strides_for = {grid_count(h, w, s): s for s in STRIDE_SETS}

    def fail(why: str) -> LayoutError:
        return LayoutError(f"output {describe(outputs)} does not fit format {format!r}: {why}")

    if format == "e2e":
        if b < 6:
            raise fail("expected [K, 6] rows of x1 y1 x2 y2 score class")
        return Layout("e2e", num_classes or 0)
    if format == "v8":
        if num_classes is not None and b == 4 + num_classes and a != 4 + num_classes:
            return Layout("v8", num_classes, transposed=True)
        if num_classes is None and a > b >= 5:  # candidates outnumber channels: rows layout
            return Layout("v8", b - 4, transposed=True)
        if a < 5:
            raise fail("expected [4+nc, N]")
        return Layout("v8", a - 4 if num_classes is None else _check_nc(num_classes, a - 4, fail))
    if format in ("v5", "yolox"):
        if b < 6:
            raise fail("expected [N, 5+nc]")
        nc = b - 5 if num_classes is None else _check_nc(num_classes, b - 5, fail)
        if format == "v5":
            return Layout("v5", nc)
        if a not in strides_for:
            raise fail(f"{a} rows is not a grid of strides 8/16/32(/64) at input {h}x{w}")
        strides = strides_for[a]
        return Layout("yolox", nc, strides=tuple(strides), grid_shapes=grid_shapes(h, w, strides))

    # Automatic recognition.
    if b == 6 and (metadata.end2end or (a not in counts and a not in anchor_counts)):
        return Layout("e2e", num_classes or 0)
    if metadata.end2end and b >= 6:
        return Layout("e2e", num_classes or 0)
    if num_classes is not None:
        if a == 4 + num_classes and b != 4 + num_classes:
            return Layout("v8", num_classes)
        if b == 4 + num_classes:
            return Layout("v8", num_classes, transposed=True)
        if b == 5 + num_classes:
            if a in counts and a not in anchor_counts:
                return detect_layout(outputs, input_hw, metadata, num_classes, "yolox")
            return Layout("v5", num_classes)
        raise LayoutError(
            f"output {describe(outputs)} fits no YOLO layout for {num_classes} classes (labels): "
            f"expected [{4 + num_classes}, N] (v8), [N, {5 + num_classes}] (v5/yolox) or [K, 6] (e2e); "
            f"check the labels or set model.format")
    if a < b and a >= 5:
        return Layout("v8", a - 4)
    if a > b and b >= 6:
        if a in counts and a not in anchor_counts:
            if metadata.is_ultralytics:
                return Layout("v8", b - 4, transposed=True)
            return detect_layout(outputs, input_hw, metadata, None, "yolox")
        return Layout("v5", b - 5)
    raise LayoutError(f"unrecognised YOLO output layout: {describe(outputs)}; set model.format")


def _check_nc(expected: int, got: int, fail) -> int:
    if expected != got:
        raise fail(f"the labels name {expected} classes but the output carries {got}")
    return got


def _raw_layout(maps, input_hw, num_classes, format, anchors) -> Layout:
    h, w = input_hw
    specs = []  # (grid h, grid w, channels, map order, stride)
    for m in maps:
        shape = m.shape[1:]
        if len(shape) == 4:  # [na, H, W, no]
            na, gh, gw, no = shape
            specs.append((gh, gw, na * no, "ahwc", _stride_of(h, gh, maps)))
        elif len(shape) == 3:
            stride = _fitting_stride(h, shape[1])
            if stride and shape[2] == math.ceil(w / stride):  # [C, H, W]: both H and W fit the stride
                specs.append((shape[1], shape[2], shape[0], "chw", _stride_of(h, shape[1], maps)))
            else:  # [H, W, C]
                specs.append((shape[0], shape[1], shape[2], "hwc", _stride_of(h, shape[0], maps)))
        else:
            raise LayoutError(f"raw heads must be 4-D or 5-D feature maps, got {describe(maps)}")
    specs.sort(key=lambda s: -s[0])  # finest grid (smallest stride) first
    strides = tuple(s[4] for s in specs)
    channels = {s[2] for s in specs}
    map_order = specs[0][3]
    if len(channels) != 1:
        raise LayoutError(f"raw heads disagree on channel count: {describe(maps)}")
    c = channels.pop()
    shapes = tuple((s[0], s[1]) for s in specs)
    want_dfl = format == "raw_v8" or (
        format is None and c > 4 * DFL_BINS
        and (num_classes is None and c % 3 != 0 or num_classes is not None and c == 4 * DFL_BINS + num_classes))
    if want_dfl:
        nc = c - 4 * DFL_BINS
        if nc < 1 or (num_classes is not None and nc != num_classes):
            raise LayoutError(f"raw_v8 heads need 64+nc channels; got {c} in {describe(maps)}")
        return Layout("raw_v8", nc, strides=strides, grid_shapes=shapes, map_order=map_order)
    anchor_sets = _anchors_for(len(specs), anchors)
    na = len(anchor_sets[0])
    if c % na:
        raise LayoutError(f"raw heads with {c} channels do not split into {na} anchors: {describe(maps)}")
    nc = c // na - 5
    if nc < 1 or (num_classes is not None and nc != num_classes):
        raise LayoutError(
            f"raw heads {describe(maps)}: {c} channels = {na} anchors x (5 + {nc}) classes, "
            f"but the labels name {num_classes}; check model.anchors / labels")
    return Layout("raw", nc, strides=strides, grid_shapes=shapes,
                  anchors=anchor_sets, map_order=map_order)


def _fitting_stride(h: int, grid: int) -> int | None:
    """The stride (8/16/32/64) that turns input height `h` into `grid` rows; None if none does."""
    for s in (8, 16, 32, 64):
        if grid > 0 and math.ceil(h / s) == grid:
            return s
    return None


def _stride_of(h: int, grid: int, maps) -> int:
    """As `_fitting_stride`, but a grid no stride fits is an error about these `maps`."""
    stride = _fitting_stride(h, grid)
    if stride is None:
        raise LayoutError(f"raw head grid {grid} is not the input height {h} over stride 8/16/32/64: "
                          f"{describe(maps)}")
    return stride


def _anchors_for(levels: int, anchors) -> tuple:
    if anchors is None:
        if levels == 3:
            return YOLOV5_ANCHORS
        if levels == 4:
            return YOLOV5_P6_ANCHORS
        raise LayoutError(f"{levels} raw heads: give model.anchors (one list of w,h pairs per head)")
    sets = []
    for level in anchors:
        flat = [float(v) for v in (level if not isinstance(level[0], (list, tuple)) else
                                   [x for pair in level for x in pair])]
        if len(flat) % 2:
            raise LayoutError(f"anchors {level} must be w,h pairs")
        sets.append(tuple(zip(flat[0::2], flat[1::2])))
    if len(sets) != levels or len({len(s) for s in sets}) != 1:
        raise LayoutError(f"model.anchors gives {len(sets)} levels for {levels} raw heads "
                          f"(each level needs the same number of anchors)")
    return tuple(sets)
