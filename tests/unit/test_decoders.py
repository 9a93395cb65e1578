"""Layout decoders on hand-built tensors, layout recognition, metadata parsing, and the
Postprocessor end to end. Every expected value is worked out in the test from the upstream formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from yoloedge.errors import LayoutError, ModelError
from yoloedge.model.spec import ModelMetadata, TensorSpec, parse_metadata
from yoloedge.postprocess import (Detections, Layout, PostprocessSettings, Postprocessor,
                                  detect_layout, make_decoder)
from yoloedge.preprocess import Geometry

# YOLOv5's default anchors in pixels (models/yolov5s.yaml): P3/8, P4/16, P5/32.
V5_ANCHORS = (((10, 13), (16, 30), (33, 23)),
              ((30, 61), (62, 45), (59, 119)),
              ((116, 90), (156, 198), (373, 326)))


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def xyxy(cx, cy, w, h):
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def check(cands, boxes, scores, classes, atol=1e-4):
    b, s, c = cands
    assert b.dtype == np.float32 and s.dtype == np.float32 and c.dtype == np.int32
    assert b.shape == (len(boxes), 4)
    np.testing.assert_allclose(b, np.asarray(boxes, np.float64).reshape(-1, 4), atol=atol)
    np.testing.assert_allclose(s, scores, atol=atol)
    assert c.tolist() == list(classes)


# --------------------------------------------------------------------------------------------
# v8: [4+nc, N]
# --------------------------------------------------------------------------------------------

def v8_tensor():
    """nc = 3, N = 6 candidates; two pass conf 0.25."""
    out = np.zeros((7, 6), np.float32)
    out[:, 0] = [5, 5, 2, 2, 0.2, 0.1, 0.0]         # below threshold
    out[:, 2] = [100, 50, 20, 10, 0.1, 0.9, 0.2]    # class 1, 0.9
    out[:, 3] = [30, 30, 8, 8, 0.25, 0.0, 0.0]      # exactly at conf: dropped (strict >)
    out[:, 4] = [10, 10, 4, 6, 0.3, 0.05, 0.0]      # class 0, 0.3
    out[:, 5] = [60, 70, 12, 2, 0.0, 0.26, 0.7]     # class 2, 0.7
    return out


def test_v8_decoder():
    dec = make_decoder(Layout("v8", 3))
    expected_boxes = [[90, 45, 110, 55], [8, 7, 12, 13], [54, 69, 66, 71]]
    check(dec([v8_tensor()], 0.25), expected_boxes, [0.9, 0.3, 0.7], [1, 0, 2])
    # a higher threshold keeps only the 0.9 and 0.7 rows
    check(dec([v8_tensor()], 0.5), [expected_boxes[0], expected_boxes[2]], [0.9, 0.7], [1, 2])


def test_v8_decoder_transposed():
    dec = make_decoder(Layout("v8", 3, transposed=True))
    out = np.ascontiguousarray(v8_tensor().T)  # [N, 4+nc]
    check(dec([out], 0.25), [[90, 45, 110, 55], [8, 7, 12, 13], [54, 69, 66, 71]],
          [0.9, 0.3, 0.7], [1, 0, 2])


def test_v8_decoder_nothing_above_threshold():
    b, s, c = make_decoder(Layout("v8", 3))([v8_tensor()], 0.95)
    assert b.shape == (0, 4) and s.shape == (0,) and c.shape == (0,)


def test_v8_single_class_float16():
    out = np.zeros((5, 4), np.float16)
    out[:, 1] = [320, 320, 64, 32, 0.875]
    check(make_decoder(Layout("v8", 1))([out], 0.25), [[288, 304, 352, 336]], [0.875], [0])


# --------------------------------------------------------------------------------------------
# v5: [N, 5+nc], score = obj x cls
# --------------------------------------------------------------------------------------------

def v5_tensor():
    out = np.zeros((5, 7), np.float32)  # nc = 2
    out[0] = [100, 100, 40, 20, 0.8, 0.5, 0.9]   # 0.8*0.9 = 0.72, class 1
    out[1] = [50, 60, 10, 10, 0.9, 0.2, 0.1]     # 0.9*0.2 = 0.18 < 0.25: dropped
    out[2] = [10, 10, 4, 4, 0.2, 1.0, 0.0]       # objectness 0.2 < 0.25: dropped
    out[3] = [200, 120, 30, 60, 0.5, 0.75, 0.5]  # 0.5*0.75 = 0.375, class 0
    out[4] = [0, 0, 1, 1, 0.0, 0.0, 0.0]
    return out


V5_BOXES = [[80, 90, 120, 110], [185, 90, 215, 150]]


def test_v5_decoder():
    check(make_decoder(Layout("v5", 2))([v5_tensor()], 0.25), V5_BOXES, [0.72, 0.375], [1, 0])


def test_v5_decoder_float16():
    out = v5_tensor().astype(np.float16)  # all values above are exact in float16 but 0.9/0.2/0.1
    b, s, c = make_decoder(Layout("v5", 2))([out], 0.25)
    assert s.dtype == np.float32 and b.dtype == np.float32
    np.testing.assert_allclose(b, V5_BOXES, atol=1e-3)
    np.testing.assert_allclose(s, [0.72, 0.375], atol=1e-3)
    assert c.tolist() == [1, 0]


# --------------------------------------------------------------------------------------------
# e2e: [K, 6] x1 y1 x2 y2 score class
# --------------------------------------------------------------------------------------------

def test_e2e_decoder():
    out = np.array([[10, 20, 30, 40, 0.9, 2.0],
                    [0, 0, 5, 5, 0.1, 1.0],       # below threshold
                    [50, 60, 70, 80, 0.6, 7.0000005],
                    [0, 0, 0, 0, 0.0, 0.0]], np.float32)  # padding row
    check(make_decoder(Layout("e2e", 0))([out], 0.25), [[10, 20, 30, 40], [50, 60, 70, 80]],
          [0.9, 0.6], [2, 7])
    assert not Layout("e2e", 0).needs_nms and Layout("v8", 80).needs_nms


# --------------------------------------------------------------------------------------------
# yolox: raw grid [N, 5+nc]; cx = (tx + gx) * s, w = exp(tw) * s
# --------------------------------------------------------------------------------------------

def test_yolox_decoder_grid_positions():
    # Input 64 high x 96 wide, strides 8/16/32 -> grids (h, w) = (8, 12), (4, 6), (2, 3);
    # rows are level by level, row-major (y, then x): N = 96 + 24 + 6 = 126.
    layout = Layout("yolox", 2, strides=(8, 16, 32), grid_shapes=((8, 12), (4, 6), (2, 3)))
    out = np.zeros((126, 7), np.float32)
    # stride 16, gx = 3, gy = 1 -> row 96 + 1*6 + 3 = 105
    out[105] = [0.25, 0.5, math.log(2), 0.0, 0.9, 0.1, 0.8]
    # stride 8, gx = 5, gy = 2 -> row 2*12 + 5 = 29
    out[29] = [0.0, 0.0, 0.0, math.log(3), 0.5, 0.6, 0.2]
    # stride 32, gx = 2, gy = 1 -> row 96 + 24 + 1*3 + 2 = 125 (last row)
    out[125] = [-0.5, 0.25, math.log(0.5), math.log(4), 0.4, 0.0, 1.0]
    cands = make_decoder(layout)([out], 0.25)
    # row 29:  cx = (0+5)*8 = 40, cy = (0+2)*8 = 16, w = 1*8 = 8, h = 3*8 = 24; 0.5*0.6 = 0.3 cls 0
    # row 105: cx = (0.25+3)*16 = 52, cy = (0.5+1)*16 = 24, w = 2*16 = 32, h = 16; 0.72 cls 1
    # row 125: cx = (-0.5+2)*32 = 48, cy = (0.25+1)*32 = 40, w = 16, h = 128; 0.4 cls 1
    check(cands, [xyxy(40, 16, 8, 24), xyxy(52, 24, 32, 16), xyxy(48, 40, 16, 128)],
          [0.3, 0.72, 0.4], [0, 1, 1])


# --------------------------------------------------------------------------------------------
# raw anchor heads: [na*(5+nc), H, W] logits
# --------------------------------------------------------------------------------------------

def raw_anchor_maps():
    """Input 64x96, nc = 2 (no = 7), 3 anchors -> 21 channels; maps [21, gh, gw]."""
    maps = [np.full((21, gh, gw), -10.0, np.float32) for gh, gw in ((8, 12), (4, 6), (2, 3))]
    # stride 16 (anchors (30,61) (62,45) (59,119)), anchor 2 -> channels 14..20; cell gy=2, gx=1
    m = maps[1]
    m[14:21, 2, 1] = [logit(0.75), 0.0, logit(0.25), 0.0, logit(0.9), logit(0.2), logit(0.8)]
    # stride 8, anchor 0 -> channels 0..6; cell gy=5, gx=10
    maps[0][0:7, 5, 10] = [0.0, logit(0.25), 0.0, logit(0.75), logit(0.6), logit(0.7), logit(0.1)]
    return maps


def raw_anchor_expected():
    # stride 8 first (finest level first), anchor (10, 13):
    #   x = (2*0.5 - 0.5 + 10)*8 = 84, y = (2*0.25 - 0.5 + 5)*8 = 40,
    #   w = (2*0.5)^2 * 10 = 10, h = (2*0.75)^2 * 13 = 29.25; score 0.6*0.7 = 0.42 class 0
    # stride 16, anchor (59, 119):
    #   x = (2*0.75 - 0.5 + 1)*16 = 32, y = (2*0.5 - 0.5 + 2)*16 = 40,
    #   w = (2*0.25)^2 * 59 = 14.75, h = (2*0.5)^2 * 119 = 119; score 0.9*0.8 = 0.72 class 1
    boxes = [xyxy(84, 40, 10, 29.25), xyxy(32, 40, 14.75, 119)]
    return boxes, [0.42, 0.72], [0, 1]


def raw_layout(order="chw"):
    return Layout("raw", 2, strides=(8, 16, 32), grid_shapes=((8, 12), (4, 6), (2, 3)),
                  anchors=V5_ANCHORS, map_order=order)


def test_raw_anchor_decoder_chw():
    maps = raw_anchor_maps()
    check(make_decoder(raw_layout())(maps, 0.25), *raw_anchor_expected())


def test_raw_anchor_decoder_any_head_order():
    maps = raw_anchor_maps()
    check(make_decoder(raw_layout())(maps[::-1], 0.25), *raw_anchor_expected())
    check(make_decoder(raw_layout())([maps[1], maps[2], maps[0]], 0.25), *raw_anchor_expected())


def test_raw_anchor_decoder_hwc_and_ahwc():
    maps = raw_anchor_maps()
    hwc = [np.ascontiguousarray(m.transpose(1, 2, 0)) for m in maps]  # [H, W, na*no]
    check(make_decoder(raw_layout("hwc"))(hwc, 0.25), *raw_anchor_expected())
    # [na, H, W, no]: split channels into (na, no), move no last
    ahwc = [np.ascontiguousarray(m.reshape(3, 7, *m.shape[1:]).transpose(0, 2, 3, 1)) for m in maps]
    check(make_decoder(raw_layout("ahwc"))(ahwc, 0.25), *raw_anchor_expected())


def test_raw_anchor_decoder_threshold():
    # conf 0.5: the 0.42 candidate goes
    boxes, scores, classes = raw_anchor_expected()
    check(make_decoder(raw_layout())(raw_anchor_maps(), 0.5), boxes[1:], scores[1:], classes[1:])


# --------------------------------------------------------------------------------------------
# raw_v8 DFL heads: [64+nc, H, W]
# --------------------------------------------------------------------------------------------

def dfl_logits(value: float) -> np.ndarray:
    """16 bin logits whose softmax expectation is `value`: one bin (integer) or two equal
    neighbouring bins (x.5); the other bins at -60 contribute < 1e-25."""
    z = np.full(16, -60.0, np.float32)
    lo = int(math.floor(value))
    if value == lo:
        z[lo] = 0.0
    else:
        assert value - lo == 0.5
        z[lo] = z[lo + 1] = 0.0
    return z


def test_raw_v8_dfl_decoder():
    # Input 64 high x 96 wide: grids (8, 12), (4, 6), (2, 3); nc = 2 -> 66 channels.
    maps = [np.zeros((66, gh, gw), np.float32) for gh, gw in ((8, 12), (4, 6), (2, 3))]
    for m in maps:
        m[64:] = -10.0  # class logits: nothing
    # stride 32, cell gy=1, gx=2 -> anchor point (2.5, 1.5); distances l=1, t=2.5, r=4, b=0.5
    maps[2][0:64, 1, 2] = np.concatenate([dfl_logits(v) for v in (1, 2.5, 4, 0.5)])
    maps[2][64:, 1, 2] = [logit(0.3), logit(0.85)]
    # stride 8, cell gy=3, gx=10 -> point (10.5, 3.5); l=0, t=15, r=7.5, b=3
    maps[0][0:64, 3, 10] = np.concatenate([dfl_logits(v) for v in (0, 15, 7.5, 3)])
    maps[0][64:, 3, 10] = [logit(0.6), logit(0.1)]
    layout = Layout("raw_v8", 2, strides=(8, 16, 32), grid_shapes=((8, 12), (4, 6), (2, 3)))
    cands = make_decoder(layout)(maps, 0.25)
    # stride 8:  [(10.5-0)*8, (3.5-15)*8, (10.5+7.5)*8, (3.5+3)*8] = [84, -92, 144, 52], 0.6 cls 0
    # stride 32: [(2.5-1)*32, (1.5-2.5)*32, (2.5+4)*32, (1.5+0.5)*32] = [48, -32, 208, 64], 0.85 cls 1
    check(cands, [[84, -92, 144, 52], [48, -32, 208, 64]], [0.6, 0.85], [0, 1], atol=1e-3)
    # hwc maps give the same
    hwc = [np.ascontiguousarray(m.transpose(1, 2, 0)) for m in maps]
    layout_hwc = Layout("raw_v8", 2, strides=(8, 16, 32), grid_shapes=((8, 12), (4, 6), (2, 3)),
                        map_order="hwc")
    check(make_decoder(layout_hwc)(hwc[::-1], 0.25), [[84, -92, 144, 52], [48, -32, 208, 64]],
          [0.6, 0.85], [0, 1], atol=1e-3)
    # threshold 0.7 drops the 0.6 candidate
    check(make_decoder(layout)(maps, 0.7), [[48, -32, 208, 64]], [0.85], [1], atol=1e-3)


def test_raw_v8_dfl_soft_distribution():
    # A genuinely soft distribution: logits [0, ln 3] on bins 4 and 5 -> p = 1/4, 3/4 -> 4.75.
    m = np.zeros((65, 2, 3), np.float32)  # input 64x96 at stride 32 only, nc = 1
    m[64] = -10
    for side in range(4):
        z = np.full(16, -60.0, np.float32)
        z[4], z[5] = 0.0, math.log(3)
        m[side * 16:(side + 1) * 16, 0, 0] = z
    m[64, 0, 0] = logit(0.5)
    layout = Layout("raw_v8", 1, strides=(32,), grid_shapes=((2, 3),))
    # point (0.5, 0.5): [0.5-4.75, 0.5-4.75, 0.5+4.75, 0.5+4.75] * 32
    check(make_decoder(layout)([m], 0.25), [[-136, -136, 168, 168]], [0.5], [0], atol=1e-3)


# --------------------------------------------------------------------------------------------
# detect_layout
# --------------------------------------------------------------------------------------------

NO_META = ModelMetadata()
ULTRA_META = ModelMetadata(raw={"task": "detect", "imgsz": "[640, 640]"})


def spec(*shape, name="output0"):
    return TensorSpec(name, tuple(shape), np.dtype(np.float32))


def test_detect_v8():
    lay = detect_layout([spec(1, 84, 8400)], (640, 640), NO_META)
    assert (lay.format, lay.num_classes, lay.transposed) == ("v8", 80, False)


def test_detect_v8_transposed_with_ultralytics_metadata():
    # 8400 = 80^2 + 40^2 + 20^2 rows of 84: v8 transposed for an Ultralytics export
    lay = detect_layout([spec(1, 8400, 84)], (640, 640), ULTRA_META)
    assert (lay.format, lay.num_classes, lay.transposed) == ("v8", 80, True)
    # and when the labels say 80 classes, without metadata
    lay = detect_layout([spec(1, 8400, 84)], (640, 640), NO_META, num_classes=80)
    assert (lay.format, lay.num_classes, lay.transposed) == ("v8", 80, True)


def test_detect_v5():
    # 25200 = 3 * (80^2 + 40^2 + 20^2)
    lay = detect_layout([spec(1, 25200, 85)], (640, 640), NO_META)
    assert (lay.format, lay.num_classes) == ("v5", 80)
    # P6 model at 1280: 3 * (160^2 + 80^2 + 40^2 + 20^2) = 102000
    lay = detect_layout([spec(1, 102000, 85)], (1280, 1280), NO_META)
    assert (lay.format, lay.num_classes) == ("v5", 80)


def test_detect_yolox_at_416():
    # 52^2 + 26^2 + 13^2 = 2704 + 676 + 169 = 3549
    lay = detect_layout([spec(1, 3549, 85)], (416, 416), NO_META)
    assert (lay.format, lay.num_classes) == ("yolox", 80)
    assert lay.strides == (8, 16, 32)
    assert lay.grid_shapes == ((52, 52), (26, 26), (13, 13))


def test_detect_yolox_non_square():
    # 384 high x 640 wide: (48, 80), (24, 40), (12, 20) -> 3840 + 960 + 240 = 5040
    lay = detect_layout([spec(1, 5040, 85)], (384, 640), NO_META)
    assert lay.format == "yolox"
    assert lay.grid_shapes == ((48, 80), (24, 40), (12, 20))


def test_detect_e2e():
    lay = detect_layout([spec(1, 300, 6)], (640, 640), NO_META)
    assert lay.format == "e2e" and not lay.needs_nms
    lay = detect_layout([spec(1, 300, 6)], (640, 640), ModelMetadata(end2end=True), num_classes=80)
    assert lay.format == "e2e"


def test_detect_single_class_v8():
    lay = detect_layout([spec(1, 5, 8400)], (640, 640), NO_META)
    assert (lay.format, lay.num_classes, lay.transposed) == ("v8", 1, False)


def test_detect_raw_anchor_maps():
    outs = [spec(1, 255, 20, 20, name="p5"), spec(1, 255, 80, 80, name="p3"),
            spec(1, 255, 40, 40, name="p4")]
    lay = detect_layout(outs, (640, 640), NO_META)
    assert (lay.format, lay.num_classes, lay.map_order) == ("raw", 80, "chw")
    assert lay.strides == (8, 16, 32)
    assert lay.grid_shapes == ((80, 80), (40, 40), (20, 20))
    assert tuple(tuple(tuple(a) for a in lvl) for lvl in lay.anchors) == V5_ANCHORS


def test_detect_raw_anchor_maps_5d():
    outs = [spec(1, 3, g, g, 85) for g in (80, 40, 20)]
    lay = detect_layout(outs, (640, 640), NO_META)
    assert (lay.format, lay.num_classes, lay.map_order) == ("raw", 80, "ahwc")


@pytest.mark.parametrize("hw", [(640, 640), (384, 640)])
def test_detect_raw_anchor_maps_channels_last(hw):
    h, w = hw
    outs = [spec(1, math.ceil(h / s), math.ceil(w / s), 255) for s in (8, 16, 32)]
    lay = detect_layout(outs, hw, NO_META)
    assert (lay.format, lay.num_classes, lay.map_order) == ("raw", 80, "hwc")
    assert lay.grid_shapes == tuple((math.ceil(h / s), math.ceil(w / s)) for s in (8, 16, 32))


def test_detect_raw_v8_maps():
    # 64 + 80 = 144 channels; 144 is also 3 x (5 + 43), so the class count settles it.
    outs = [spec(1, 144, g, g) for g in (80, 40, 20)]
    lay = detect_layout(outs, (640, 640), NO_META, num_classes=80)
    assert (lay.format, lay.num_classes) == ("raw_v8", 80)
    # 64 + 1 = 65 channels does not split into 3 anchors: DFL without labels
    outs = [spec(1, 65, g, g) for g in (80, 40, 20)]
    lay = detect_layout(outs, (640, 640), NO_META)
    assert (lay.format, lay.num_classes) == ("raw_v8", 1)


def test_forced_format_that_does_not_fit():
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(1, 25200, 85)], (640, 640), NO_META, format="yolox")
    assert "[1, 25200, 85]" in str(e.value) and "yolox" in str(e.value)
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(1, 84, 8400)], (640, 640), NO_META, format="raw")
    assert "[1, 84, 8400]" in str(e.value)
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(1, 8400, 4)], (640, 640), NO_META, format="v5")
    assert "[1, 8400, 4]" in str(e.value)
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(1, 84, 8400)], (640, 640), NO_META, num_classes=20, format="v8")
    assert "[1, 84, 8400]" in str(e.value) and "20" in str(e.value)
    with pytest.raises(LayoutError):
        detect_layout([spec(1, 84, 8400)], (640, 640), NO_META, format="v9")


def test_forced_format_that_fits():
    lay = detect_layout([spec(1, 25200, 85)], (640, 640), NO_META, format="v5")
    assert (lay.format, lay.num_classes) == ("v5", 80)
    lay = detect_layout([spec(1, 8400, 85)], (640, 640), NO_META, format="yolox")
    assert lay.format == "yolox" and lay.grid_shapes == ((80, 80), (40, 40), (20, 20))


@pytest.mark.parametrize("shape", [(1, 8400), (1, 3, 4), (1, 2, 3, 4)])
def test_unrecognisable_output(shape):
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(*shape)], (640, 640), NO_META)
    assert str(list(shape)) in str(e.value)


def test_labels_that_fit_no_layout():
    with pytest.raises(LayoutError) as e:
        detect_layout([spec(1, 84, 8400)], (640, 640), NO_META, num_classes=20)
    assert "[1, 84, 8400]" in str(e.value)


def test_no_outputs():
    with pytest.raises(LayoutError):
        detect_layout([], (640, 640), NO_META)


# --------------------------------------------------------------------------------------------
# parse_metadata
# --------------------------------------------------------------------------------------------

def test_parse_ultralytics_metadata():
    md = parse_metadata({
        "names": "{0: 'person', 1: 'bicycle'}",
        "imgsz": "[640, 640]",
        "end2end": "True",
        "stride": "32",
        "task": "detect",
        "channels": "3",
        "author": "Ultralytics",
    })
    assert md.names == ["person", "bicycle"]
    assert md.imgsz == (640, 640)
    assert md.end2end is True
    assert md.stride == 32
    assert md.task == "detect"
    assert md.channels == 3
    assert md.is_ultralytics


def test_parse_metadata_variants():
    md = parse_metadata({"imgsz": "[384, 640]", "end2end": "False", "names": "['a', 'b', 'c']"})
    assert md.imgsz == (384, 640)  # (h, w) as stored
    assert md.end2end is False
    assert md.names == ["a", "b", "c"]
    assert parse_metadata({"imgsz": "320"}).imgsz == (320, 320)
    # sparse names: holes get placeholders
    assert parse_metadata({"names": "{0: 'a', 2: 'c'}"}).names == ["a", "class1", "c"]
    # YOLOX/other exports: nothing known, not Ultralytics
    md = parse_metadata({})
    assert (md.names, md.imgsz, md.stride, md.end2end, md.task) == (None, None, None, None, None)
    assert not md.is_ultralytics
    # garbage is a model error naming the key (tests/test_config_hardening.py has the full table)
    for key in ("names", "imgsz", "end2end"):
        with pytest.raises(ModelError, match=f"m.onnx: bad model metadata {key} = "):
            parse_metadata({key: "not a literal {"}, "m.onnx")


# --------------------------------------------------------------------------------------------
# Postprocessor end to end (v8)
# --------------------------------------------------------------------------------------------

# Source 128 wide x 64 high letterboxed into 64x64: r = 0.5 -> 64x32, left 0, top = round(15.9) = 16.
GEO = Geometry(128, 64, 64, 32, 0, 16)


def pp_tensor():
    """nc = 3; candidates in model-input pixels (cx, cy, w, h, scores...)."""
    cols = [
        (20, 30, 10, 10, (0.9, 0.0, 0.0)),   # A: class 0, 0.9
        (21, 30, 10, 10, (0.8, 0.0, 0.0)),   # B: class 0, IoU(A) = 90/110 = 0.82 -> suppressed
        (21, 31, 10, 10, (0.0, 0.7, 0.0)),   # C: class 1, IoU(A) = 81/119 = 0.68
        (50, 40, 8, 8, (0.0, 0.0, 0.4)),     # D: class 2, 0.4
        (10, 44, 6, 6, (0.0, 0.0, 0.2)),     # E: class 2, 0.2 (below the global 0.25)
        (62, 20, 8, 8, (0.0, 0.5, 0.0)),     # F: class 1, 0.5, sticks out right of the image
    ]
    out = np.zeros((7, len(cols)), np.float32)
    for i, (cx, cy, w, h, s) in enumerate(cols):
        out[:, i] = [cx, cy, w, h, *s]
    return out


def to_source(b):
    # x / 0.5, (y - 16) / 0.5, clipped to 128 x 64
    x1, y1, x2, y2 = b
    return [min(max(x1 * 2, 0), 128), min(max((y1 - 16) * 2, 0), 64),
            min(max(x2 * 2, 0), 128), min(max((y2 - 16) * 2, 0), 64)]


A = to_source([15, 25, 25, 35])    # [30, 18, 50, 38]
C = to_source([16, 26, 26, 36])    # [32, 20, 52, 40]
D = to_source([46, 36, 54, 44])    # [92, 40, 108, 56]
E = to_source([7, 41, 13, 47])     # [14, 50, 26, 62]
F = to_source([58, 16, 66, 24])    # [116, 0, 128, 16] (x2 = 132 clipped)


def run_pp(**settings) -> Detections:
    pp = Postprocessor(make_decoder(Layout("v8", 3)), PostprocessSettings(**settings))
    return pp([pp_tensor()], GEO)


def assert_dets(d: Detections, boxes, scores, classes):
    assert isinstance(d, Detections)
    assert (d.width, d.height) == (128, 64)
    assert d.boxes.dtype == np.float32
    np.testing.assert_allclose(d.boxes, np.asarray(boxes, np.float64).reshape(-1, 4), atol=1e-4)
    np.testing.assert_allclose(d.scores, scores, atol=1e-6)
    assert d.class_ids.tolist() == list(classes)


def test_postprocessor_class_aware_default():
    assert A == [30, 18, 50, 38] and F == [116, 0, 128, 16]
    assert_dets(run_pp(), [A, C, F, D], [0.9, 0.7, 0.5, 0.4], [0, 1, 1, 2])


def test_postprocessor_agnostic():
    assert_dets(run_pp(agnostic_nms=True), [A, F, D], [0.9, 0.5, 0.4], [0, 1, 2])


def test_postprocessor_class_filter():
    assert_dets(run_pp(classes=frozenset({2})), [D], [0.4], [2])
    assert_dets(run_pp(classes=frozenset({0, 1})), [A, C, F], [0.9, 0.7, 0.5], [0, 1, 1])
    assert len(run_pp(classes=frozenset({5}))) == 0


def test_postprocessor_per_class_thresholds():
    # class 2 needs 0.5: D (0.4) goes
    assert_dets(run_pp(class_conf={2: 0.5}), [A, C, F], [0.9, 0.7, 0.5], [0, 1, 1])
    # class 2 only needs 0.1: E (0.2) comes in although the global threshold is 0.25
    assert_dets(run_pp(class_conf={2: 0.1}), [A, C, F, D, E], [0.9, 0.7, 0.5, 0.4, 0.2],
                [0, 1, 1, 2, 2])
    # class 1 needs 0.6: F (0.5) goes, C (0.7) stays
    assert_dets(run_pp(class_conf={1: 0.6}), [A, C, D], [0.9, 0.7, 0.4], [0, 1, 2])
    # combined with a class filter
    assert_dets(run_pp(class_conf={2: 0.1}, classes=frozenset({2})), [D, E], [0.4, 0.2], [2, 2])


def test_postprocessor_max_det():
    assert_dets(run_pp(max_det=2), [A, C], [0.9, 0.7], [0, 1])
    assert_dets(run_pp(max_det=1), [A], [0.9], [0])


def test_postprocessor_iou_threshold():
    # iou 0.85 keeps B (IoU 0.82) too
    B = to_source([16, 25, 26, 35])
    assert_dets(run_pp(iou=0.85), [A, B, C, F, D], [0.9, 0.8, 0.7, 0.5, 0.4], [0, 0, 1, 1, 2])


def test_postprocessor_no_clip():
    # F's x2 = 66 in the input -> 132 in the source, past the 128-pixel edge
    d = run_pp(clip=False, classes=frozenset({1}))
    np.testing.assert_allclose(d.boxes, [C, [116, 0, 132, 16]], atol=1e-4)


def test_postprocessor_nothing_found():
    d = run_pp(conf=0.95)
    assert len(d) == 0 and d.boxes.shape == (0, 4) and (d.width, d.height) == (128, 64)


def test_postprocessor_e2e_sorts_without_nms():
    out = np.array([[0, 16, 10, 26, 0.5, 1], [0, 16, 10, 26, 0.9, 1], [20, 30, 30, 40, 0.7, 0]],
                   np.float32)
    pp = Postprocessor(make_decoder(Layout("e2e", 2)), PostprocessSettings())
    d = pp([out], GEO)
    # identical boxes both stay (the model already did NMS), ordered by score
    assert_dets(d, [[0, 0, 20, 20], [40, 28, 60, 48], [0, 0, 20, 20]], [0.9, 0.7, 0.5], [1, 0, 1])


def test_detections_to_dicts():
    d = run_pp(max_det=2)
    rows = d.to_dicts(["person", "bicycle", "car"])
    assert rows[0] == {"label": "person", "class_id": 0, "score": 0.9, "box": [30.0, 18.0, 50.0, 38.0]}
    assert rows[1]["label"] == "bicycle"
    assert d.to_dicts([])[0]["label"] == "class0"


def test_ultralytics_dynamic_export_with_open_anchor_axis_is_v8():
    """`yolo export dynamic=True` gives output0 [-1, 4+nc, -1]; 9 channels = 4 + 5 classes."""
    from yoloedge.model.spec import ModelMetadata, TensorSpec
    from yoloedge.postprocess.layouts import detect_layout

    out = TensorSpec("output0", (-1, 9, -1), np.dtype(np.float32))
    layout = detect_layout([out], (320, 320), ModelMetadata(names=["a", "b", "c", "d", "e"]), num_classes=5)
    assert layout.format == "v8" and layout.num_classes == 5 and not layout.transposed
