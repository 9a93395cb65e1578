"""GStreamer decoding at its edges: errors that come with an end of stream, credentials outside
URLs, hostile `pipeline:` strings, presets whose chain this machine cannot build, and many
reconnects. Real GStreamer, the real test RTSP server; nothing here is a fake.
"""

from __future__ import annotations

import gc
import hashlib
import http.server
import os
import sys
import textwrap
import threading
import tracemalloc
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

import test_gstreamer
import test_sources
from test_sources import Collector, camera
from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.redact import SECRETS
from yoloedge.sources import CameraState
from yoloedge.config.sources import Decoder, display_launch
from yoloedge.sources.base import SourceError, SourceKind, UnsupportedSourceError

pytestmark = pytest.mark.shared

run_reader = test_sources.run_reader  # the fixtures
gst_modules = test_gstreamer.gst_modules
BGR_TAIL = "videoconvert ! video/x-raw,format=BGR ! appsink"


def pipeline_source(launch: str, **options):
    """A `pipeline:` camera's source, opened (the way open_camera builds one)."""
    from yoloedge.sources.gstreamer import GStreamerSource, LaunchSpec
    spec = LaunchSpec(f"{launch} name=s", SourceKind.PIPELINE, display_launch(launch), Decoder.GSTREAMER,
                      sink_name="s", user_pipeline=True)
    return GStreamerSource(spec, **options)


def pipeline_camera(launch: str, **overrides):
    return replace(camera("", decoder="gstreamer", **overrides), pipeline=launch)


# -- an error that ends the stream is the error, not an end ---------------------------------------------
def test_caps_mismatch_is_reported_not_taken_for_an_end(gst_modules):
    """NV12 cannot reach an appsink that takes BGR or I420: videotestsrc posts not-negotiated and
    sends EOS. Live, it does so once playing, so the EOS reaches the sink while the read waits;
    the error (with its hint) must win. Five times: the race went the wrong way every time before."""
    launch = "videotestsrc is-live=true ! video/x-raw,format=NV12,width=64,height=48 ! appsink"
    for _ in range(5):
        with pytest.raises(SourceError) as info:
            pipeline_source(launch, open_timeout_s=3.0)
        assert "not-negotiated" in str(info.value) and "ended before" not in str(info.value)
        assert str(info.value).endswith("end the pipeline with videoconvert ! video/x-raw,format=BGR ! appsink")


def test_file_end_is_still_an_end(media, gst_modules):
    """The other side of the fix: a clean end of file is `eof`, no error."""
    source = pipeline_source(f"filesrc location={media / 'indoor_people_480p_mpeg4.avi'} ! decodebin ! {BGR_TAIL}")
    try:
        frames = 0
        while source.read() is not None:
            frames += 1
        assert frames == 84 and source.eof and source.error is None
    finally:
        source.release()


@pytest.fixture
def http_404():
    """A real HTTP server on loopback that answers every GET with 404 Not Found; yields its port."""
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_http_error_quoting_the_url_is_reported_and_redacted(gst_modules, http_404):
    """souphttpsrc's error quotes the URL it was given, password and all; it comes with an EOS."""
    launch = (f"souphttpsrc location=http://viewer:Http-Secret-7@127.0.0.1:{http_404}/video.mjpg?pwd=Qs-Secret-8 "
              f"! jpegdec ! {BGR_TAIL}")
    with pytest.raises(SourceError) as info:
        pipeline_source(launch, open_timeout_s=5.0)
    message = str(info.value)
    assert "Not Found (404)" in message and f"URL: http://***@127.0.0.1:{http_404}/video.mjpg?pwd=***" in message
    assert "Secret" not in message


# -- credentials outside URLs -----------------------------------------------------------------------
def test_credential_properties_are_hidden_when_shown():
    launch = ("rtspsrc location=rtsp://192.0.2.7/s user-id=operator user-pw=Prop-Secret-1 proxy-pw=\"Px Secret 2\" "
              "! rtph264depay ! avdec_h264 ! videoconvert ! appsink")
    shown = display_launch(launch)
    assert "user-id=*** user-pw=*** proxy-pw=*** ! rtph264depay" in shown, shown
    assert "location=rtsp://192.0.2.7/s" in shown and "operator" not in shown
    assert SECRETS.scrub("GStreamer quoted Prop-Secret-1 and Px Secret 2") == "GStreamer quoted *** and ***"
    srt = display_launch("srtsrc uri=srt://192.0.2.8:7001 passphrase='Srt Phrase 3' ! tsdemux ! appsink")
    assert "passphrase=*** ! tsdemux" in srt and "Phrase" not in srt
    escaped = display_launch(r'rtspsrc location=rtsp://192.0.2.9/s user-pw="Esc\"aped 9" ! appsink')
    assert "aped" not in escaped and SECRETS.scrub('quoted Esc"aped 9') == "quoted ***"
    short = display_launch("rtspsrc location=rtsp://192.0.2.9/s user-pw=ab1 ! appsink")
    assert "ab1" not in short  # too short to scrub from free text, still hidden where the launch is shown
    harmless = "v4l2src device=/dev/video0 ! nvvidconv ! appsink sensor-id=1 name=out"
    assert display_launch(harmless) == harmless


def test_pipeline_password_from_the_environment_never_shown(rtsp_server, gst_modules, run_reader, tmp_path, caplog):
    """The docs' `${PASSWORD}` pattern, in a user-pw property: hidden in status, events and logs."""
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not opened by the loader")
    launch = (f"rtspsrc location={rtsp_server.url()} user-id=viewer user-pw=${{CAM_PW}} protocols=tcp "
              "! application/x-rtp,media=video ! rtph264depay ! h264parse ! avdec_h264 ! " + BGR_TAIL)
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge-01\nmodel: {{path: {model}}}\ncameras:\n"
                    + textwrap.indent(f"- name: yard\n  pipeline: {launch}\n", "  "), encoding="utf-8")
    config = load_config(str(path), {"CAM_PW": "Env-Prop-Secret-4"}).cameras[0]
    assert "user-pw=Env-Prop-Secret-4" in config.pipeline
    collector = Collector()
    reader, states = run_reader(replace(config, open_timeout_s=5.0, read_timeout_s=2.0), collector)
    assert states.wait_for(CameraState.STREAMING, 10), states.events
    bad = path.read_text(encoding="utf-8").replace(BGR_TAIL, "videoconvert ! autovideosink")
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {"CAM_PW": "Env-Prop-Secret-4"})
    texts = [r.getMessage() for r in caplog.records] + [repr(reader.stats()), repr(states.events), str(info.value)]
    assert not [t for t in texts if "Env-Prop-Secret-4" in t]
    assert "user-pw=*** " in reader.stats()["url"]


# -- hostile pipelines ---------------------------------------------------------------------------------
def test_pipeline_with_a_second_appsink_fails_clearly(gst_modules, run_reader):
    """Nobody reads a second appsink: unbounded by default, it would hold every frame (measured:
    280 MB in 4 s at 640x480). The camera fails at once, no retries."""
    launch = f"videotestsrc ! video/x-raw,width=640,height=480 ! appsink videotestsrc ! {BGR_TAIL}"
    with pytest.raises(UnsupportedSourceError, match="has 2 appsinks"):
        pipeline_source(launch)
    reader, states = run_reader(pipeline_camera(launch), Collector())
    assert states.wait_for(CameraState.FAILED, 5), states.events
    assert "end the other branches in fakesink" in reader.stats()["error"] and reader.stats()["reconnects"] == 0
    fine = f"videotestsrc num-buffers=3 ! fakesink videotestsrc num-buffers=3 ! {BGR_TAIL}"
    source = pipeline_source(fine)
    source.release()


# -- a preset whose chain this machine cannot build ----------------------------------------------------
@contextmanager
def without_element(gst, name: str):
    """GStreamer as a machine without `name` has it (e.g. GStreamer 1.20, before h264timestamper):
    the feature leaves the registry, and comes back after."""
    registry = gst.Gst.Registry.get()
    feature = registry.lookup_feature(name)
    assert feature is not None, f"this machine has no {name} to take away"
    registry.remove_feature(feature)
    try:
        yield
    finally:
        registry.add_feature(feature)


def test_rtsp_preset_without_its_depayloader_fails_clearly_and_auto_passes_it_over(media, gst_modules, monkeypatch):
    """A chain element missing (GStreamer 1.20's missing h264timestamper no longer is one: the
    presets take the 1.20 chain there, tests/test_gstreamer_120.py)."""
    from yoloedge.config.schema import CameraConfig
    from yoloedge.sources.opening import choose_decoder
    monkeypatch.setitem(sys.modules, "av", None)  # without PyAV, which auto would take before GStreamer
    rtsp = CameraConfig(name="c", url="rtsp://192.0.2.1/s", decoder="gstreamer")
    with without_element(gst_modules, "rtph264depay"):
        with pytest.raises(UnsupportedSourceError) as info:
            choose_decoder(rtsp)
        assert "rtph264depay" in str(info.value) and gst_modules.Gst.version_string() in str(info.value)
        auto = choose_decoder(replace(rtsp, decoder="auto"))
        assert auto.decoder is Decoder.OPENCV and "gstreamer: avdec_h264 is here but rtph264depay is not" in auto.reason
        video = str(media / "indoor_people_480p_mpeg4.avi")  # decodebin's chain has no depayloader
        assert choose_decoder(CameraConfig(name="f", url=video, decoder="auto")).decoder is Decoder.GSTREAMER
    assert choose_decoder(rtsp).element == "avdec_h264"


# -- many reconnects -----------------------------------------------------------------------------------
def test_reconnects_leave_no_threads_or_descriptors(rtsp_server, gst_modules):
    """Twenty connections to the RTSP server, each released: what the first one left behind (GStreamer's
    thread pool, its registry) is all that stays."""
    from yoloedge.sources.opening import open_camera
    config = camera(rtsp_server.url(credentials="viewer:Leak-Secret-6"), decoder="gstreamer",
                    open_timeout_s=5.0, read_timeout_s=2.0)

    def cycle() -> None:
        source, _ = open_camera(config, camera="c")
        try:
            for _ in range(2):
                assert source.read() is not None, source.error
        finally:
            source.release()
        gc.collect()

    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

    for _ in range(3):
        cycle()
    settled = counts()
    for _ in range(20):
        cycle()
    fds, threads = counts()
    # a pooled thread may still be winding down when counted: 2 spare; a leak per connection is 20
    assert fds <= settled[0] + 2 and threads <= settled[1] + 2, (settled, (fds, threads))


def test_bench_decode_reads_the_whole_clip_with_each_decoder(media):
    """`yoloedge bench decode`: every frame through each decoder, absent hardware said, not fatal."""
    import subprocess
    import sys

    from daemon_harness import REPO

    result = subprocess.run([sys.executable, "-m", "yoloedge", "bench", "decode", "--clip",
                             str(media / "street_people_720p.mp4"), "--decoders", "opencv,gstreamer,jetson",
                             "--rounds", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
    assert rows["opencv"][1:3] == ["opencv", "314"], result.stdout
    assert rows["gstreamer"][1:3] == ["gstreamer", "314"], result.stdout
    assert "not available here: decoder: jetson needs the GStreamer element nvv4l2decoder" in result.stdout


# -- I420 frames: colours, plane layouts, no allocation per frame ---------------------------------------
#: (B, G, R) of each test colour: its ARGB for videotestsrc
#: how far from itself a colour may come back: videoconvert rounds once, swscale's fixed point
#: truncates (pure blue in BT.601 is 250: Y 40, U 239, V 110 become B = 27 + 223); 5 at most, measured
COLOUR_TOLERANCE = 6
COLOURS = {(0, 0, 255): 0xffff0000, (0, 255, 0): 0xff00ff00, (255, 0, 0): 0xff0000ff,
           (255, 255, 255): 0xffffffff, (128, 128, 128): 0xff808080, (192, 128, 48): 0xff3080c0}


def read_all(source) -> list:
    try:
        frames = []
        while (frame := source.read()) is not None:
            frames.append(frame)
        assert source.eof and source.error is None, source.error
        return frames
    finally:
        source.release()


def colour_frame(argb: int, caps: str, setter: str = "", size: tuple[int, int] = (64, 48)) -> np.ndarray:
    """One frame of a solid colour, encoded into I420 by GStreamer's videoconvert as `caps` say."""
    width, height = size
    frames = read_all(pipeline_source(f"videotestsrc num-buffers=1 pattern=solid-color foreground-color={argb} "
                                      f"! video/x-raw,format=RGB,width={width},height={height} ! videoconvert "
                                      f"! {caps} ! {setter}appsink"))
    assert len(frames) == 1 and frames[0].shape == (height, width, 3)
    return frames[0]


@pytest.mark.parametrize("colorimetry", ["bt601", "bt709", "1:4:0:0", "1:3:5:1"])
def test_i420_frames_keep_their_colours(gst_modules, colorimetry):
    """Each colour, encoded in the stated matrix and range (limited/full BT.601, limited/full
    BT.709), comes back as itself within COLOUR_TOLERANCE. BT.601 applied to BT.709 red is 22 levels
    off, limited range applied to full range 20. (That the pictures are swscale's, byte for byte,
    is `test_yuv.py`'s.)"""
    for bgr, argb in COLOURS.items():
        frame = colour_frame(argb, f"video/x-raw,format=I420,colorimetry={colorimetry}")
        assert np.abs(frame.astype(int) - bgr).max() <= COLOUR_TOLERANCE, (colorimetry, bgr, frame[0, 0])


def test_i420_frames_without_colorimetry_are_bt601(gst_modules):
    """Caps that state no colorimetry: BT.601 limited range, as FFmpeg (and so decoder: opencv)
    assumes, also for HD sizes, where GstVideo would guess BT.709 (red 22 levels off)."""
    for bgr, argb in COLOURS.items():
        frame = colour_frame(argb, "video/x-raw,format=I420,colorimetry=bt601",
                             'capssetter join=false replace=true caps="video/x-raw,format=I420,width=1280,'
                             'height=720,framerate=30/1" ! ', size=(1280, 720))
        assert np.abs(frame.astype(int) - bgr).max() <= COLOUR_TOLERANCE, (bgr, frame[0, 0])


@pytest.mark.parametrize("width, height", [(64, 48), (66, 48), (65, 49)])
def test_i420_frames_of_any_plane_layout(gst_modules, width, height):
    """64x48: the planes lie as cv2 wants them. 66 wide: every row padded (strides 68 and 36).
    65x49: odd sides too (chroma 33x25). The reference is the same frames through videoconvert with
    the chroma repeated, not interpolated (chroma-mode=none): rounding apart, 1.6 grey levels at
    most (measured); a wrong stride shears the picture, a misplaced chroma plane discolours it."""
    for pattern in ("smpte", "ball"):
        head = (f"videotestsrc num-buffers=3 pattern={pattern} "
                f"! video/x-raw,format=I420,width={width},height={height},colorimetry=bt601")
        ours = read_all(pipeline_source(f"{head} ! appsink"))
        reference = read_all(pipeline_source(f"{head} ! videoconvert chroma-mode=none dither=none "
                                             "! video/x-raw,format=BGR ! appsink"))
        assert len(ours) == len(reference) == 3
        for mine, theirs in zip(ours, reference):
            assert mine.shape == (height, width, 3)
            assert np.abs(mine.astype(int) - theirs).mean() <= 2.5, (pattern, width, height)


@pytest.mark.parametrize("caps", ["format=I420,width=640,height=480,colorimetry=bt601",
                                  "format=I420,width=640,height=480,colorimetry=bt709",
                                  "format=I420,width=321,height=241,colorimetry=bt601",
                                  "format=BGR,width=640,height=480"])
def test_reused_frame_is_filled_without_allocating(gst_modules, caps):
    """reuse_frame: every read fills the first frame's array, and nothing frame-sized is allocated
    after it (tracemalloc sees numpy's and cv2's arrays); the pictures are those a fresh array gets.
    Allowed: PyGObject's copy of the mapped buffer (without gst-python's overrides MapInfo.data is
    a new bytes object per map)."""
    from yoloedge.sources.gstreamer import gst
    g = gst()
    buffer_bytes = g.GstVideo.VideoInfo.new_from_caps(g.Gst.Caps.from_string(f"video/x-raw,{caps}")).size
    launch = f"videotestsrc num-buffers=8 pattern=ball ! video/x-raw,{caps} ! appsink"
    fresh = [hashlib.sha256(frame).hexdigest() for frame in read_all(pipeline_source(launch))]
    source = pipeline_source(launch)
    source.reuse_frame = True
    try:
        first = source.read()
        assert first is not None
        seen, same = [hashlib.sha256(first).hexdigest()], True
        tracemalloc.start()
        try:
            for _ in range(7):
                frame = source.read()
                same = same and frame is first
                seen.append(hashlib.sha256(frame).hexdigest())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        source.release()
    assert same and seen == fresh and len(set(seen)) == 8
    assert peak < buffer_bytes + first.nbytes // 10, (peak, buffer_bytes, first.nbytes)
