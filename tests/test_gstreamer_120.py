"""The presets on GStreamer 1.20 (Ubuntu 22.04, JetPack 6), which has no h264timestamper, and no
silent fallback to the CPU.

This machine has GStreamer 1.22. 1.20 is stood in for twice: the launch strings are checked
against a recorded list of what 1.20 has (`gst120_elements.py`, with its sources), and the 1.20
chain runs for real here with h264timestamper taken out of the registry and the software decoder
(avdec_h264) in the hardware one's place, on the shared B-frame clip served over RTSP -- B-frames
are what make a missing DTS matter, if anything does. nvv4l2decoder itself is not run
(UNCONFIRMED on a Jetson, `gstlaunch`'s docstring).
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import test_gstreamer
import test_gstreamer_edges
import test_sources
from gst120_elements import CAPS_MEDIA_TYPES, ELEMENTS_1_20, JETPACK_ONLY, NOT_IN_1_20
from test_sources import Collector, camera
from yoloedge.config.schema import CameraConfig
from yoloedge.config.sources import Decoder
from yoloedge.sources import CameraState
from yoloedge.sources.base import UnsupportedSourceError
from yoloedge.sources.gstlaunch import PRESETS, Preset, RtspChain, file_launch, rtsp_launch

pytestmark = pytest.mark.shared

run_reader = test_sources.run_reader  # the fixtures
gst_modules = test_gstreamer.gst_modules
without_element = test_gstreamer_edges.without_element
REPO = Path(__file__).resolve().parent.parent
MP4 = test_gstreamer.MP4  # H.264 High with B-frames
GOP = test_gstreamer.GOP


# -- (a) the launch strings against GStreamer 1.20's elements ----------------------------------------
def launch_elements(launch: str) -> list[tuple[str, set[str]]]:
    """(element, properties set) for each link of a preset's launch string; a caps filter is
    `capsfilter` with the caps' media type as its one 'property' (checked on its own)."""
    found = []
    for segment in launch.split("!"):
        first, *rest = segment.split()
        if "/" in first:
            found.append(("capsfilter", {first.split(",", 1)[0]}))
            continue
        found.append((first, {token.split("=", 1)[0] for token in rest} - {"name"}))
    return found


def problems_on_1_20(launch: str) -> list[str]:
    problems = []
    for element, props in launch_elements(launch):
        if element == "capsfilter":
            problems += [f"caps {media}" for media in props - CAPS_MEDIA_TYPES]
        elif element in NOT_IN_1_20 or element not in ELEMENTS_1_20:
            problems.append(f"element {element}")
        else:
            problems += [f"{element} {prop}" for prop in sorted(props - ELEMENTS_1_20[element])]
    return problems


PRESET_LAUNCHES = {(decoder.value, element, kind, chain): (rtsp_launch(preset, element, 10.0, chain)
                                                            if chain is not None else file_launch(preset, element))
                   for decoder, preset in PRESETS.items() for element in preset.elements
                   for kind, chain in (("rtsp", RtspChain.BYTE_STREAM), ("rtsp", RtspChain.TIMESTAMPED),
                                       ("file", None))}


@pytest.mark.parametrize("decoder, element, kind, chain", sorted(PRESET_LAUNCHES, key=str))
def test_every_preset_builds_from_gstreamer_1_20_elements_with_the_chain_it_gets_there(decoder, element, kind,
                                                                                        chain):
    launch = PRESET_LAUNCHES[decoder, element, kind, chain]
    assert f"! {element} !" in launch or f"! {'decodebin'} " in launch
    problems = problems_on_1_20(launch)
    if chain is RtspChain.TIMESTAMPED:
        assert problems == ["element h264timestamper"]  # the 1.22 chain: never picked on 1.20
    else:
        assert problems == []


def test_the_1_20_chain_is_deepstreams_parse_into_byte_stream_access_units():
    launch = rtsp_launch(PRESETS[Decoder.JETSON], "nvv4l2decoder", 10.0, RtspChain.BYTE_STREAM)
    assert ("! rtph264depay request-keyframe=true wait-for-keyframe=true ! h264parse config-interval=-1 "
            "! video/x-h264,stream-format=byte-stream,alignment=au ! nvv4l2decoder ! nvvidconv ! "
            "video/x-raw,format=I420 ! appsink") in launch
    assert "h264timestamper" not in launch


def test_the_check_can_fail():
    assert problems_on_1_20("filesrc name=a ! h264parse update-timecode=true ! fakesink") == [
        "h264parse update-timecode", "element fakesink"]
    assert problems_on_1_20("filesrc ! video/x-h265 ! h264timestamper") == ["caps video/x-h265",
                                                                           "element h264timestamper"]


def test_properties_the_code_sets_are_in_gstreamer_1_20_too():
    """`gstreamer.py` sets some properties itself (not in the strings): each must be one the
    recorded list has for some element, so a new one added there is checked here too."""
    code = (REPO / "yoloedge" / "sources" / "gstreamer.py").read_text(encoding="utf-8")
    names = set(re.findall(r"""(?:set_property|find_property|get_property|connect)\("([a-z-]+)\"""", code))
    assert {"location", "sync", "max-threads", "autoplug-select"} <= names  # the regex finds them
    known = set().union(*ELEMENTS_1_20.values())
    assert names - known == set(), names - known


def test_the_recorded_list_names_what_this_machines_gstreamer_has(gst_modules):
    """No typo in the fixture: every element of it this machine has (it has 1.22, a superset for
    these) has every property and signal listed. NVIDIA's and absent ones cannot be checked here."""
    GObject = __import__("gi.repository.GObject", fromlist=["GObject"])
    checked = 0
    for element, props in ELEMENTS_1_20.items():
        factory = gst_modules.Gst.ElementFactory.find(element)
        if element in JETPACK_ONLY or factory is None:
            continue
        made = factory.create(None)
        for prop in props:
            has = made.find_property(prop) is not None or GObject.signal_lookup(prop, type(made)) != 0
            assert has, f"{element} has no {prop}"
            checked += 1
    assert checked >= 15


# -- the chain per machine ----------------------------------------------------------------------------
def test_the_chain_follows_whether_h264timestamper_is_registered(gst_modules):
    from yoloedge.sources.gstreamer import launch_spec, rtsp_chain
    config = CameraConfig(name="c", url="rtsp://192.0.2.1/s", decoder="gstreamer")
    assert rtsp_chain() is RtspChain.TIMESTAMPED
    assert "! h264parse ! h264timestamper ! avdec_h264" in launch_spec(config, Decoder.GSTREAMER).launch
    with without_element(gst_modules, "h264timestamper"):
        assert rtsp_chain() is RtspChain.BYTE_STREAM
        launch = launch_spec(config, Decoder.GSTREAMER).launch
        assert f"! {RtspChain.BYTE_STREAM.value} ! avdec_h264 !" in launch and "timestamper" not in launch
    assert rtsp_chain() is RtspChain.TIMESTAMPED


# -- (b) the 1.20 chain plays a real stream ------------------------------------------------------------
def test_1_20_chain_gives_the_clips_frames_in_order_and_the_same_pictures(media, rtsp_server, gst_modules):
    """The B-frame clip over RTSP: from its first frame, in order, and each frame byte for byte
    the picture the 1.22 chain (h264timestamper) gives."""
    reference = test_gstreamer.file_thumbnails(media / MP4, 60)
    config = CameraConfig(name="c", url=rtsp_server.url(), decoder="gstreamer", open_timeout_s=5.0,
                          read_timeout_s=3.0)
    streams = {}
    for chain in (RtspChain.BYTE_STREAM, RtspChain.TIMESTAMPED):
        if chain is RtspChain.BYTE_STREAM:
            with without_element(gst_modules, "h264timestamper"):
                indices, kept = test_gstreamer.read_clip_frames(config, 40, reference, GOP)
        else:
            indices, kept = test_gstreamer.read_clip_frames(config, 40, reference, GOP)
        assert indices[0] == 0 and all(a < b for a, b in zip(indices, indices[1:])), (chain, indices)
        streams[chain] = kept
    common = sorted(set(streams[RtspChain.BYTE_STREAM]) & set(streams[RtspChain.TIMESTAMPED]))
    assert common[:1] == [0] and len(common) >= 2, common
    for index in common:
        problem = test_gstreamer.unequal(streams[RtspChain.BYTE_STREAM][index], streams[RtspChain.TIMESTAMPED][index])
        assert problem is None, f"frame {index}: it {problem}"


def test_1_20_chain_joined_mid_gop_starts_at_the_next_key_frame(media, gst_rtsp_available, gst_modules):
    """A camera joined mid-GOP (tests/test_gstreamer.py's MidGopServer): with the 1.20 chain too, the
    first picture is the next key frame's, and every one after it is intact."""
    server = test_gstreamer.MidGopServer(media / MP4, loop=False).start()
    try:
        config = CameraConfig(name="mid", url=server.url(), decoder="gstreamer", open_timeout_s=5.0,
                              read_timeout_s=3.0)
        with without_element(gst_modules, "h264timestamper"):
            thumbs, _ = test_gstreamer.read_stream(config, 20, set())
    finally:
        server.close()
    reference = test_gstreamer.file_thumbnails(media / MP4, 60)
    assert [test_gstreamer.closest(t, reference) for t in thumbs] == list(range(GOP, GOP + 20))
    assert all(test_gstreamer.same_picture(t, [reference[GOP + i]]) is None for i, t in enumerate(thumbs))


@pytest.fixture
def jetson_stand_in(monkeypatch):
    """The jetson preset with avdec_h264 (and videoconvert) in place of nvv4l2decoder (and nvvidconv)."""
    stand_in = Preset(Decoder.JETSON, ("avdec_h264",), (), "videoconvert ! ", "avdec_h264 standing in")
    monkeypatch.setitem(PRESETS, Decoder.JETSON, stand_in)
    return stand_in


def test_jetson_preset_streams_on_1_20_and_status_names_the_chain(rtsp_server, gst_modules, run_reader,
                                                                   jetson_stand_in):
    from yoloedge.pipeline.cameras import CameraRuntime
    with without_element(gst_modules, "h264timestamper"):
        collector = Collector()
        config = camera(rtsp_server.url(), name="yard", decoder="jetson", open_timeout_s=5.0, read_timeout_s=3.0)
        reader, states = run_reader(config, collector)
        assert states.wait_for(CameraState.STREAMING, 20), states.events
        assert collector.wait_count(10, 20)
        stats = reader.stats()
        assert stats["decoder"] == "jetson", stats
        version = gst_modules.Gst.version_string()
        assert stats["decoder_reason"] == (f"as configured: avdec_h264 after {RtspChain.BYTE_STREAM.value} "
                                           f"({version}, no h264timestamper before GStreamer 1.22)")
        assert CameraRuntime(config, "cpu", None, reader).status()["decoder_reason"] == stats["decoder_reason"]


def test_auto_takes_the_hardware_preset_on_1_20_and_says_why(gst_modules, jetson_stand_in):
    from yoloedge.sources.opening import choose_decoder
    with without_element(gst_modules, "h264timestamper"):
        choice = choose_decoder(CameraConfig(name="c", url="rtsp://192.0.2.1/s", decoder="auto"))
    assert (choice.decoder, choice.element, choice.passed_over_hardware) == (Decoder.JETSON, "avdec_h264", False)
    assert choice.reason.startswith(f"auto: jetson, avdec_h264 after {RtspChain.BYTE_STREAM.value} (GStreamer 1.")


# -- (c) no silent CPU fallback ------------------------------------------------------------------------
def test_explicit_hardware_preset_whose_decoder_is_missing_fails_the_camera_naming_it_and_the_version(
        rtsp_server, gst_modules, run_reader):
    if gst_modules.Gst.ElementFactory.find("nvv4l2decoder") is not None:
        pytest.skip("this machine has nvv4l2decoder")
    reader, states = run_reader(camera(rtsp_server.url(), name="gate", decoder="jetson"), Collector())
    assert states.wait_for(CameraState.FAILED, 10), states.events
    reason = states.events[-1][3]
    version = gst_modules.Gst.version_string()
    assert f"decoder: jetson needs the GStreamer element nvv4l2decoder with nvvidconv, which this machine " \
           f"({version}) does not have" in reason
    assert reader.stats()["reconnects"] == 0 and reader.stats()["decoder"] != "opencv"


def test_explicit_preset_whose_chain_is_missing_fails_naming_the_element_and_the_version(gst_modules,
                                                                                         jetson_stand_in):
    from yoloedge.sources.opening import choose_decoder
    rtsp = CameraConfig(name="c", url="rtsp://192.0.2.1/s", decoder="jetson")
    with without_element(gst_modules, "rtph264depay"):
        with pytest.raises(UnsupportedSourceError) as info:
            choose_decoder(rtsp)
    message = str(info.value)
    assert "also needs the GStreamer element(s) rtph264depay" in message
    assert f"({gst_modules.Gst.version_string()})" in message and "GStreamer 1.20 or later" in message


def test_auto_that_cannot_use_the_hardware_warns_and_status_says_why(rtsp_server, gst_modules, run_reader,
                                                                     jetson_stand_in, monkeypatch, caplog):
    """The hardware decoder is here but its chain is not: auto reads the camera with OpenCV (no
    PyAV, no chain for software GStreamer either), and says so -- a warning, and the status."""
    monkeypatch.setitem(sys.modules, "av", None)
    caplog.set_level(logging.INFO, logger="yoloedge.sources.opening")
    with without_element(gst_modules, "rtph264depay"):
        config = camera(rtsp_server.url(), name="dock", decoder="auto", open_timeout_s=5.0, read_timeout_s=3.0)
        collector = Collector()
        reader, states = run_reader(config, collector)
        assert states.wait_for(CameraState.STREAMING, 20), states.events
        stats = reader.stats()
    assert stats["decoder"] == "opencv", stats
    version = gst_modules.Gst.version_string()
    reason = stats["decoder_reason"]
    assert reason.startswith("auto: opencv; passed over ")
    assert f"jetson: avdec_h264 is here but rtph264depay is not ({version})" in reason
    assert "pyav: PyAV is not installed or does not load" in reason and "nvidia: no nvh264dec" in reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "hardware decoder is here" in
                r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0].getMessage(), caplog.text


def test_auto_without_hardware_says_so_at_info(gst_modules, caplog, monkeypatch):
    from yoloedge.sources.opening import open_camera
    for element in ("nvv4l2decoder", "nvh264dec", "vah264dec", "vaapih264dec"):
        if gst_modules.Gst.ElementFactory.find(element) is not None:
            pytest.skip(f"this machine has {element}")
    monkeypatch.setitem(sys.modules, "av", None)
    caplog.set_level(logging.INFO, logger="yoloedge.sources.opening")
    config = camera("synthetic://64x48?fps=5", name="lobby", decoder="auto")
    source, decoder = open_camera(config, camera="lobby")
    source.release()
    assert decoder is Decoder.OPENCV and source.decoder_reason.startswith("auto: PyAV and GStreamer read")
    config = replace(config, url=str(Path(test_gstreamer.__file__).parent / "missing.mp4"))
    from yoloedge.sources.opening import choose_decoder
    choice = choose_decoder(config)
    assert choice.decoder is Decoder.GSTREAMER and not choice.passed_over_hardware
    assert "jetson: no nvv4l2decoder with nvvidconv on this machine" in choice.reason
    assert [r.levelno for r in caplog.records] == [logging.INFO]  # the synthetic camera's; said once
