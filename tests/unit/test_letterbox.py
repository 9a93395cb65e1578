"""Letterbox geometry (Ultralytics "center" and YOLOX "topleft" rules) and the pixels it writes.

Every expected number below is worked out by hand from the documented upstream rules:

* center (Ultralytics / YOLOv5): r = min(H/h, W/w); new = int(round(w*r)) with Python's round
  (ties to even); dw = W - new_w; left = round(dw/2 - 0.1), right = dw - left (gets the odd pixel);
  same for top/bottom.
* topleft (YOLOX): new = int(w*r) (truncated); image at (0, 0), all padding right/bottom.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from yoloedge.preprocess import Geometry, Letterboxer, LetterboxStyle, Resizer, compute_geometry

CENTER = LetterboxStyle()
TOPLEFT = LetterboxStyle(placement="topleft", rgb=False, normalize=False)
PAD = 114
PAD_F = 114 / 255


def geo_tuple(g: Geometry) -> tuple[int, int, int, int]:
    return g.new_w, g.new_h, g.left, g.top


# --------------------------------------------------------------------------------------------
# compute_geometry
# --------------------------------------------------------------------------------------------

# (src_w, src_h, dst_w, dst_h) -> (new_w, new_h, left, top), "center" rule, derivation inline.
CENTER_CASES = [
    # portrait 810x1080: r = 640/1080; 810*r = 480.0 -> 480; dw = 160 -> left = round(79.9) = 80
    ((810, 1080, 640, 640), (480, 640, 80, 0)),
    # landscape 1280x720: r = 0.5 -> 640x360; dh = 280 -> top = round(139.9) = 140
    ((1280, 720, 640, 640), (640, 360, 0, 140)),
    # odd 811x1079: r = 640/1079; 811*r = 519040/1079 = 481.038 -> 481; dw = 159 (odd)
    # -> left = round(79.5 - 0.1) = 79, right gets 80
    ((811, 1079, 640, 640), (481, 640, 79, 0)),
    # 1280x722: 722*0.5 = 361 -> dh = 279 (odd) -> top = round(139.4) = 139, bottom 140
    ((1280, 722, 640, 640), (640, 361, 0, 139)),
    # and transposed: the odd pixel goes to the right
    ((722, 1280, 640, 640), (361, 640, 139, 0)),
    # 1280x721: 721*0.5 = 360.5 exactly; Python's round goes to even -> 360, top = round(139.9)
    ((1280, 721, 640, 640), (640, 360, 0, 140)),
    # tiny 1x1: r = 640 -> fills the whole input
    ((1, 1, 640, 640), (640, 640, 0, 0)),
    # tiny 3x2: r = 640/3 = 213.33; h: 2*213.33 = 426.67 -> 427; dh = 213 -> top = round(106.4) = 106
    ((3, 2, 640, 640), (640, 427, 0, 106)),
    # 4K 3840x2160: r = 1/6 -> 640x360, top 140
    ((3840, 2160, 640, 640), (640, 360, 0, 140)),
    # exact size: r = 1, nothing to do
    ((640, 640, 640, 640), (640, 640, 0, 0)),
    # upscaling 320x240: r = 2 -> 640x480, dh = 160 -> top = round(79.9) = 80
    ((320, 240, 640, 640), (640, 480, 0, 80)),
    # upscaling 100x50: r = 6.4 -> 640x320, top = round(159.9) = 160
    ((100, 50, 640, 640), (640, 320, 0, 160)),
    # 97x131: r = 640/131 = 4.8855; 97*r = 473.89 -> 474; dw = 166 -> left = round(82.9) = 83
    ((97, 131, 640, 640), (474, 640, 83, 0)),
    # non-square input 640 wide x 384 high, 1280x720 frame: r = min(384/720, 640/1280) = 0.5
    # -> 640x360, dh = 24 -> top = round(11.9) = 12
    ((1280, 720, 640, 384), (640, 360, 0, 12)),
]


@pytest.mark.parametrize("args, expected", CENTER_CASES)
def test_center_geometry(args, expected):
    src_w, src_h, dst_w, dst_h = args
    g = compute_geometry(src_w, src_h, dst_w, dst_h, CENTER)
    assert geo_tuple(g) == expected
    assert (g.src_w, g.src_h) == (src_w, src_h)


# topleft (YOLOX): truncate, no offset.
TOPLEFT_CASES = [
    # 3x2: 2*213.33 = 426.67 -> int 426 (rounding would give 427)
    ((3, 2, 640, 640), (640, 426)),
    ((2, 3, 640, 640), (426, 640)),
    # 97x131: 473.89 -> 473 (rounding would give 474)
    ((97, 131, 640, 640), (473, 640)),
    # 811x1079: 481.04 -> 481 either way
    ((811, 1079, 640, 640), (481, 640)),
    ((1280, 720, 640, 640), (640, 360)),
    ((3840, 2160, 640, 640), (640, 360)),
    ((640, 640, 640, 640), (640, 640)),
    ((100, 50, 640, 640), (640, 320)),
    ((1280, 720, 416, 416), (416, 234)),  # r = 0.325: 720*0.325 = 234.0
]


@pytest.mark.parametrize("args, expected", TOPLEFT_CASES)
def test_topleft_geometry_truncates(args, expected):
    src_w, src_h, dst_w, dst_h = args
    g = compute_geometry(src_w, src_h, dst_w, dst_h, LetterboxStyle(placement="topleft"))
    assert geo_tuple(g) == (*expected, 0, 0)


def test_truncation_and_rounding_differ():
    # 97x131 -> 640: 97 * 640/131 = 473.89; YOLOX truncates to 473, Ultralytics rounds to 474.
    c = compute_geometry(97, 131, 640, 640, LetterboxStyle(placement="center"))
    t = compute_geometry(97, 131, 640, 640, LetterboxStyle(placement="topleft"))
    assert (c.new_w, t.new_w) == (474, 473)
    assert (c.left, t.left) == (83, 0)


@pytest.mark.parametrize("w, h", [(0, 10), (10, 0), (-1, 5)])
def test_geometry_rejects_empty_frames(w, h):
    with pytest.raises(ValueError):
        compute_geometry(w, h, 640, 640)


def test_geometry_invariants_sweep():
    # For many sizes: the image fits, padding adds up, the odd pixel never goes left/top, and
    # the aspect ratio is preserved to within the rounding of one side.
    rng = np.random.default_rng(0)
    for w, h in rng.integers(1, 5000, size=(300, 2)):
        w, h = int(w), int(h)
        for dst_w, dst_h in ((640, 640), (640, 384), (320, 320)):
            g = compute_geometry(w, h, dst_w, dst_h, CENTER)
            assert 1 <= g.new_w <= dst_w and 1 <= g.new_h <= dst_h
            assert g.new_w == dst_w or g.new_h == dst_h  # one side touches the border
            right = dst_w - g.new_w - g.left
            bottom = dst_h - g.new_h - g.top
            assert right - g.left in (0, 1), (w, h, g)
            assert bottom - g.top in (0, 1), (w, h, g)
            r = min(dst_w / w, dst_h / h)
            assert abs(g.new_w - w * r) <= 0.5 + 1e-9 and abs(g.new_h - h * r) <= 0.5 + 1e-9
            t = compute_geometry(w, h, dst_w, dst_h, LetterboxStyle(placement="topleft"))
            assert 0 <= w * r - t.new_w < 1 + 1e-9 or t.new_w == 1
            assert (t.left, t.top) == (0, 0)


# --------------------------------------------------------------------------------------------
# Letterboxer pixels
# --------------------------------------------------------------------------------------------

def bgr_frame(h: int, w: int, b: int, g: int, r: int) -> np.ndarray:
    f = np.empty((h, w, 3), np.uint8)
    f[..., 0], f[..., 1], f[..., 2] = b, g, r
    return f


def test_nchw_rgb_normalised_and_padded():
    # 200 wide x 100 high into 64x64: r = 0.32 -> 64x32, top = round(15.9) = 16, bottom 16.
    lb = Letterboxer(64, 64)
    slot = np.full((3, 64, 64), -1.0, np.float32)
    geo = lb(bgr_frame(100, 200, 10, 20, 30), slot)
    assert geo_tuple(geo) == (64, 32, 0, 16)
    img = slot[:, 16:48, :]
    np.testing.assert_allclose(img[0], 30 / 255, atol=1e-6)  # R first
    np.testing.assert_allclose(img[1], 20 / 255, atol=1e-6)
    np.testing.assert_allclose(img[2], 10 / 255, atol=1e-6)  # B last
    np.testing.assert_allclose(slot[:, :16, :], PAD_F, atol=1e-6)
    np.testing.assert_allclose(slot[:, 48:, :], PAD_F, atol=1e-6)


def test_nchw_float16_slot():
    lb = Letterboxer(64, 64)
    slot = np.zeros((3, 64, 64), np.float16)
    lb(bgr_frame(100, 200, 10, 20, 200), slot)
    assert slot.dtype == np.float16
    np.testing.assert_allclose(slot[0, 16:48].astype(np.float32), 200 / 255, atol=1e-3)
    np.testing.assert_allclose(slot[2, 16:48].astype(np.float32), 10 / 255, atol=1e-3)
    np.testing.assert_allclose(slot[:, :16].astype(np.float32), PAD_F, atol=1e-3)


def test_slot_inside_a_batch_buffer():
    # Slots are views of one preallocated batch; writing slot 1 must leave slot 0 alone.
    lb = Letterboxer(32, 32)
    batch = np.zeros((2, 3, 32, 32), np.float32)
    lb(bgr_frame(32, 32, 0, 0, 255), batch[1])
    assert not batch[0].any()
    np.testing.assert_allclose(batch[1, 0], 1.0, atol=1e-6)
    np.testing.assert_allclose(batch[1, 1:], 0.0, atol=1e-6)


def test_topleft_bgr_unnormalised():
    # YOLOX: BGR, 0..255, image at the top-left. 200x100 -> 64x32 at (0, 0), pad rows 32..63.
    lb = Letterboxer(64, 64, style=TOPLEFT)
    slot = np.zeros((3, 64, 64), np.float32)
    geo = lb(bgr_frame(100, 200, 10, 20, 30), slot)
    assert geo_tuple(geo) == (64, 32, 0, 0)
    np.testing.assert_array_equal(slot[0, :32], 10.0)  # B first
    np.testing.assert_array_equal(slot[1, :32], 20.0)
    np.testing.assert_array_equal(slot[2, :32], 30.0)
    np.testing.assert_array_equal(slot[:, 32:], 114.0)


def test_topleft_portrait_pads_right():
    # 100 wide x 200 high -> 32x64 at the left; columns 32..63 are padding.
    lb = Letterboxer(64, 64, style=TOPLEFT)
    slot = np.zeros((3, 64, 64), np.float32)
    lb(bgr_frame(200, 100, 1, 2, 3), slot)
    np.testing.assert_array_equal(slot[:, :, :32], np.array([1, 2, 3], np.float32)[:, None, None]
                                  * np.ones((3, 64, 32), np.float32))
    np.testing.assert_array_equal(slot[:, :, 32:], 114.0)


@pytest.mark.parametrize("shape", [(100, 200), (100, 200, 1)])
def test_grayscale_frames(shape):
    lb = Letterboxer(64, 64)
    slot = np.zeros((3, 64, 64), np.float32)
    geo = lb(np.full(shape, 77, np.uint8), slot)
    assert geo_tuple(geo) == (64, 32, 0, 16)
    np.testing.assert_allclose(slot[:, 16:48], 77 / 255, atol=1e-6)
    np.testing.assert_allclose(slot[:, :16], PAD_F, atol=1e-6)


def test_bgra_frame_drops_alpha():
    lb = Letterboxer(64, 64)
    slot = np.zeros((3, 64, 64), np.float32)
    frame = np.empty((100, 200, 4), np.uint8)
    frame[...] = (10, 20, 30, 0)  # B G R A, alpha 0 must not matter
    lb(frame, slot)
    np.testing.assert_allclose(slot[:, 30, 5], np.array([30, 20, 10]) / 255, atol=1e-6)
    np.testing.assert_allclose(slot[:, 16:48], (np.array([30, 20, 10]) / 255)[:, None, None]
                               * np.ones((3, 32, 64)), atol=1e-6)


def test_unsupported_frame_shape():
    lb = Letterboxer(64, 64)
    with pytest.raises(ValueError):
        lb(np.zeros((10, 10, 2), np.uint8), np.zeros((3, 64, 64), np.float32))


def test_unsupported_channel_count():
    with pytest.raises(ValueError):
        Letterboxer(64, 64, channels=4)


def test_one_channel_model():
    # Gray input -> gray model: value unchanged, pad 114.
    lb = Letterboxer(64, 64, channels=1)
    slot = np.zeros((1, 64, 64), np.float32)
    lb(np.full((100, 200), 90, np.uint8), slot)
    np.testing.assert_allclose(slot[0, 16:48], 90 / 255, atol=1e-6)
    np.testing.assert_allclose(slot[0, :16], PAD_F, atol=1e-6)
    np.testing.assert_allclose(slot[0, 48:], PAD_F, atol=1e-6)
    # Colour input: ITU-R BT.601 luma 0.299 R + 0.587 G + 0.114 B = 0.299*200 + 0.587*100
    # + 0.114*50 = 59.8 + 58.7 + 5.7 = 124.2 -> 124 (OpenCV rounds in fixed point: allow 1).
    lb(bgr_frame(100, 200, 50, 100, 200), slot)
    assert abs(slot[0, 30, 30] * 255 - 124.2) <= 1.0
    np.testing.assert_allclose(slot[0, :16], PAD_F, atol=1e-6)


@pytest.mark.parametrize("rgb", [False, True])
def test_nhwc_uint8_canvas(rgb):
    lb = Letterboxer(64, 64, nhwc=True, style=LetterboxStyle(rgb=rgb, normalize=False))
    slot = np.full((64, 64, 3), 7, np.uint8)  # stale content that must be overwritten
    geo = lb(bgr_frame(100, 200, 10, 20, 30), slot)
    assert geo_tuple(geo) == (64, 32, 0, 16)
    want = (30, 20, 10) if rgb else (10, 20, 30)
    np.testing.assert_array_equal(slot[16:48], np.broadcast_to(np.array(want, np.uint8), (32, 64, 3)))
    assert (slot[:16] == PAD).all() and (slot[48:] == PAD).all()


def test_nhwc_rejects_wrong_slot():
    lb = Letterboxer(64, 64, nhwc=True)
    with pytest.raises(ValueError):
        lb(bgr_frame(10, 10, 0, 0, 0), np.zeros((64, 64, 3), np.float32))
    with pytest.raises(ValueError):
        lb(bgr_frame(10, 10, 0, 0, 0), np.zeros((3, 64, 64), np.uint8))


@pytest.mark.parametrize("nhwc", [False, True])
def test_reuse_never_leaks_previous_frame_into_padding(nhwc):
    style = LetterboxStyle(normalize=False)
    lb = Letterboxer(64, 64, nhwc=nhwc, style=style)
    slot = np.zeros((64, 64, 3), np.uint8) if nhwc else np.zeros((3, 64, 64), np.float32)

    def pad_and_image(top, new_h, left, new_w):
        s = slot if nhwc else slot.transpose(1, 2, 0)
        mask = np.zeros((64, 64), bool)
        mask[top:top + new_h, left:left + new_w] = True
        return s[~mask], s[mask]

    # 1. a bright frame filling the whole input
    lb(np.full((200, 200, 3), 250, np.uint8), slot)
    pad, img = pad_and_image(0, 64, 0, 64)
    assert pad.size == 0 and (img == 250).all()
    # 2. a small dark landscape frame: 40x10 -> r = 1.6 -> 64x16, top = round(23.9) = 24
    lb(np.full((10, 40, 3), 5, np.uint8), slot)
    pad, img = pad_and_image(24, 16, 0, 64)
    assert (pad == PAD).all() and (img == 5).all()
    # 3. a dark portrait frame: 10 wide x 40 high -> 16x64, left = 24
    lb(np.full((40, 10, 3), 9, np.uint8), slot)
    pad, img = pad_and_image(0, 64, 24, 16)
    assert (pad == PAD).all() and (img == 9).all()
    # 4. same geometry as step 2 again (the canvas is not refilled): still clean
    lb(np.full((10, 40, 3), 6, np.uint8), slot)
    pad, img = pad_and_image(24, 16, 0, 64)
    assert (pad == PAD).all() and (img == 6).all()
    # 5. a different source size with the same letterbox region: 80x20 -> 64x16 at top 24
    lb(np.full((20, 80, 3), 3, np.uint8), slot)
    pad, img = pad_and_image(24, 16, 0, 64)
    assert (pad == PAD).all() and (img == 3).all()


def test_resized_region_matches_cv2_inter_linear():
    # 131 wide x 97 high -> 64: r = 64/131, 97*r = 47.39 -> 47; dh = 17 -> top = round(8.4) = 8.
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, (97, 131, 3), np.uint8)
    lb = Letterboxer(64, 64)
    slot = np.zeros((3, 64, 64), np.float32)
    geo = lb(frame, slot)
    assert geo_tuple(geo) == (64, 47, 0, 8)
    ref = cv2.resize(frame, (64, 47), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255
    ref_rgb = ref[..., ::-1].transpose(2, 0, 1)
    np.testing.assert_allclose(slot[:, 8:55, :], ref_rgb, atol=1e-6)
    np.testing.assert_allclose(slot[:, :8], PAD_F, atol=1e-6)
    np.testing.assert_allclose(slot[:, 55:], PAD_F, atol=1e-6)  # 9 rows: the odd one at the bottom


def test_resized_region_matches_cv2_topleft_truncated():
    # 97 wide x 131 high -> 64 topleft: r = 64/131; 97*r = 47.39 -> int 47 columns at x = 0.
    rng = np.random.default_rng(2)
    frame = rng.integers(0, 256, (131, 97, 3), np.uint8)
    lb = Letterboxer(64, 64, style=TOPLEFT)
    slot = np.zeros((3, 64, 64), np.float32)
    lb(frame, slot)
    ref = cv2.resize(frame, (47, 64), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    np.testing.assert_array_equal(slot[:, :, :47], ref.transpose(2, 0, 1))
    np.testing.assert_array_equal(slot[:, :, 47:], 114.0)


def test_exact_size_is_copied_unchanged():
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (48, 64, 3), np.uint8)
    lb = Letterboxer(48, 64, style=LetterboxStyle(rgb=False, normalize=False))
    slot = np.zeros((3, 48, 64), np.float32)
    geo = lb(frame, slot)
    assert geo_tuple(geo) == (64, 48, 0, 0)
    np.testing.assert_array_equal(slot, frame.transpose(2, 0, 1).astype(np.float32))


def test_non_contiguous_frame():
    # A crop of a larger frame (a strided view) is letterboxed like its contiguous copy.
    rng = np.random.default_rng(4)
    big = rng.integers(0, 256, (200, 300, 3), np.uint8)
    view = big[10:107, 20:151]
    lb = Letterboxer(64, 64)
    a = np.zeros((3, 64, 64), np.float32)
    b = np.zeros((3, 64, 64), np.float32)
    lb(view, a)
    Letterboxer(64, 64)(np.ascontiguousarray(view), b)
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# Geometry.boxes_to_source
# --------------------------------------------------------------------------------------------

def test_boxes_to_source_roundtrip_through_pixels():
    # Source 320 wide x 160 high with a white rectangle x 40..100, y 20..60 (exclusive ends).
    # Into 640x640: r = 2 -> 640x320, top = round(159.9) = 160, left 0. The rectangle lands at
    # x 80..200, y 160 + 40 .. 160 + 120 = 200..280.
    src = np.zeros((160, 320, 3), np.uint8)
    src[20:60, 40:100] = 255
    lb = Letterboxer(640, 640)
    slot = np.zeros((3, 640, 640), np.float32)
    geo = lb(src, slot)
    assert geo_tuple(geo) == (640, 320, 0, 160)
    # Bilinear 2x upscaling puts the half-intensity edge exactly on the box edge.
    bright = slot[0] > 0.5
    bright[:160] = bright[480:] = False  # ignore the (grey, 0.447) padding
    ys, xs = np.nonzero(bright)
    found = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
    np.testing.assert_array_equal(found, [[80, 200, 200, 280]])
    back = geo.boxes_to_source(found.copy())
    np.testing.assert_allclose(back, [[40, 20, 100, 60]], atol=1e-4)


def test_boxes_to_source_non_integer_scale():
    # 811x1079 -> 640: new 481x640, left 79 (see CENTER_CASES). The letterboxed image spans
    # x 79..560 and maps onto the whole source; its centre maps to the source centre.
    geo = Geometry(811, 1079, 481, 640, 79, 0)
    boxes = np.array([[79, 0, 560, 640], [79 + 240.5, 320, 79 + 240.5, 320]], np.float32)
    out = geo.boxes_to_source(boxes)
    np.testing.assert_allclose(out[0], [0, 0, 811, 1079], atol=1e-3)
    np.testing.assert_allclose(out[1], [405.5, 539.5, 405.5, 539.5], atol=1e-3)


def test_boxes_to_source_clips_and_can_skip_clipping():
    # 1280x720 -> 640: r = 0.5, top 140.
    geo = Geometry(1280, 720, 640, 360, 0, 140)
    raw = np.array([[-10, 100, 700, 700], [100, 190, 200, 240]], np.float32)
    # unclipped: x / 0.5, (y - 140) / 0.5
    expected = np.array([[-20, -80, 1400, 1120], [200, 100, 400, 200]], np.float32)
    np.testing.assert_allclose(geo.boxes_to_source(raw.copy(), clip=False), expected)
    clipped = geo.boxes_to_source(raw.copy())
    np.testing.assert_allclose(clipped, [[0, 0, 1280, 720], [200, 100, 400, 200]])


def test_boxes_to_source_works_in_place():
    geo = Geometry(100, 100, 50, 50, 5, 7)
    boxes = np.array([[5, 7, 55, 57]], np.float32)
    out = geo.boxes_to_source(boxes)
    assert out is boxes
    np.testing.assert_allclose(boxes, [[0, 0, 100, 100]])


def test_geometry_scales():
    g = Geometry(1280, 720, 640, 360, 0, 140)
    assert g.scale_x == 0.5 and g.scale_y == 0.5


# -- the letterbox in two halves: resize on the camera thread, place on a preparer ----------------
@pytest.mark.parametrize("size,channels,nhwc,dtype,style", [
    ((1080, 1920), 3, False, np.float32, LetterboxStyle()),
    ((1080, 810), 3, False, np.float16, LetterboxStyle()),
    ((480, 640), 3, False, np.float32, LetterboxStyle(placement="topleft", rgb=False, normalize=False)),
    ((720, 1280), 3, True, np.uint8, LetterboxStyle()),
    ((333, 777), 1, False, np.float32, LetterboxStyle()),
    ((640, 640), 3, False, np.float32, LetterboxStyle()),  # already the model size: copied
    ((200, 150), 3, False, np.float32, LetterboxStyle()),  # smaller: enlarged
])
def test_resize_then_place_is_bit_for_bit_the_one_pass_letterbox(size, channels, nhwc, dtype, style):
    """The daemon splits the letterbox across threads; the model must not see the difference."""
    rng = np.random.default_rng(sum(size))
    frame = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    shape = (640, 640, 3) if nhwc else (channels, 640, 640)
    one_pass, two_pass = np.zeros(shape, dtype), np.ones(shape, dtype)
    whole = Letterboxer(640, 640, channels, nhwc=nhwc, style=style)
    expected_geo = whole(frame, one_pass)
    resized, geo = Resizer(640, 640, style).resize(frame)
    assert geo == expected_geo and resized.shape == (geo.new_h, geo.new_w, 3)
    Letterboxer(640, 640, channels, nhwc=nhwc, style=style).place(resized, geo, two_pass)
    np.testing.assert_array_equal(one_pass, two_pass)


def test_resizer_reuses_its_output_buffer_and_replaces_a_wrong_sized_one():
    resizer = Resizer(640, 640)
    frame = np.full((1080, 1920, 3), 7, np.uint8)
    out, geo = resizer.resize(frame)
    again, _ = resizer.resize(frame, out)
    assert again is out  # written in place: no allocation per frame
    other, geo2 = resizer.resize(np.full((480, 640, 3), 9, np.uint8), out)
    assert other is not out and other.shape == (geo2.new_h, geo2.new_w, 3) and (other == 9).all()
