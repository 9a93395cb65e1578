"""`convert atc --aipp yuv420sp`: the AIPP block for NV12 pictures from the card's DVPP must give the
NPU the RGB the host path would have given it. The oracle is OpenCV's own NV12 -> BGR conversion
(BT.601 limited range, what FFmpeg assumes for untagged streams), applied to the same pictures;
the block's numbers are read back from the text it writes and run through ATC's documented formula
`out = (M . (yuv - input_bias)) >> 8`, then the normalisation `(out - min_chn) * var_reci_chn`."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from yoloedge.convert import ConvertError
from yoloedge.convert.aipp import AippSettings, aipp_config


def _fields(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+(\w+) : (\S+)$", text, re.M))


def _atc_yuv_to_rgb(fields: dict[str, str], nv12: np.ndarray, w: int, h: int) -> np.ndarray:
    """ATC's AIPP on one NV12 picture, from the block's text: (h, w, 3) in the block's order."""
    y = nv12[:h].astype(np.int64)
    uv = nv12[h:].reshape(h // 2, w // 2, 2).repeat(2, axis=0).repeat(2, axis=1).astype(np.int64)
    yuv = np.stack([y, uv[..., 0], uv[..., 1]], axis=-1)
    bias = np.array([int(fields[f"input_bias_{i}"]) for i in range(3)])
    m = np.array([[int(fields[f"matrix_r{r}c{c}"]) for c in range(3)] for r in range(3)])
    out = ((yuv - bias) @ m.T) >> 8
    out += np.array([int(fields[f"output_bias_{i}"]) for i in range(3)])
    return np.clip(out, 0, 255)


@pytest.mark.parametrize("model_color", ["rgb", "bgr"])
def test_the_yuv420sp_block_gives_the_rgb_opencv_gives(model_color):
    w, h = 64, 48
    rng = np.random.default_rng(7)
    nv12 = rng.integers(16, 236, (h * 3 // 2, w), dtype=np.uint8)
    text = aipp_config(AippSettings(w, h, model_color=model_color, input="yuv420sp"))
    fields = _fields(text)
    assert fields["input_format"] == "YUV420SP_U8" and fields["csc_switch"] == "true"
    assert fields["rbuv_swap_switch"] == "false"  # NV12: U first, as the rows expect
    got = _atc_yuv_to_rgb(fields, nv12, w, h)
    bgr = cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12).astype(np.int64)
    want = bgr[..., ::-1] if model_color == "rgb" else bgr
    assert np.abs(got - want).max() <= 2, np.abs(got - want).max()
    assert np.abs(got - want).mean() < 0.6
    # then the usual normalisation of a YOLO model: / 255
    assert float(fields["var_reci_chn_0"]) == pytest.approx(1 / 255)


def test_the_letterbox_grey_survives_the_conversion():
    """The canvas DVPP pads with (Y 114, U 128, V 128) must reach the model as RGB 114, the grey
    the host letterbox pads with (Ultralytics)."""
    w, h = 16, 16
    nv12 = np.concatenate([np.full((h, w), 114, np.uint8), np.full((h // 2, w), 128, np.uint8)])
    got = _atc_yuv_to_rgb(_fields(aipp_config(AippSettings(w, h, input="yuv420sp"))), nv12, w, h)
    assert set(np.unique(got)) <= {113, 114, 115}


def test_the_rgb_block_is_unchanged_and_a_bad_input_is_refused():
    fields = _fields(aipp_config(AippSettings(32, 32)))
    assert fields["input_format"] == "RGB888_U8" and fields["csc_switch"] == "false"
    assert not any(k.startswith("matrix_") for k in fields)
    with pytest.raises(ConvertError, match="even"):
        AippSettings(33, 32, input="yuv420sp")
    with pytest.raises(ConvertError, match="input"):
        AippSettings(32, 32, input="nv21")
