"""The host's half of `decoder: dvpp`: access units demultiplexed by PyAV, never decoded.

Real clips: the shared H.264 street video (MP4: length-prefixed units, avcC), the same video
remuxed here into MPEG-TS (Annex-B with in-band parameter sets), and an H.265 clip encoded here by
PyAV's libx265 (MP4, hvcC). The oracle is the test's own: the units fed to a fresh FFmpeg decoder
(`av.CodecContext.create`) must give the pictures PyAV decodes from the file, one for one, also
when the decoder joins at a later keyframe. The reader itself must decode nothing: its stream's
decoder is never opened, and it spends a fraction of a decode's CPU time.
"""

from __future__ import annotations

import socket
import time
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

from yoloedge.config.sources import av_installed
from yoloedge.sources.base import SourceError, UnsupportedSourceError
from yoloedge.sources.demux import AccessUnit, AccessUnitReader
from yoloedge.sources.demux_layout import Chroma, JpegCoding, jpeg_info, pix_fmt_layout
from yoloedge.sources.demux_nal import (Codec, ParameterSets, extradata_parameter_sets, join_annexb, nal_type,
                                        split_annexb)
from yoloedge.sources.imagesize import image_size

pytestmark = pytest.mark.shared

MP4 = "street_people_720p.mp4"  # H.264 High (B-frames), 1280x720, 29.97 fps, 314 frames
AVI = "indoor_people_480p_mpeg4.avi"  # MPEG-4 Part 2: not for the card
PARAMETER_SETS = {Codec.H264: {7, 8}, Codec.H265: {32, 33, 34}}
VCL_TYPES = {Codec.H264: range(1, 6), Codec.H265: range(0, 32)}  # the NAL types of slices
DECODER = {Codec.H264: "h264", Codec.H265: "hevc"}


@pytest.fixture(scope="module")
def av():
    if not av_installed():
        pytest.skip("PyAV is not installed: pip install yoloedge[pyav] (the dev extra installs it)")
    from yoloedge.sources.pyav import load_av
    return load_av()


@pytest.fixture(scope="module")
def clips(media, av, tmp_path_factory) -> dict[str, tuple[Path, Codec]]:
    """name -> (path, codec): the shared MP4, its MPEG-TS remux, and an H.265 MP4 made here."""
    folder = tmp_path_factory.mktemp("demux")
    made = {"h264-mp4": (media / MP4, Codec.H264),
            "h264-ts": (remux(av, media / MP4, folder / "street.ts"), Codec.H264)}
    if "libx265" in av.codecs_available:
        made["h265-mp4"] = (encode_hevc(av, media / MP4, folder / "street_hevc.mp4"), Codec.H265)
    return made


def remux(av, source: Path, out: Path) -> Path:
    """The file's video stream copied into another container (the muxer makes it Annex-B)."""
    with av.open(str(source)) as given, av.open(str(out), "w") as written:
        stream = given.streams.video[0]
        copy = written.add_stream_from_template(stream)
        for packet in given.demux(stream):
            if packet.dts is None:
                continue
            packet.stream = copy
            written.mux(packet)
    return out


def encode_hevc(av, source: Path, out: Path, frames: int = 48) -> Path:
    """The first frames of `source` at 320x180, encoded by libx265 with a keyframe every 12."""
    with av.open(str(source)) as given, av.open(str(out), "w") as written:
        stream = written.add_stream("libx265", rate=30)
        stream.width, stream.height, stream.pix_fmt = 320, 180, "yuv420p"
        stream.options = {"x265-params": "keyint=12:min-keyint=12:bframes=2:log-level=error"}
        for index, frame in enumerate(given.decode(video=0)):
            if index == frames:
                break
            small = frame.reformat(width=320, height=180, format="yuv420p")
            small.pts, small.time_base = index, Fraction(1, 30)
            written.mux(stream.encode(small))
        written.mux(stream.encode(None))
    return out


def pictures(frames) -> list[np.ndarray]:
    """Each decoded frame's Y, U and V samples, as one array (the comparison's unit)."""
    return [frame.to_ndarray(format="yuv420p") for frame in frames]


def decoded_from_file(av, path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return pictures(container.decode(video=0))


def decoded_from_units(av, codec: Codec, units: list[AccessUnit]) -> list[np.ndarray]:
    """The oracle: the units fed, as they are, to a fresh decoder that has no extradata."""
    context = av.CodecContext.create(DECODER[codec], "r")
    frames = []
    for unit in units:
        frames.extend(context.decode(av.Packet(unit.data)))
    frames.extend(context.decode(None))
    return pictures(frames)


def read_units(path: Path, **settings) -> tuple[list[AccessUnit], AccessUnitReader]:
    reader = AccessUnitReader(str(path), **settings)
    try:
        units = list(reader)
        return units, reader
    finally:
        reader.close()


def nal_types(codec: Codec, unit: AccessUnit) -> list[int]:
    return [nal_type(codec, nal) for nal in split_annexb(unit.data)]


# -- files -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["h264-mp4", "h264-ts", "h265-mp4"])
def test_units_are_annexb_with_parameter_sets_before_every_keyframe(clips, name):
    if name not in clips:
        pytest.skip("this PyAV has no libx265 encoder to make the H.265 clip with")
    path, codec = clips[name]
    units, reader = read_units(path)
    assert reader.eof and reader.error is None
    assert reader.info.codec == codec.value and reader.info.chroma is Chroma.YUV420 and reader.info.bit_depth == 8
    assert all(unit.data[:4] == b"\x00\x00\x00\x01" or unit.data[:3] == b"\x00\x00\x01" for unit in units)
    keyframes = [unit for unit in units if unit.keyframe]
    assert len(keyframes) >= 2 and units[0].keyframe
    for unit in keyframes:
        types = nal_types(codec, unit)
        first_slice = next(i for i, kind in enumerate(types) if kind in VCL_TYPES[codec])
        assert PARAMETER_SETS[codec] <= set(types[:first_slice]), types


@pytest.mark.parametrize("name", ["h264-mp4", "h264-ts", "h265-mp4"])
def test_a_fresh_decoder_gives_the_files_pictures_from_the_units(av, clips, name):
    """As many units as PyAV decodes frames, and the pictures of a decoder fed only the units
    (no extradata) are the file's, byte for byte."""
    if name not in clips:
        pytest.skip("this PyAV has no libx265 encoder to make the H.265 clip with")
    path, codec = clips[name]
    units, reader = read_units(path)
    reference = decoded_from_file(av, path)
    assert len(units) == len(reference) == (reader.frame_count or len(reference))
    ours = decoded_from_units(av, codec, units)
    assert len(ours) == len(reference)
    assert [i for i, (a, b) in enumerate(zip(ours, reference)) if not np.array_equal(a, b)] == []


@pytest.mark.parametrize("name", ["h264-mp4", "h265-mp4"])
def test_a_decoder_that_joins_at_a_later_keyframe_decodes_from_there(av, clips, name):
    if name not in clips:
        pytest.skip("this PyAV has no libx265 encoder to make the H.265 clip with")
    path, codec = clips[name]
    units, _ = read_units(path)
    reference = decoded_from_file(av, path)
    join = [i for i, unit in enumerate(units) if unit.keyframe][1]
    ours = decoded_from_units(av, codec, units[join:])
    # decode order from a closed-GOP keyframe on: the frames from the join's presentation time on
    start = sorted(unit.pts_s for unit in units).index(units[join].pts_s)
    assert len(ours) == len(reference) - start
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference[start:]))


def test_media_times_are_the_files_and_go_on_across_loops(clips):
    path, _ = clips["h264-mp4"]
    reader = AccessUnitReader(str(path), loop=True)
    try:
        units = [reader.read() for _ in range(2 * 314 + 1)]
    finally:
        reader.close()
    assert all(unit is not None for unit in units)
    first = sorted(unit.pts_s for unit in units[:314])
    second = sorted(unit.pts_s for unit in units[314:628])
    assert first[0] == 0.0 and first[-1] == pytest.approx(313 * 1001 / 30000)
    step = 1001 / 30000
    assert second[0] == pytest.approx(first[-1] + step) and units[314].keyframe
    assert np.allclose(np.diff(second), step) and units[628].pts_s == pytest.approx(second[0] + 314 * step)


def test_nothing_is_decoded(av, clips):
    """The stream's decoder is never opened, and demultiplexing the clip costs a fraction of the
    CPU time decoding it does (thread CPU time: other processes do not count)."""
    path, _ = clips["h264-mp4"]
    started = time.thread_time()
    reader = AccessUnitReader(str(path))
    stream = reader._stream
    try:
        units = list(reader)
        assert len(units) == 314 and not stream.codec_context.is_open
    finally:
        reader.close()
    demux_s = time.thread_time() - started
    started = time.thread_time()
    with av.open(str(path)) as container:
        context = container.streams.video[0].codec_context
        context.thread_type, context.thread_count = "SLICE", 1  # every frame decoded on this thread
        decoded = sum(1 for _ in container.decode(video=0))
    decode_s = time.thread_time() - started
    assert decoded == 314 and demux_s < decode_s / 4, (demux_s, decode_s)


def test_a_stream_info_describes_another_codec_and_read_refuses_it(media, av):
    reader = AccessUnitReader(str(media / AVI))
    try:
        assert (reader.info.codec, reader.info.width, reader.info.height) == ("mpeg4", 640, 480)
        assert reader.info.fps == 15.0
        assert reader.read() is None and "not H.264 or H.265" in (reader.error or "")
    finally:
        reader.close()


def test_close_is_idempotent_and_a_closed_reader_reads_nothing(clips):
    path, _ = clips["h264-mp4"]
    with AccessUnitReader(str(path)) as reader:
        assert reader.read() is not None
        reader.close()
        reader.close()
        assert reader.read() is None and reader.error == "source released" and not reader.eof
    reader.release()


def test_missing_files_and_other_sources_are_the_sources_errors(av, tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        AccessUnitReader(str(tmp_path / "absent.mp4"))
    (tmp_path / "noise.mp4").write_bytes(b"not a video" * 100)
    with pytest.raises(SourceError, match="cannot open video file"):
        AccessUnitReader(str(tmp_path / "noise.mp4"))
    with pytest.raises(UnsupportedSourceError, match="rtsp:// cameras and video files"):
        AccessUnitReader("http://127.0.0.1:9/video.mjpg")


# -- RTSP ------------------------------------------------------------------------------------------
def test_rtsp_units_decode_to_the_files_pictures(av, media, rtsp_server):
    """The test server sends the clip's own access units (Annex-B, no filter needed) from the first."""
    reader = AccessUnitReader(rtsp_server.url(credentials="viewer:Demux-Secret-7"), open_timeout_s=5.0,
                              read_timeout_s=3.0)
    try:
        assert "Demux-Secret-7" not in reader.description and reader._filter is None
        assert reader.info.codec == "h264" and (reader.info.width, reader.info.height) == (1280, 720)
        units = [reader.read() for _ in range(30)]
        assert all(unit is not None for unit in units), reader.error
    finally:
        reader.close()
        reader.close()
    assert units[0].keyframe and PARAMETER_SETS[Codec.H264] <= set(nal_types(Codec.H264, units[0]))
    ours = decoded_from_units(av, Codec.H264, units)
    reference = decoded_from_file(av, media / MP4)[:len(ours)]
    assert len(ours) >= 25 and all(np.array_equal(a, b) for a, b in zip(ours, reference))


def test_a_frozen_rtsp_camera_is_a_read_timeout(av, rtsp_server):
    reader = AccessUnitReader(rtsp_server.url(), open_timeout_s=5.0, read_timeout_s=1.0)
    try:
        assert reader.read() is not None, reader.error
        rtsp_server.freeze()
        try:
            started = time.monotonic()
            while reader.read() is not None:  # what was in flight, then nothing
                assert time.monotonic() - started < 30, "the frozen server kept delivering"
            assert "read timed out" in (reader.error or ""), reader.error
        finally:
            rtsp_server.resume()
    finally:
        reader.close()


def test_a_killed_rtsp_server_ends_the_stream_as_an_error(av, rtsp_server):
    reader = AccessUnitReader(rtsp_server.url(), open_timeout_s=5.0, read_timeout_s=3.0)
    try:
        assert reader.read() is not None, reader.error
        rtsp_server.kill()
        started = time.monotonic()
        while reader.read() is not None:
            assert time.monotonic() - started < 30
        assert not reader.eof and reader.error, reader.error
    finally:
        reader.close()


def test_a_refused_rtsp_camera_is_a_clear_error_without_the_password(av):
    from fixtures_media import free_port
    with pytest.raises(SourceError) as info:
        AccessUnitReader(f"rtsp://viewer:Demux-Secret-8@127.0.0.1:{free_port()}/stream", open_timeout_s=2.0)
    assert "Demux-Secret-8" not in str(info.value) and "cannot open stream" in str(info.value), info.value


def test_an_rtsp_camera_that_never_answers_is_an_open_timeout(av):
    """A server that takes the connection (the kernel's backlog) and never answers: the open gives
    up after its timeout, and says so (FFmpeg's own text would be "Invalid data")."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"no answer within 1\.0 s \(open timed out\)"):
            AccessUnitReader(f"rtsp://127.0.0.1:{listener.getsockname()[1]}/stream", open_timeout_s=1.0)
        assert time.monotonic() - started < 30


def test_a_failed_open_is_a_timeout_only_once_the_timeout_has_passed(av):
    """The open's clock decides (injected): a refusal that comes at once keeps FFmpeg's reason."""
    from fixtures_media import free_port
    ticks = iter([0.0, 5.0])
    with pytest.raises(SourceError, match="open timed out"):
        AccessUnitReader(f"rtsp://127.0.0.1:{free_port()}/s", open_timeout_s=5.0, clock=lambda: next(ticks))
    ticks = iter([0.0, 4.0])
    with pytest.raises(SourceError, match="Connection refused"):
        AccessUnitReader(f"rtsp://127.0.0.1:{free_port()}/s", open_timeout_s=5.0, clock=lambda: next(ticks))


# -- parameter sets, layouts -----------------------------------------------------------------------
def test_missing_parameter_sets_go_in_front_of_a_keyframe_after_its_delimiter():
    sps, pps, sei, idr, slice_ = b"\x67\x64\x00\x1f", b"\x68\xee", b"\x06\x05\x01", b"\x65\x88", b"\x41\x9a"
    avcc = bytes([1, 0x64, 0, 0x1F, 0xFF, 0xE1, 0, len(sps)]) + sps + bytes([1, 0, len(pps)]) + pps
    assert extradata_parameter_sets(Codec.H264, avcc) == [sps, pps]
    sets = ParameterSets(Codec.H264, [sps, pps])
    aud = b"\x09\xf0"
    keyframe = join_annexb([aud, sei, idr])
    assert sets.is_keyframe(split_annexb(keyframe)) and not sets.is_keyframe([slice_])
    assert split_annexb(sets.prepare(keyframe, True)) == [aud, sps, pps, sei, idr]
    assert sets.prepare(join_annexb([slice_]), False) == join_annexb([slice_])
    new_sps = b"\x67\x4d\x00\x28"
    sets.prepare(join_annexb([new_sps, pps, idr]), True)  # in-band sets replace the older ones
    assert split_annexb(sets.prepare(join_annexb([idr]), True)) == [new_sps, pps, idr]
    with pytest.raises(ValueError, match="cut short"):
        extradata_parameter_sets(Codec.H264, avcc[:-1])


def test_pixel_format_layouts_agree_with_ffmpegs_descriptors(av):
    cases = {"yuv420p": (Chroma.YUV420, 8), "yuvj420p": (Chroma.YUV420, 8), "nv12": (Chroma.YUV420, 8),
             "yuv420p10le": (Chroma.YUV420, 10), "p010le": (Chroma.YUV420, 10), "yuv422p": (Chroma.YUV422, 8),
             "yuv422p10le": (Chroma.YUV422, 10), "nv16": (Chroma.YUV422, 8), "yuyv422": (Chroma.YUV422, 8),
             "yuv444p": (Chroma.YUV444, 8), "yuv444p12le": (Chroma.YUV444, 12), "gray": (Chroma.GRAY, 8),
             "gray10le": (Chroma.GRAY, 10), "yuv440p": (Chroma.YUV440, 8), "yuv411p": (Chroma.YUV411, 8),
             "yuva420p": (Chroma.YUV420, 8), "rgb24": (None, None), "bgr24": (None, None)}
    ratios = {(2, 2): Chroma.YUV420, (2, 1): Chroma.YUV422, (1, 1): Chroma.YUV444, (1, 2): Chroma.YUV440,
              (4, 1): Chroma.YUV411}
    for name, expected in cases.items():
        assert pix_fmt_layout(name) == expected, name
        if expected[0] in (None, Chroma.GRAY):
            continue
        luma, chroma = av.VideoFormat(name, 64, 64).components[:2]  # the oracle: FFmpeg's pixdesc
        assert ratios[(luma.width // chroma.width, luma.height // chroma.height)] is expected[0], name
        assert luma.bits == expected[1], name
    assert pix_fmt_layout(None) == (None, None) and pix_fmt_layout("vaapi") == (None, None)


@pytest.mark.parametrize("sampling,chroma", [(cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, Chroma.YUV420),
                                             (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422, Chroma.YUV422),
                                             (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, Chroma.YUV444),
                                             (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440, Chroma.YUV440),
                                             (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, Chroma.YUV411)])
def test_jpeg_info_reads_the_frame_header(media, sampling, chroma):
    image = cv2.imread(str(media / "zidane.jpg"))[:301, :203]
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling])
    assert ok
    info = jpeg_info(data.tobytes())
    assert info is not None and (info.width, info.height, info.chroma) == (203, 301, chroma)
    assert info.bit_depth == 8 and info.coding is JpegCoding.BASELINE and info.components == 3


def test_jpeg_info_of_real_progressive_grey_and_broken_jpegs(media):
    for name, size in (("bus.jpg", (810, 1080)), ("zidane.jpg", (1280, 720))):
        data = (media / name).read_bytes()
        info = jpeg_info(data)
        assert info is not None and (info.width, info.height) == size == image_size(data)
        assert info.chroma is Chroma.YUV420  # what both photos are encoded with (cjpeg's default)
    image = cv2.imread(str(media / "bus.jpg"))
    progressive = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    assert jpeg_info(progressive).coding is JpegCoding.PROGRESSIVE  # type: ignore[union-attr]
    grey = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_BGR2GRAY))[1].tobytes()
    assert jpeg_info(grey).chroma is Chroma.GRAY  # type: ignore[union-attr]
    data = (media / "zidane.jpg").read_bytes()
    at = data.index(b"\xff\xc0")
    assert jpeg_info(data[:at + 12]) is None and jpeg_info(b"\x89PNG\r\n\x1a\n") is None and jpeg_info(b"") is None


LAYOUTS = [("libx264", "yuv422p10le"), ("libx264", "yuv444p"), ("libx264", "yuv420p10le"), ("libx265", "yuv420p10le"),
           ("libx265", "yuv422p"), ("libx265", "yuv444p12le"), ("libx265", "gray")]


@pytest.mark.parametrize("encoder,pix_fmt", LAYOUTS)
def test_the_sps_tells_the_layout_ffmpegs_probe_decode_finds(av, tmp_path, encoder, pix_fmt):
    """Chroma format and bit depth from the SPS (the reader decodes nothing) are those of the pixel
    format FFmpeg's own probe finds by decoding; the units still decode to the file's pictures."""
    if encoder not in av.codecs_available:
        pytest.skip(f"this PyAV has no {encoder} encoder")
    path = tmp_path / f"{pix_fmt}.mp4"
    with av.open(str(path), "w") as written:
        stream = written.add_stream(encoder, rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, pix_fmt
        if encoder == "libx265":
            stream.options = {"x265-params": "log-level=error"}
        for index in range(4):
            picture = np.full((48, 64, 3), 40 * index, np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format=pix_fmt)
            frame.pts = index
            written.mux(stream.encode(frame))
        written.mux(stream.encode(None))
    with av.open(str(path)) as probed:  # FFmpeg's default open: its probe decodes
        expected = probed.streams.video[0].codec_context.format.name
    units, reader = read_units(path)
    assert (reader.info.chroma, reader.info.bit_depth) == pix_fmt_layout(expected) == pix_fmt_layout(pix_fmt)
    assert (reader.info.width, reader.info.height) == (64, 48) and len(units) == 4
    codec = Codec(reader.info.codec)
    context = av.CodecContext.create(DECODER[codec], "r")
    frames = [frame for unit in units for frame in context.decode(av.Packet(unit.data))] + list(context.decode(None))
    with av.open(str(path)) as given:
        reference = list(given.decode(video=0))
    assert len(frames) == 4 and all(samples(a) == samples(b) for a, b in zip(frames, reference))


def samples(frame) -> list[bytes]:
    """Each plane's samples without the padding at the end of its rows (any format)."""
    wide = 2 if frame.format.components[0].bits > 8 else 1
    return [np.frombuffer(bytes(plane), np.uint8).reshape(-1, plane.line_size)[:plane.height, :plane.width * wide]
            .tobytes() for plane in frame.planes]


def test_a_cut_short_sps_is_an_error_not_a_guess():
    from yoloedge.sources.demux_sps import sps_layout
    with pytest.raises(ValueError, match="cut short"):
        sps_layout(Codec.H265, b"\x42\x01\x01\x01")
    assert sps_layout(Codec.H264, b"\x67\x42\x00\x1e\xf4") == (Chroma.YUV420, 8)  # Baseline: no fields, 4:2:0
