"""I420 to BGR as OpenCV's FFmpeg does it (`sources/yuv.py`): `decoder: gstreamer` against
`decoder: opencv` on clips this project has not seen, and the conversion against FFmpeg's own.

The clips are made here, in a temporary folder, by GStreamer from the shared videos: lossless FFV1
in Matroska, whose container tags each colorimetry (both decoders read the same YUV, so any
difference is the conversion's), MPEG-4 in AVI without tags, H.264 at 1080p (1088 rows coded,
cropped). Every frame must be the same, byte for byte. The last test calls FFmpeg's libswscale
(the one inside the OpenCV wheel) on every (Y, U, V) there is, with its x86 code and with its C
code, the one ARM machines run.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import test_gstreamer
from yoloedge.config.schema import CameraConfig
from yoloedge.config.sources import av_installed
from yoloedge.sources.yuv import (BT601, Arithmetic, Colorimetry, Matrix, native_arithmetic, opencv_colorimetry,
                                  opencv_reads_tags)

pytestmark = pytest.mark.shared

gst_modules = test_gstreamer.gst_modules  # the fixture
MP4 = test_gstreamer.MP4
AVI = test_gstreamer.AVI
FRAMES = 4


def gst_launch(launch: str) -> None:
    subprocess.run(["gst-launch-1.0", "-q", *launch.split()], check=True, timeout=120,
                   stdout=subprocess.DEVNULL)


def element_missing(*names: str) -> str | None:
    from yoloedge.sources.gstreamer import element_present
    missing = [name for name in names if not element_present(name)]
    return f"GStreamer elements missing: {', '.join(missing)}" if missing else None


def ffv1_clip(media: Path, folder: Path, size: tuple[int, int], colorimetry: str) -> Path:
    """FRAMES frames of the street clip at `size`, tagged `colorimetry` by the container (FFV1 is
    lossless: the decoders see exactly the YUV written)."""
    skip = element_missing("avenc_ffv1", "avdec_ffv1", "matroskamux")
    if skip:
        pytest.skip(skip)
    width, height = size
    path = folder / f"street_{width}x{height}_{colorimetry.replace(':', '-')}.mkv"
    gst_launch(f"filesrc location={media / MP4} ! qtdemux ! h264parse ! avdec_h264 ! identity eos-after={FRAMES} "
               f"! videoconvert ! videoscale ! video/x-raw,format=I420,width={width},height={height},"
               f"colorimetry={colorimetry} ! avenc_ffv1 ! matroskamux ! filesink location={path}")
    return path


def other_decoders() -> list[str]:
    """The decoders whose pictures must be decoder: opencv's: GStreamer's, and PyAV's where installed."""
    return ["gstreamer", "pyav"] if av_installed() else ["gstreamer"]


def read_frames(path: Path, decoder: str) -> list[np.ndarray]:
    source, _ = test_gstreamer.open_camera(CameraConfig(name=decoder, url=str(path), decoder=decoder))
    try:
        frames = []
        while (frame := source.read()) is not None:
            frames.append(frame.copy())
        assert source.error is None, source.error
        return frames
    finally:
        source.release()


def differences(ours: list[np.ndarray], theirs: list[np.ndarray]) -> list[str]:
    """What tells the frames apart: per frame, the mean difference of each channel and the largest."""
    assert len(ours) == len(theirs) and ours, (len(ours), len(theirs))
    found = []
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        assert mine.shape == reference.shape, (mine.shape, reference.shape)
        if not np.array_equal(mine, reference):
            delta = mine.astype(int) - reference
            found.append(f"frame {index}: mean {delta.mean(axis=(0, 1)).round(2).tolist()} "
                         f"max {int(np.abs(delta).max())}")
    return found


# -- decoder: gstreamer gives decoder: opencv's pictures -----------------------------------------------
# BT.601 and BT.709 in both ranges, SMPTE 240M, FCC, the BT.2020 matrix (with BT.709 primaries, which
# FFmpeg 8 converts as they are), at an even size, an odd width and a width that is no multiple of 8.
@pytest.mark.parametrize("size, colorimetry", [
    ((320, 180), "bt601"), ((320, 180), "bt709"), ((320, 180), "1:4:0:0"), ((320, 180), "1:3:5:1"),
    ((320, 180), "smpte240m"), ((320, 180), "2:2:0:0"), ((320, 180), "2:6:5:1"),
    ((321, 180), "bt709"), ((100, 60), "bt601")])
def test_tagged_clips_give_opencvs_pictures(media, tmp_path, gst_modules, size, colorimetry):
    clip = ffv1_clip(media, tmp_path, size, colorimetry)
    theirs = read_frames(clip, "opencv")
    for decoder in other_decoders():
        ours = read_frames(clip, decoder)
        assert len(ours) >= FRAMES
        assert not differences(ours, theirs), (decoder, differences(ours, theirs))


def test_untagged_and_cropped_clips_give_opencvs_pictures(media, tmp_path, gst_modules):
    """MPEG-4 Part 2 at 1920x1080 without any colour tag (BT.601 limited range for both, though
    GstVideo would guess BT.709 for HD), and H.264 at 1920x1080, whose decoder crops 1088 coded rows."""
    skip = element_missing("avenc_mpeg4", "avimux", "openh264enc", "mp4mux")
    if skip:
        pytest.skip(skip)
    mpeg4, h264 = tmp_path / "indoor_1080p.avi", tmp_path / "street_1080p.mp4"
    gst_launch(f"filesrc location={media / AVI} ! avidemux ! avdec_mpeg4 ! identity eos-after={FRAMES} ! videoscale "
               f"! video/x-raw,width=1920,height=1080 ! avenc_mpeg4 ! avimux ! filesink location={mpeg4}")
    gst_launch(f"filesrc location={media / MP4} ! qtdemux ! h264parse ! avdec_h264 ! identity eos-after={FRAMES} "
               f"! videoscale ! video/x-raw,width=1920,height=1080 ! openh264enc ! h264parse ! mp4mux "
               f"! filesink location={h264}")
    for clip in (mpeg4, h264):
        theirs = read_frames(clip, "opencv")
        for decoder in other_decoders():
            ours = read_frames(clip, decoder)
            assert len(ours) >= FRAMES and ours[0].shape == (1080, 1920, 3), (clip.name, decoder, len(ours))
            assert not differences(ours, theirs), (clip.name, decoder, differences(ours, theirs))


def test_what_is_not_reproduced_is_said_once(media, tmp_path, gst_modules, caplog):
    """An odd height: FFmpeg's general scaler interpolates chroma between rows, yoloedge repeats it:
    close (a grey level on average), not equal, and the log says why, once for the stream."""
    clip = ffv1_clip(media, tmp_path, (320, 181), "bt709")
    with caplog.at_level(logging.WARNING, logger="yoloedge.sources.gstreamer"):
        ours = read_frames(clip, "gstreamer")
    theirs = read_frames(clip, "opencv")
    warned = [r.getMessage() for r in caplog.records if "pictures differ from decoder: opencv's" in r.getMessage()]
    assert len(warned) == 1 and "height (181) is odd" in warned[0], warned
    delta = np.abs(np.stack(ours).astype(int) - np.stack(theirs))
    assert 0 < delta.mean() < 2.0, delta.mean()
    if av_installed():  # decoder: pyav hands such pictures to swscale itself, called as OpenCV calls it
        assert not differences(read_frames(clip, "pyav"), theirs)


def test_wide_gamut_primaries_are_said_once_where_opencv_maps_them(media, tmp_path, gst_modules, caplog):
    """BT.2020 primaries: OpenCV 5's FFmpeg maps the colours to BT.709 before converting (tens of
    grey levels), OpenCV 4's converts them as they are."""
    clip = ffv1_clip(media, tmp_path, (320, 180), "bt2020")
    with caplog.at_level(logging.WARNING, logger="yoloedge.sources.gstreamer"):
        ours = read_frames(clip, "gstreamer")
    warned = [r.getMessage() for r in caplog.records if "pictures differ from decoder: opencv's" in r.getMessage()]
    if opencv_reads_tags():
        assert len(warned) == 1 and "colour primaries (BT2020)" in warned[0], warned
    else:
        assert not warned, warned
        assert not differences(ours, read_frames(clip, "opencv"))
    if av_installed():  # decoder: pyav has swscale map the colours, as OpenCV's FFmpeg does
        assert not differences(read_frames(clip, "pyav"), read_frames(clip, "opencv"))


def test_opencv_4_converts_every_stream_with_bt601_in_its_own_range():
    """Measured with opencv-python-headless 4.12.0.88 (FFmpeg 5.1) on the tagged clips above: BT.601
    whatever the tag, the tagged range kept; OpenCV 5 keeps both."""
    full_709 = Colorimetry(Matrix.BT709, full_range=True)
    assert opencv_colorimetry(full_709, "4.12.0") == Colorimetry(Matrix.BT601, full_range=True)
    assert opencv_colorimetry(Colorimetry(Matrix.BT2020), "4.8.0") == BT601
    assert opencv_colorimetry(full_709, "5.0.0") == full_709
    assert native_arithmetic("aarch64") is Arithmetic.C and native_arithmetic("x86_64") is Arithmetic.X86


# -- the conversion is FFmpeg's, for every sample -----------------------------------------------------------
SWSCALE_CHECK = textwrap.dedent("""
    import ctypes, ctypes.util, glob, os, sys
    import cv2, numpy as np
    from yoloedge.sources.yuv import Arithmetic, Colorimetry, I420Converter, Matrix, PlaneLayout

    arithmetic = Arithmetic(sys.argv[1])
    wheel_libs = os.path.join(os.path.dirname(os.path.dirname(cv2.__file__)), "opencv_python_headless.libs")
    found = [sorted(glob.glob(os.path.join(wheel_libs, f"lib{name}-*.so*"))) for name in ("swscale", "avutil")]
    paths = [f[0] for f in found] if all(found) else [ctypes.util.find_library(n) for n in ("swscale", "avutil")]
    if not all(paths):
        sys.exit(77)
    swscale, avutil = (ctypes.CDLL(path) for path in paths)
    if arithmetic is Arithmetic.C:
        avutil.av_force_cpu_flags(0)  # no SIMD: FFmpeg's C converter, as on ARM
    swscale.sws_getContext.restype = ctypes.c_void_p
    swscale.sws_getContext.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3
    swscale.sws_getCoefficients.restype = ctypes.POINTER(ctypes.c_int)
    swscale.sws_setColorspaceDetails.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                                 ctypes.POINTER(ctypes.c_int)] + [ctypes.c_int] * 4
    swscale.sws_scale.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2
    swscale.sws_freeContext.argtypes = [ctypes.c_void_p]
    SWS_CS = {Matrix.BT709: 1, Matrix.FCC: 4, Matrix.BT601: 5, Matrix.SMPTE240M: 7, Matrix.BT2020: 9}
    YUV420P, BGR24, SWS_BICUBIC = 0, 3, 4  # OpenCV's flags; the same-size conversion ignores them

    # Every (U, V) pair on 8x8 chroma samples (64 blocks), every Y once over each pair's blocks.
    pairs = np.arange(65536)
    u = np.repeat(np.repeat((pairs & 255).astype(np.uint8).reshape(256, 256), 8, 0), 8, 1)
    v = np.repeat(np.repeat((pairs >> 8).astype(np.uint8).reshape(256, 256), 8, 0), 8, 1)
    y = np.tile(np.arange(256, dtype=np.uint8).reshape(16, 16), (256, 256))
    h, w = y.shape
    planes = [np.ascontiguousarray(p) for p in (y, u, v)]
    layout = PlaneLayout(w, h, (0, w * h, w * h + u.size), (w, w // 2, w // 2))
    data = b"".join(p.tobytes() for p in planes)
    converter = I420Converter(arithmetic)
    failed = []
    for matrix in Matrix:
        for full_range in (False, True):
            context = swscale.sws_getContext(w, h, YUV420P, w, h, BGR24, SWS_BICUBIC, None, None, None)
            coefficients = swscale.sws_getCoefficients(SWS_CS[matrix])
            swscale.sws_setColorspaceDetails(context, coefficients, int(full_range), coefficients, 0, 0,
                                             1 << 16, 1 << 16)
            theirs = np.zeros((h, w * 3 + 64), np.uint8)  # room for the SIMD code's whole 8-pixel steps
            source = (ctypes.c_void_p * 4)(*[p.ctypes.data for p in planes], None)
            strides = (ctypes.c_int * 4)(*[p.strides[0] for p in planes], 0)
            target = (ctypes.c_void_p * 4)(theirs.ctypes.data, None, None, None)
            target_strides = (ctypes.c_int * 4)(theirs.strides[0], 0, 0, 0)
            swscale.sws_scale(context, source, strides, 0, h, target, target_strides)
            swscale.sws_freeContext(context)
            theirs = theirs[:, :w * 3].reshape(h, w, 3)
            ours = converter.to_bgr(data, layout, Colorimetry(matrix, full_range))
            if not np.array_equal(ours, theirs):
                wrong = np.any(ours != theirs, axis=2)
                failed.append(f"{matrix.value} full_range={full_range}: {int(wrong.sum())} pixels differ")
    print("; ".join(failed) or "equal")
    """)


@pytest.mark.parametrize("arithmetic", list(Arithmetic))
def test_the_conversion_is_ffmpegs_for_every_sample(arithmetic):
    """FFmpeg's swscale, through ctypes, in a process of its own (forcing its C code is for the whole
    process): every Y with every (U, V), in every matrix and range, byte for byte."""
    if arithmetic is Arithmetic.X86 and native_arithmetic() is not Arithmetic.X86:
        pytest.skip("FFmpeg runs its x86 converter on x86 machines only")
    repo = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", SWSCALE_CHECK, arithmetic.value], capture_output=True, text=True,
                            timeout=300, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    if result.returncode == 77:
        pytest.skip("no libswscale here: neither in the OpenCV wheel nor on the system")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "equal", result.stdout
