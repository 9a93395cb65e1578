"""The DVPP media engine: its pure arithmetic (no pyACL), then the engine against the fake
`acl.media` in tests/fakes/acl (skipped where that fake has no media module)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from yoloedge.backends import dvpp_limits as lim
from yoloedge.preprocess.letterbox import compute_geometry


# -- geometry on VPC's grid (no pyACL) --------------------------------------------------------------
def _on_grid(p: lim.VpcPaste, dst_w: int, dst_h: int) -> None:
    assert p.left % 16 == 0 and p.top % 2 == 0
    assert p.new_w % 2 == 0 and p.new_h % 2 == 0
    assert p.src_w % 2 == 0 and p.src_h % 2 == 0
    assert 0 <= p.left and p.left + p.new_w <= dst_w
    assert 0 <= p.top and p.top + p.new_h <= dst_h
    left, right, top, bottom = p.paste
    assert right % 2 == 1 and bottom % 2 == 1 and right - left + 1 == p.new_w and bottom - top + 1 == p.new_h
    c_left, c_right, c_top, c_bottom = p.crop
    assert (c_left, c_top) == (0, 0) and c_right == p.src_w - 1 and c_bottom == p.src_h - 1


@pytest.mark.parametrize("src", [(1280, 720), (810, 1080), (1920, 1080), (640, 480)])
def test_common_sizes_match_ultralytics_exactly(src):
    """Sizes whose Ultralytics letterbox already lies on VPC's grid keep it unchanged."""
    p = lim.vpc_letterbox(*src, 640, 640)
    geo = compute_geometry(*src, 640, 640)
    assert p.geometry() == geo
    _on_grid(p, 640, 640)


def test_odd_offsets_move_onto_the_grid():
    # 1000x562 into 640x640: Ultralytics 640x360 at top 140; 562 -> r 0.64, new_h 359.68 -> 360
    p = lim.vpc_letterbox(1000, 563, 640, 640)
    _on_grid(p, 640, 640)
    # a portrait 500x1000 into 416x416: new 208x416, Ultralytics left 104 -> VPC 96 or 112
    p = lim.vpc_letterbox(500, 1000, 416, 416)
    ultra = compute_geometry(500, 1000, 416, 416)
    assert ultra.left == 104
    assert p.left in (96, 112) and p.new_w == 208 and p.top == 0
    _on_grid(p, 416, 416)


def test_odd_source_is_cropped_to_even_and_the_geometry_says_so():
    p = lim.vpc_letterbox(1281, 721, 640, 640)
    assert (p.src_w, p.src_h) == (1280, 720)
    geo = p.geometry()
    assert geo.src_w == 1280 and geo.scale_x == p.new_w / 1280
    _on_grid(p, 640, 640)


@pytest.mark.parametrize("w,h", [(w, h) for w in (130, 333, 641, 999, 1920, 2592, 3840)
                                 for h in (128, 241, 480, 1079, 1944, 2160)])
def test_every_size_lands_on_the_grid_near_ultralytics(w, h):
    p = lim.vpc_letterbox(w, h, 640, 384)
    _on_grid(p, 640, 384)
    ultra = compute_geometry(w & ~1, h & ~1, 640, 384)
    assert abs(p.new_w - ultra.new_w) <= 1 and abs(p.new_h - ultra.new_h) <= 1
    assert abs(p.left - ultra.left) <= 8 and abs(p.top - ultra.top) <= 1


def test_boxes_map_back_with_the_geometry_vpc_used():
    p = lim.vpc_letterbox(500, 1000, 416, 416)
    geo = p.geometry()
    box = np.array([[p.left, p.top, p.left + p.new_w, p.top + p.new_h]], np.float64)
    back = geo.boxes_to_source(box.copy())
    np.testing.assert_allclose(back, [[0, 0, 500, 1000]])


def test_scale_limits_and_canvas_rules():
    with pytest.raises(ValueError, match="1/32 to 16"):
        lim.vpc_letterbox(8192, 100, 128, 128)  # width / 64
    with pytest.raises(ValueError, match="1/32 to 16"):
        lim.vpc_letterbox(4, 4, 640, 640)  # x 160
    with pytest.raises(ValueError, match="multiple of 16"):
        lim.vpc_letterbox(1280, 720, 650, 640)
    with pytest.raises(ValueError, match="multiple of 16"):
        lim.canvas_size(640, 641)
    assert lim.canvas_size(640, 640) == 640 * 640 * 3 // 2


def test_strides():
    assert lim.vdec_strides(1920, 1080) == (1920, 1080)
    assert lim.vdec_strides(1281, 721) == (1296, 722)
    assert lim.jpegd_strides(810, 1080, "Ascend310P3") == (832, 1088)
    assert lim.jpegd_strides(810, 1080, "Ascend310") == (896, 1088)
    assert lim.jpegd_strides(810, 1080, None) == (896, 1088)
    assert lim.nv12_size(1920, 1080) == 1920 * 1080 * 3 // 2


def test_limits_table():
    assert lim.limits_for("Ascend310P3").vdec_channels == 256
    assert lim.limits_for("Ascend310P1") is lim.DVPP_LIMITS["Ascend310P3"]
    assert lim.limits_for("Ascend910B") is lim.DEFAULT_LIMITS
    assert lim.limits_for(None).budget_note()  # every figure is marked unconfirmed


@pytest.mark.parametrize("args,why", [
    (("h264", "High", "yuv420p", 1920, 1080), None),
    (("h264", "Constrained Baseline", "yuvj420p", 640, 480), None),
    (("hevc", "Main", "yuv420p", 3840, 2160), None),
    (("h265", None, None, None, None), None),
    (("mjpeg", None, "yuvj422p", 1280, 720), "H.264 and H.265 only"),
    (("mpeg4", "Simple Profile", "yuv420p", 640, 480), "H.264 and H.265 only"),
    (("h264", "High 4:2:2", "yuv422p", 1920, 1080), "High 4:2:2"),
    (("h264", "High 10", "yuv420p10le", 1920, 1080), "High 10"),
    (("hevc", "Main 10", "yuv420p10le", 1920, 1080), "Main 10"),
    (("h264", "High", "yuv444p", 1920, 1080), "yuv444p"),
    (("h264", "High", "yuv420p", 8192, 4320), "larger than"),
    (("h264", "Main", "yuv420p", 96, 96), "smaller than"),
])
def test_dvpp_unsupported(args, why):
    got = lim.dvpp_unsupported(*args)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got


def test_entype():
    assert lim.vdec_entype("hevc") == lim.H265_MAIN_LEVEL
    assert lim.vdec_entype("h264", "Baseline") == lim.H264_BASELINE_LEVEL
    assert lim.vdec_entype("h264", "Main") == lim.H264_MAIN_LEVEL
    assert lim.vdec_entype("avc1", None) == lim.H264_HIGH_LEVEL
    with pytest.raises(ValueError):
        lim.vdec_entype("vp9")


def test_limits_module_imports_no_acl_and_no_opencv():
    import subprocess
    code = ("import sys; import yoloedge.backends.dvpp_limits as m; "
            "m.vpc_letterbox(1280, 720, 640, 640); "
            "print('acl' in sys.modules, 'cv2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["False", "False"]
