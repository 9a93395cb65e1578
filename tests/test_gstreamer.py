"""GStreamer decoding (`decoder:` and `pipeline:` cameras): real GStreamer, the real test RTSP
server, the shared videos and the real ONNX Runtime model.

The software decoders stand in for the hardware ones, which this suite cannot have: the hardware
presets are checked by their launch strings and by failing clearly where their elements are
missing. Everything else -- the state machine, timeouts, stalls, reconnects, lossless files,
detections -- runs for real through `decoder: gstreamer`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest

from fixtures_media import RTSP_SCRIPT, SYSTEM_PYTHON, RtspServer, free_port
import test_sources
from test_sources import Collector, camera, wait_until
from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import CameraConfig
from yoloedge.redact import SECRETS, redact_url
from yoloedge.sources import CameraState
from yoloedge.config.sources import Decoder, display_launch, gi_installed, launch_problem, launch_urls
from yoloedge.sources.base import SourceKind, UnsupportedSourceError
from yoloedge.sources.gstlaunch import PRESETS, file_launch, rtsp_launch, with_location

pytestmark = pytest.mark.shared

REPO = Path(__file__).resolve().parent.parent
MP4 = "street_people_720p.mp4"  # H.264, 1280x720, 29.97 fps, 314 frames, a key frame every 15
AVI = "indoor_people_480p_mpeg4.avi"  # MPEG-4 part 2, 640x480, 15 fps, 84 frames
MODEL = "yolov8n_coco_int8.onnx"
STALL_TIMEOUT_S = 2.0
GOP = 15

run_reader = test_sources.run_reader  # the fixture: start(config, collector, stall_timeout_s) -> (reader, states)


@pytest.fixture(scope="module")
def gst_modules():
    """GStreamer through PyGObject (the `gstreamer` extra, part of `dev`)."""
    if not gi_installed():
        pytest.skip("PyGObject is not installed: pip install yoloedge[gstreamer]")
    from yoloedge.sources.gstreamer import gst
    return gst()


@pytest.fixture(scope="module")
def detector(models):
    from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
    from yoloedge.config import ModelConfig
    from yoloedge.pipeline.detector import Detector
    path = str(models / MODEL)
    detector = Detector(ModelConfig(path=path), OnnxRuntimeBackend(path))
    yield detector
    detector.close()


@pytest.fixture(scope="module")
def audio_mp4(media, tmp_path_factory, gst_modules) -> Path:
    """The street clip's video (not re-encoded) muxed with an AAC test tone: a file with two tracks."""
    out = tmp_path_factory.mktemp("gst") / "street_with_audio.mp4"
    launch = (f"filesrc location={media / MP4} ! qtdemux name=d d.video_0 ! queue ! h264parse ! mp4mux name=m "
              f"! filesink location={out} audiotestsrc num-buffers=500 ! audioconvert ! avenc_aac ! queue ! m.")
    subprocess.run(["gst-launch-1.0", "-q", *launch.split()], check=True, timeout=60)
    return out


def open_camera(config: CameraConfig):
    from yoloedge.sources.opening import open_camera as open_
    return open_(config, camera=config.name)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A small picture: enough to tell frames of a video (and their colours) apart, cheap to compare."""
    return cv2.resize(image, (96, 54), interpolation=cv2.INTER_AREA).astype(np.float32)


def closest(thumb: np.ndarray, thumbs: list[np.ndarray]) -> int:
    return int(np.argmin([np.abs(thumb - other).mean() for other in thumbs]))


def file_thumbnails(path: Path, count: int | None = None) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    thumbs = []
    while count is None or len(thumbs) < count:
        ok, image = cap.read()
        if not ok:
            break
        thumbs.append(thumbnail(image))
    cap.release()
    return thumbs


# -- the same pictures, the same detections -------------------------------------------------------
# Both paths decode with FFmpeg; OpenCV converts with swscale, `sources/yuv.py` computes what swscale
# would from GStreamer's I420 (the stream's matrix and range, swscale's fixed-point arithmetic), so
# every frame of both shared videos is the same, byte for byte, and so are the detections: classes,
# boxes and scores, compared exactly. (When cv2.cvtColor or one float matrix made the BGR, frames were
# 0.9 to 1.4 grey levels brighter in every channel, at most 3, and the dynamically quantised model's
# borderline detections came and went: that needed a rule of its own, `disagreements`, which the live
# streams below still use to tell a late frame from the same one.)
#
# The rule for live streams: each detection scoring >= 0.40 on one side has one of the same class on
# the other at IoU >= 0.70. A picture shifted by 8 pixels breaks it on 10 to 13 of 15 detections, one
# taken half a second later on 17 to 19 of 15 (measured, frames 0 and 20).
PIXEL_TOLERANCE = 2.0
DETECTION_SCORE = 0.40
DETECTION_IOU = 0.70


def detections(detector, image: np.ndarray) -> list[dict]:
    return detector.detect([image])[0].to_dicts(detector.labels)


def disagreements(ours: list[dict], reference: list[dict]) -> list[str]:
    """Detections scoring >= DETECTION_SCORE on one side without a same-class partner at IoU >=
    DETECTION_IOU on the other."""
    from yoloedge.verify import iou

    def lonely(side: list[dict], other: list[dict]) -> list[dict]:
        return [d for d in side if d["score"] >= DETECTION_SCORE and not any(
            o["class_id"] == d["class_id"] and iou(o["box"], d["box"]) >= DETECTION_IOU for o in other)]
    return ([f"ours {d} has no reference partner" for d in lonely(ours, reference)]
            + [f"reference {d} has no partner among ours" for d in lonely(reference, ours)])


def same_picture(ours: np.ndarray, reference: list[np.ndarray]) -> str | None:
    """Why thumbnail `ours` is not reference[0] (its neighbours follow in `reference`), or None."""
    differences = [float(np.abs(ours - other).mean()) for other in reference]
    if differences[0] > PIXEL_TOLERANCE:
        return f"differs by {differences[0]:.2f} grey levels on average"
    if int(np.argmin(differences)) != 0:
        return f"is closer to a neighbouring frame ({differences})"
    return None


def unequal(ours: np.ndarray, reference: np.ndarray) -> str | None:
    """How two frames differ (shape, or each channel's mean difference and the largest), or None."""
    if ours.shape != reference.shape:
        return f"is {ours.shape[1]}x{ours.shape[0]}, not {reference.shape[1]}x{reference.shape[0]}"
    if np.array_equal(ours, reference):
        return None
    delta = ours.astype(int) - reference
    return f"differs by {delta.mean(axis=(0, 1)).round(2).tolist()} on average, {int(np.abs(delta).max())} at most"


def compare_files(path: Path, detector, every: int) -> tuple[int, int]:
    """Read the file through both decoders in step: every frame must be the same picture, byte for
    byte, and every `every`-th frame must give the same detections, exactly. Returns (frames read by
    GStreamer, frames read by OpenCV)."""
    gst_source, decoder = open_camera(CameraConfig(name="gst", url=str(path), decoder="gstreamer"))
    cv_source, _ = open_camera(CameraConfig(name="cv", url=str(path), decoder="opencv"))
    assert decoder is Decoder.GSTREAMER and gst_source.kind is SourceKind.FILE
    try:
        counts, compared = [0, 0], 0
        while True:
            ours, reference = gst_source.read(), cv_source.read()
            counts[0] += ours is not None
            counts[1] += reference is not None
            if ours is None or reference is None:
                break
            index = counts[0] - 1
            problem = unequal(ours, reference)
            assert problem is None, f"frame {index} is not OpenCV's frame {index}: it {problem}"
            if index % every == 0:
                ours_found, theirs = detections(detector, ours), detections(detector, reference)
                assert ours_found == theirs, f"frame {index}: {ours_found} != {theirs}"
                compared += 1
        assert gst_source.eof and gst_source.error is None, gst_source.error
        assert compared >= 5
        return counts[0], counts[1]
    finally:
        gst_source.release()
        cv_source.release()


@pytest.mark.parametrize("name, frames, every", [(MP4, 314, 20), (AVI, 84, 6)])
def test_files_decode_to_the_same_pictures_and_detections_as_opencv(media, detector, gst_modules, name, frames,
                                                                      every):
    assert compare_files(media / name, detector, every) == (frames, frames)


def test_file_with_an_audio_track_gives_the_video_only(audio_mp4, detector):
    assert compare_files(audio_mp4, detector, 40) == (314, 314)


def test_the_checks_can_fail(media, detector, gst_modules):
    """One grey level in one pixel fails the exact check; a red/blue swap the thumbnail check (live
    streams); a shifted picture or a later frame the detections rule."""
    source, _ = open_camera(CameraConfig(name="gst", url=str(media / MP4), decoder="gstreamer"))
    try:
        frames = [source.read() for _ in range(GOP + 1)]
    finally:
        source.release()
    first = frames[0]
    one_level = first.copy()
    one_level[100, 200, 1] ^= 1
    assert unequal(one_level, first) == "differs by [0.0, 0.0, 0.0] on average, 1 at most"
    assert same_picture(thumbnail(np.ascontiguousarray(first[:, :, ::-1])), [thumbnail(first)]) is not None
    assert same_picture(thumbnail(frames[1]), [thumbnail(first), thumbnail(frames[1])]) is not None
    reference = detections(detector, first)
    assert disagreements(detections(detector, np.roll(first, 8, axis=1)), reference)
    assert disagreements(detections(detector, frames[GOP]), reference)


def test_realtime_false_file_is_lossless_through_the_reader(media, gst_modules, run_reader):
    """Every one of the 314 frames, in order, to a consumer slower than the decoder: the appsink
    holds the decoder back instead of dropping."""
    collector = Collector(size=2, lossless=True, delay_s=0.003)
    reader, states = run_reader(camera(media / MP4, decoder="gstreamer", realtime=False), collector)
    assert states.wait_for(CameraState.ENDED, 60), states.events
    assert collector.wait_count(314, 5)
    assert collector.seqs == list(range(314)) and collector.queue.dropped == 0
    stats = reader.stats()
    assert stats["frames_in"] == 314 and stats["decoder"] == "gstreamer"
    assert states.events[-1][3] == "end of file"


def test_file_with_loop_starts_again(media, gst_modules, run_reader):
    collector = Collector(size=4, lossless=True, keep_images=100)
    reader, states = run_reader(camera(media / AVI, decoder="gstreamer", realtime=False, loop=True), collector)
    assert collector.wait_count(100, 20)
    reader.stop()
    assert reader.join(5)
    assert collector.seqs == list(range(len(collector.seqs)))
    assert np.array_equal(collector.seen[0].image, collector.seen[84].image)  # frame 84 is frame 0 again
    assert CameraState.ENDED not in states.states and reader.stats()["reconnects"] == 0  # looped, not failed


def test_looping_source_never_fails_or_waits(media, gst_modules):
    """Many passes of a file, every read a frame at once: no error, no read timeout at the seams."""
    source, _ = open_camera(CameraConfig(name="loop", url=str(media / AVI), decoder="gstreamer", loop=True,
                                         read_timeout_s=5.0))
    try:
        for index in range(84 * 4):
            assert source.read() is not None, f"frame {index}: {source.error}"
    finally:
        source.release()


# -- RTSP --------------------------------------------------------------------------------------------
def read_stream(config: CameraConfig, count: int, keep: set[int]) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    source, _ = open_camera(config)
    try:
        thumbs, kept = [], {}
        for index in range(count):
            image = source.read()
            assert image is not None, source.error
            thumbs.append(thumbnail(image))
            if index in keep:
                kept[index] = image
        return thumbs, kept
    finally:
        source.release()


def read_clip_frames(config: CameraConfig, count: int, reference: list[np.ndarray],
                     every: int) -> tuple[list[int], dict[int, np.ndarray]]:
    """`count` frames of a live stream of the clip: which of the clip's frames each is (by
    thumbnail), and the pictures of those whose index is a multiple of `every`."""
    source, _ = open_camera(config)
    try:
        indices, kept = [], {}
        for _ in range(count):
            image = source.read()
            assert image is not None, source.error
            index = closest(thumbnail(image), reference)
            indices.append(index)
            if index % every == 0:
                kept[index] = image
        return indices, kept
    finally:
        source.release()


def test_rtsp_decodes_to_the_same_pictures_and_detections_as_opencv(media, rtsp_server, detector, gst_modules):
    """Each client of the test server gets the clip from its first frame: both decoders deliver the
    clip's frames in order (OpenCV every one; GStreamer's live appsink drops the oldest when the
    reader falls behind, as on a loaded machine), and the same frame is the same picture, byte for
    byte, with exactly the same detections."""
    reference = file_thumbnails(media / MP4, 60)
    streams = {}
    for decoder in ("gstreamer", "opencv"):
        config = CameraConfig(name=decoder, url=rtsp_server.url(), decoder=decoder, open_timeout_s=5.0,
                              read_timeout_s=3.0)
        indices, kept = read_clip_frames(config, 40, reference, GOP)
        assert indices[0] == 0 and all(a < b for a, b in zip(indices, indices[1:])), (decoder, indices)
        streams[decoder] = kept
    assert indices == list(range(40))  # OpenCV's
    common = sorted(set(streams["gstreamer"]) & set(streams["opencv"]))
    assert common[:1] == [0] and len(common) >= 2, common
    for index in common:
        ours, theirs = streams["gstreamer"][index], streams["opencv"][index]
        problem = unequal(ours, theirs)
        assert problem is None, f"frame {index}: it {problem}"
        assert detections(detector, ours) == detections(detector, theirs), index


MID_GOP_SERVER = textwrap.dedent("""
    import dataclasses, sys
    sys.path.insert(0, sys.argv[1])
    import rtsp_server
    load, skip = rtsp_server.load_h264, int(sys.argv[4])
    def parameter_sets(data):
        nals = data.split(b"\\x00\\x00\\x01")
        return b"".join(b"\\x00\\x00\\x00\\x01" + n.rstrip(b"\\x00") for n in nals if n and (n[0] & 0x1F) in (7, 8))
    def load_from_mid_gop(path):
        clip = load(path)
        sets = parameter_sets(clip.units[0].data)
        units = [dataclasses.replace(u, data=sets + u.data) if i == 0 or not u.delta else u
                 for i, u in enumerate(clip.units[skip:])]
        return rtsp_server.H264Clip(clip.caps, tuple(units), clip.duration)
    rtsp_server.load_h264 = load_from_mid_gop
    sys.exit(rtsp_server.main(["--file", sys.argv[2], "--port", sys.argv[3]]))
    """)


class MidGopServer(RtspServer):
    """The test server with its clip cut `skip` frames in, as a camera joined mid-GOP: the
    parameter sets come first (as from the SDP), then P-frames whose reference pictures the
    client never gets, then the next key frame (with its parameter sets, as cameras send them)."""

    skip = 5

    def start(self) -> "MidGopServer":
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", MID_GOP_SERVER, str(RTSP_SCRIPT.parent), self.video,
                                      str(self.port), str(self.skip)],
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.port = self._wait_ready()
        return self


def test_rtsp_stream_starting_mid_gop_decodes_from_the_next_key_frame(media, gst_rtsp_available, gst_modules):
    server = MidGopServer(media / MP4, loop=False).start()
    try:
        config = CameraConfig(name="mid", url=server.url(), decoder="gstreamer", open_timeout_s=5.0,
                              read_timeout_s=3.0)
        preset, _ = read_stream(config, 20, set())
        naive = ("rtspsrc location={} protocols=tcp ! application/x-rtp,media=video ! rtph264depay ! h264parse "
                 "! avdec_h264 ! videoconvert ! video/x-raw,format=BGR ! appsink").format(server.url())
        without_keyframe_wait, _ = read_stream(replace(config, url="", pipeline=naive), 1, set())
    finally:
        server.close()
    reference = file_thumbnails(media / MP4, 60)
    # The preset: the next key frame first (frame 15), then every frame after it, intact.
    assert [closest(t, reference) for t in preset] == list(range(GOP, GOP + 20))
    assert all(same_picture(t, [reference[GOP + i]]) is None for i, t in enumerate(preset))
    # The same stream without request-keyframe/wait-for-keyframe: the decoder conceals the missing
    # references and hands out a picture that is none of the clip's.
    assert all(same_picture(without_keyframe_wait[0], [r]) is not None for r in reference)


def test_rtsp_server_killed_then_restarted_streams_again(rtsp_server, gst_modules, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(rtsp_server.url(), decoder="gstreamer"), collector)
    assert states.wait_for(CameraState.STREAMING, 10), states.events
    rtsp_server.kill()
    assert wait_until(lambda: reader.state is not CameraState.STREAMING, 5)
    time.sleep(1.0)  # a few refused reconnects
    restarted = time.monotonic()
    rtsp_server.restart()
    assert states.wait_for(CameraState.STREAMING, 10, after=restarted) is not None, states.events
    count = len(collector.seen)
    assert collector.wait_count(count + 10, 5)
    stats = reader.stats()
    assert stats["reconnects"] >= 1 and stats["decoder"] == "gstreamer"


def test_rtsp_server_frozen_is_a_stall_and_recovers(rtsp_server, gst_modules, run_reader):
    collector = Collector()
    reader, states = run_reader(camera(rtsp_server.url(), decoder="gstreamer"), collector, STALL_TIMEOUT_S)
    assert states.wait_for(CameraState.STREAMING, 10)
    assert collector.wait_count(10, 5)
    frozen = time.monotonic()
    rtsp_server.freeze()
    stalled = states.wait_for(CameraState.STALLED, STALL_TIMEOUT_S + 2.0, after=frozen)
    assert stalled is not None, states.events
    assert reader.stats()["stalls"] == 1
    time.sleep(1.0)
    resumed = time.monotonic()
    rtsp_server.resume()
    assert states.wait_for(CameraState.STREAMING, 10, after=resumed) is not None, states.events
    count = len(collector.seen)
    assert collector.wait_count(count + 10, 5)


def test_unreachable_rtsp_url_fails_without_showing_its_credentials(gst_modules, run_reader):
    url = f"rtsp://admin:gst-Secret-9@127.0.0.1:{free_port()}/stream"
    reader, states = run_reader(camera(url, decoder="gstreamer", max_retries=2), Collector())
    assert states.wait_for(CameraState.FAILED, 15), states.events
    stats = reader.stats()
    assert "gst-Secret-9" not in repr(stats) + repr(states.events)
    assert stats["url"] == redact_url(url) and stats["error"]


# -- auto, hardware presets ----------------------------------------------------------------------------
def test_auto_picks_gstreamer_here_and_status_says_so(media, gst_modules, run_reader, monkeypatch):
    """Without PyAV (which auto prefers to software GStreamer, tests/test_pyav.py)."""
    for element in ("nvv4l2decoder", "nvh264dec", "vah264dec", "vaapih264dec"):
        if gst_modules.Gst.ElementFactory.find(element) is not None:
            pytest.skip(f"this machine has {element}: auto picks hardware")
    monkeypatch.setitem(sys.modules, "av", None)
    collector = Collector(size=2, lossless=True)
    config = camera(media / AVI, decoder="auto", realtime=False)
    reader, states = run_reader(config, collector)
    assert reader.stats()["decoder"] in ("auto", "gstreamer")  # before the first connection opens
    assert states.wait_for(CameraState.ENDED, 20)
    assert reader.stats()["decoder"] == "gstreamer" and len(collector.seen) == 84
    from yoloedge.pipeline.cameras import CameraRuntime
    assert CameraRuntime(config, "cpu", None, reader).status()["decoder"] == "gstreamer"
    from yoloedge.sources.opening import choose_decoder
    rtsp = choose_decoder(CameraConfig(name="c", url="rtsp://127.0.0.1/s", decoder="auto"))
    assert (rtsp.decoder, rtsp.element) == (Decoder.GSTREAMER, "avdec_h264")
    http = choose_decoder(CameraConfig(name="c", url="http://127.0.0.1/video.mjpg", decoder="auto"))
    assert http.decoder is Decoder.OPENCV  # the presets read RTSP and files only


@pytest.mark.parametrize("decoder, element", [("jetson", "nvv4l2decoder"), ("vaapi", "vah264dec"),
                                              ("nvidia", "nvh264dec")])
def test_hardware_preset_without_its_elements_fails_the_camera_clearly(media, gst_modules, run_reader,
                                                                       decoder, element):
    if gst_modules.Gst.ElementFactory.find(element) is not None:
        pytest.skip(f"this machine has {element}")
    reader, states = run_reader(camera(media / MP4, decoder=decoder), Collector())
    assert states.wait_for(CameraState.FAILED, 10), states.events
    reason = states.events[-1][3]
    assert f"decoder: {decoder} needs the GStreamer element {element}" in reason
    assert "decoder: gstreamer" in reason and reader.stats()["reconnects"] == 0  # no retries: it cannot work


# The launch strings are written out here, not built: they are what docs/hardware/video-decode.md documents and
# what was run (the software ones by these tests, the hardware ones on their hardware by others).
SINK_LIVE = "video/x-raw,format=I420 ! appsink name=yoloedge_sink max-buffers=2 drop=true sync=false"
SINK_FILE = "video/x-raw,format=I420 ! appsink name=yoloedge_sink max-buffers=2 drop=false sync=false"
RTSP_HEAD = ("rtspsrc name=yoloedge_src protocols=tcp latency=200 drop-on-latency=true tcp-timeout=10000000 "
             "! application/x-rtp,media=video ! queue ! rtph264depay request-keyframe=true wait-for-keyframe=true "
             "! h264parse ! h264timestamper")
LAUNCH = {
    ("gstreamer", "rtsp"): f"{RTSP_HEAD} ! avdec_h264 ! videoconvert ! {SINK_LIVE}",
    ("jetson", "rtsp"): f"{RTSP_HEAD} ! nvv4l2decoder ! nvvidconv ! {SINK_LIVE}",
    ("vaapi", "rtsp"): f"{RTSP_HEAD} ! vah264dec ! videoconvert ! {SINK_LIVE}",
    ("nvidia", "rtsp"): f"{RTSP_HEAD} ! nvh264dec ! videoconvert ! {SINK_LIVE}",
    ("gstreamer", "file"): f"filesrc name=yoloedge_src ! decodebin name=yoloedge_decode ! videoconvert ! {SINK_FILE}",
    ("jetson", "file"): f"filesrc name=yoloedge_src ! parsebin ! h264parse ! nvv4l2decoder ! nvvidconv ! {SINK_FILE}",
    ("vaapi", "file"): f"filesrc name=yoloedge_src ! parsebin ! h264parse ! vah264dec ! videoconvert ! {SINK_FILE}",
    ("nvidia", "file"): f"filesrc name=yoloedge_src ! parsebin ! h264parse ! nvh264dec ! videoconvert ! {SINK_FILE}",
}


@pytest.mark.parametrize("decoder, kind", sorted(LAUNCH))
def test_preset_launch_strings(decoder, kind):
    preset = PRESETS[Decoder(decoder)]
    element = preset.elements[0]
    launch = rtsp_launch(preset, element, 10.0) if kind == "rtsp" else file_launch(preset, element)
    assert launch == LAUNCH[decoder, kind]


def test_vaapi_preset_takes_the_older_plugin_too():
    assert PRESETS[Decoder.VAAPI].elements == ("vah264dec", "vaapih264dec")
    assert "! vaapih264dec !" in rtsp_launch(PRESETS[Decoder.VAAPI], "vaapih264dec", 10.0)


def test_shown_launch_strings_hide_credentials():
    url = "rtsp://admin:Gst-Pass-77@192.0.2.10:554/Streaming/Channels/101"
    shown = with_location(LAUNCH["nvidia", "rtsp"], url)
    assert "Gst-Pass-77" not in shown and "location=rtsp://***@192.0.2.10:554/Streaming/Channels/101" in shown
    launch = 'rtspsrc location="rtsp://me:pass word-42@192.0.2.11/s" ! decodebin ! videoconvert ! appsink'
    assert launch_urls(launch) == ["rtsp://me:pass word-42@192.0.2.11/s"]
    assert "word-42" not in display_launch(launch) and "192.0.2.11/s" in display_launch(launch)
    assert "word-42" not in SECRETS.scrub(f"error quoting {launch}")


def test_launch_string_must_end_in_an_appsink():
    assert launch_problem("videotestsrc ! videoconvert ! appsink name=out max-buffers=3") is None
    assert launch_problem("videotestsrc ! autovideosink") is not None
    assert launch_problem('videotestsrc ! textoverlay text="a ! appsink" ! fakesink') is not None
    assert launch_problem("videotestsrc ! appsink !") is not None


# -- pipeline: ----------------------------------------------------------------------------------------
def pipeline_camera(launch: str, **overrides) -> CameraConfig:
    return replace(camera("", decoder="gstreamer", **overrides), pipeline=launch)


def test_pipeline_camera_reads_its_launch_string(gst_modules, run_reader):
    launch = ("videotestsrc num-buffers=40 pattern=ball ! video/x-raw,width=320,height=240,framerate=30/1 "
              "! videoconvert ! video/x-raw,format=BGR ! appsink")
    collector = Collector(size=2, lossless=True, keep_images=1)
    reader, states = run_reader(pipeline_camera(launch, realtime=False), collector)
    assert states.wait_for(CameraState.ENDED, 10), states.events
    assert collector.wait_count(40, 2) and collector.seqs == list(range(40))
    assert collector.seen[0].shape == (240, 320, 3)
    assert states.events[-1][3] == "end of stream"
    assert reader.stats()["decoder"] == "gstreamer" and reader.stats()["url"] == launch


def test_pipeline_camera_over_rtsp_hides_credentials(rtsp_server, gst_modules, run_reader, caplog):
    url = rtsp_server.url(credentials="viewer:Pipe-Secret-5")
    launch = (f"rtspsrc location={url} protocols=tcp ! application/x-rtp,media=video ! rtph264depay "
              "! h264parse ! avdec_h264 ! videoconvert ! video/x-raw,format=BGR ! appsink")
    collector = Collector()
    reader, states = run_reader(pipeline_camera(launch), collector)
    assert states.wait_for(CameraState.STREAMING, 10), states.events
    assert collector.wait_count(10, 5) and collector.seen[0].shape == (720, 1280, 3)
    bad = launch.replace("/stream", "/nothing-here")
    broken, broken_states = run_reader(pipeline_camera(bad, max_retries=1), Collector())
    assert broken_states.wait_for(CameraState.FAILED, 10)
    texts = [r.getMessage() for r in caplog.records] + [repr(reader.stats()), repr(broken.stats())]
    texts += [repr(e) for e in states.events + broken_states.events]
    assert not [t for t in texts if "Pipe-Secret-5" in t]
    assert "rtsp://***@127.0.0.1" in reader.stats()["url"] and "Not Found" in broken.stats()["error"]


def test_pipeline_that_does_not_deliver_bgr_is_a_clear_error(gst_modules, run_reader):
    launch = "videotestsrc ! video/x-raw,format=NV12,width=64,height=48 ! appsink caps=video/x-raw,format=NV12"
    reader, states = run_reader(pipeline_camera(launch, max_retries=1), Collector())
    assert states.wait_for(CameraState.FAILED, 10), states.events
    error = reader.stats()["error"]
    assert "must receive video/x-raw,format=BGR (or I420), not video/x-raw, format=(string)NV12" in error
    assert error.endswith("end the pipeline with videoconvert ! video/x-raw,format=BGR ! appsink")


def test_pipeline_with_an_unknown_element_fails_at_once(gst_modules, run_reader):
    reader, states = run_reader(pipeline_camera("videotestsrc ! nosuchdecoder ! appsink"), Collector())
    assert states.wait_for(CameraState.FAILED, 5), states.events
    assert 'no element "nosuchdecoder"' in reader.stats()["error"] and reader.stats()["reconnects"] == 0


def test_silent_pipeline_read_times_out(gst_modules):
    """A live source that stops sending: the read returns at its timeout, not never."""
    from yoloedge.sources.gstreamer import GStreamerSource, LaunchSpec
    launch = ("videotestsrc is-live=true ! video/x-raw,width=64,height=48,framerate=30/1 "
              "! valve name=v ! videoconvert ! appsink name=s")
    spec = LaunchSpec(launch, SourceKind.PIPELINE, "test", Decoder.GSTREAMER, sink_name="s", user_pipeline=True)
    source = GStreamerSource(spec, read_timeout_s=0.5)
    try:
        assert source.is_live and source.read() is not None
        source._pipeline.get_by_name("v").set_property("drop", True)
        started = time.monotonic()
        while source.read() is not None:
            pass
        waited = time.monotonic() - started
        assert source.error == "test: no frame for 0.5 s (read timed out)" and not source.eof
        assert waited < 3.0  # not a speed check: the read came back at all, soon after its timeout
    finally:
        source.release()
        source.release()  # idempotent
    assert source.read() is None and source.error == "source released"


# -- configuration -------------------------------------------------------------------------------------
def write_config(tmp_path: Path, camera_yaml: str) -> Path:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not opened by the loader")
    path = tmp_path / "yoloedge.yaml"
    path.write_text(f"device_id: edge-01\nmodel: {{path: {model}}}\ncameras:\n"
                    + textwrap.indent(textwrap.dedent(camera_yaml).strip("\n"), "  ") + "\n", encoding="utf-8")
    return path


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert info.value.exit_code == 78
    return info.value


def test_config_reads_decoder_and_pipeline(tmp_path, gst_modules):
    path = write_config(tmp_path, """
        - {name: a, url: rtsp://192.0.2.1/s, decoder: nvidia}
        - {name: b, url: /srv/v.mp4}
        - name: c
          pipeline: videotestsrc ! videoconvert ! video/x-raw,format=BGR ! appsink
        """)
    cameras = load_config(str(path), {}).cameras
    assert [c.decoder for c in cameras] == ["nvidia", "opencv", "gstreamer"]
    assert cameras[2].url == "" and cameras[2].pipeline.endswith("appsink")


BAD = [
    ("bad-decoder", "- {name: a, url: rtsp://h/s, decoder: cuda}\n", 4, "cameras[0].decoder",
     "must be one of: opencv, pyav, gstreamer, jetson, vaapi, nvidia, dvpp, auto"),
    ("url-and-pipeline", "- name: a\n  url: rtsp://h/s\n  pipeline: videotestsrc ! appsink\n", 6,
     "cameras[0].pipeline", "url: and pipeline: are both given"),
    ("no-source", "- name: a\n  fps: 5\n", 4, "cameras[0].url", "required key is missing"),
    ("no-appsink", "- name: a\n  pipeline: videotestsrc ! autovideosink\n", 5, "cameras[0].pipeline",
     "must end in an appsink"),
    ("pipeline-with-hardware-decoder", "- name: a\n  pipeline: videotestsrc ! appsink\n  decoder: nvidia\n", 6,
     "cameras[0].decoder", "decoded by the elements of its launch string"),
    ("preset-on-http", "- {name: a, url: http://h/v.mjpg, decoder: gstreamer}\n", 4, "cameras[0].decoder",
     "reads rtsp:// cameras and video files only"),
    ("preset-on-device", "- {name: a, url: /dev/video0, decoder: vaapi}\n", 4, "cameras[0].decoder",
     "use decoder: opencv (or auto), or give a pipeline:"),
]


@pytest.mark.parametrize("text, line, key_path, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_decoder_config_names_file_line_key_and_fix(tmp_path, gst_modules, text, line, key_path, fragment):
    path = write_config(tmp_path, text)
    err = config_error(path)
    assert len(err.issues) == 1, str(err)
    assert str(err).startswith(f"{path}:{line}: {key_path}: "), str(err)
    assert fragment in str(err)


def test_pipeline_errors_never_show_credentials(tmp_path, gst_modules):
    path = write_config(tmp_path, """
        - name: a
          pipeline: rtspsrc location=rtsp://admin:Cfg-Secret-3@192.0.2.5/s ! decodebin ! fakesink
        """)
    err = config_error(path)
    assert "must end in an appsink" in str(err) and "Cfg-Secret-3" not in str(err)


WITHOUT_GI = ("import sys; sys.modules['gi'] = None; sys.argv[0] = 'yoloedge'; "
              "from yoloedge.cli.main import main; sys.exit(main())")


def run_check_without_gi(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_GI, "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_check_without_pygobject_names_the_extra(tmp_path):
    path = write_config(tmp_path, "- {name: a, url: rtsp://h/s, decoder: gstreamer}\n"
                                  "- name: b\n  pipeline: videotestsrc ! videoconvert ! appsink\n")
    result = run_check_without_gi(path)
    assert result.returncode == 78, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"{path}:4: cameras[0].decoder: decoder: gstreamer needs GStreamer's Python bindings")
    assert lines[1].startswith(f"{path}:6: cameras[1].pipeline: pipeline: needs GStreamer's Python bindings")
    assert "pip install yoloedge[gstreamer]" in result.stderr and "Traceback" not in result.stderr


def test_auto_and_opencv_need_no_pygobject(tmp_path, media):
    """auto falls back to OpenCV without PyGObject; opencv never imports gi, not even to read."""
    path = write_config(tmp_path, f"- {{name: a, url: {media / AVI}, decoder: auto}}\n- {{name: b, url: rtsp://h/s}}\n")
    assert run_check_without_gi(path).returncode == 0
    script = ("import sys\n"
              "from yoloedge.config.schema import CameraConfig\n"
              "from yoloedge.sources.opening import open_camera\n"
              f"source, decoder = open_camera(CameraConfig(name='a', url={str(media / AVI)!r}))\n"
              "assert source.read() is not None\n"
              "source.release()\n"
              "print(decoder.value, 'gi' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["opencv", "False"], result.stderr


def test_gstreamer_without_pygobject_is_an_unsupported_source(monkeypatch):
    """At run time too (a config checked elsewhere): a clear error, the camera fails, no retries."""
    from yoloedge.sources import gstreamer, opening
    monkeypatch.setattr(gstreamer, "_gst", None)
    monkeypatch.setitem(sys.modules, "gi", None)
    monkeypatch.setitem(sys.modules, "av", None)  # auto's other choice before OpenCV (tests/test_pyav.py)
    with pytest.raises(UnsupportedSourceError, match=r"pip install yoloedge\[gstreamer\]"):
        opening.choose_decoder(CameraConfig(name="a", url="rtsp://h/s", decoder="gstreamer"))
    choice = opening.choose_decoder(CameraConfig(name="a", url="rtsp://h/s", decoder="auto"))
    assert choice.decoder is Decoder.OPENCV
