"""The GStreamer launch strings of the decoder presets.

Pure text: neither PyGObject, PyAV nor OpenCV is imported here. The `decoder:` values and the
checks of a `pipeline:` string are the config's (`config.sources`); `gstreamer.py` builds and runs
the pipelines, `pyav.py` the PyAV decoder, `opening.py` picks one for a camera.

The presets decode H.264 (the RTSP chain depayloads H.264; the hardware file chains parse it).
`decoder: gstreamer` on a file uses decodebin, which reads any container and codec GStreamer has
a software decoder for. Anything else -- H.265 cameras on hardware, a USB camera, a test pattern --
is a `pipeline:` launch string.

Why the RTSP chain has every step it has (roboflow/inference's Jetson producer, their PR #2759):
TCP so a lossy network cannot tear frames; a 200 ms jitter buffer that drops rather than grows;
the depayloader asks for a key frame and waits for one, so a stream joined mid-GOP (or after a lost
packet) never hands the decoder pictures whose references it never saw; h264timestamper gives
streams without DTS the timestamps NVDEC needs. The file chains never decode audio: decodebin
exposes non-video streams undecoded (`gstreamer.py`), parsebin's audio pads stay unlinked.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.sources import Decoder
from ..redact import redact_url


#: names the presets give their source and sink elements; the source's location is set as a
#: property, never written into the launch string (a path or password could hold launch syntax)
SOURCE_NAME = "yoloedge_src"
SINK_NAME = "yoloedge_sink"
DECODEBIN_NAME = "yoloedge_decode"
#: frames the appsink holds: enough to decode ahead by one while the reader takes the other
SINK_MAX_BUFFERS = 2
#: the caps a `pipeline:`'s appsink gets when the string sets none: I420 (converted to BGR in
#: Python, as the presets' frames are) or BGR as it is; a videoconvert before the appsink picks
#: whichever loses less of what it is given (I420 from a decoder: passed through untouched)
PIPELINE_SINK_CAPS = "video/x-raw,format={ I420, BGR }"
#: rtspsrc's jitter buffer (ms), as in the chain this follows
RTSP_LATENCY_MS = 200


@dataclass(frozen=True)
class Preset:
    """A hardware (or software) H.264 decoder and what it takes to get I420 out of it."""

    decoder: Decoder
    elements: tuple[str, ...]  # candidate decoder elements, the first one present is used
    helpers: tuple[str, ...]  # further elements the chain needs
    to_system_memory: str  # launch text between the decoder and the I420 caps (system memory)
    needs: str  # what provides the elements, for the error when they are missing


PRESETS: dict[Decoder, Preset] = {
    # videoconvert passes the decoder's I420 through untouched, and converts anything else to it.
    Decoder.GSTREAMER: Preset(Decoder.GSTREAMER, ("avdec_h264",), (), "videoconvert ! ",
                              "GStreamer's libav plugin (gstreamer1.0-libav)"),
    # nvv4l2decoder outputs NV12 in NVMM (device) memory; nvvidconv copies it out as I420 (one of
    # its system-memory output formats, in NVIDIA's Jetson GStreamer guide), so no CPU conversion
    # runs before Python's. Not yet run on a Jetson; a padded pitch arrives as the buffer's video meta.
    Decoder.JETSON: Preset(Decoder.JETSON, ("nvv4l2decoder",), ("nvvidconv",), "nvvidconv ! ",
                           "a Jetson with JetPack's GStreamer plugins (nvv4l2decoder, nvvidconv)"),
    # vah264dec (gst-plugins-bad 1.22+) is the maintained one; vaapih264dec (gstreamer-vaapi) is
    # the older plugin. Both hand system memory (NV12 as a rule) to videoconvert when it asks for it.
    Decoder.VAAPI: Preset(Decoder.VAAPI, ("vah264dec", "vaapih264dec"), (), "videoconvert ! ",
                          "an AMD or Intel GPU with VA-API drivers and GStreamer's va plugin "
                          "(gstreamer1.0-plugins-bad) or gstreamer1.0-vaapi; AMD also needs "
                          "LIBVA_DRIVER_NAME=radeonsi"),
    # nvh264dec registers only where the NVIDIA driver's NVDEC library loads and a GPU answers;
    # it outputs NV12, in system memory when videoconvert asks for it.
    Decoder.NVIDIA: Preset(Decoder.NVIDIA, ("nvh264dec",), (), "videoconvert ! ",
                           "an NVIDIA GPU with its driver and GStreamer's nvcodec plugin "
                           "(gstreamer1.0-plugins-bad)"),
}
#: the elements around the decoder in each chain (`rtsp_launch`, `file_launch`); the RTSP chain's
#: h264timestamper came with GStreamer 1.22 (Ubuntu 22.04 and JetPack 6 have 1.20)
RTSP_CHAIN = ("rtspsrc", "rtph264depay", "h264parse", "h264timestamper")
SOFTWARE_FILE_CHAIN = ("filesrc", "decodebin")
HARDWARE_FILE_CHAIN = ("filesrc", "parsebin", "h264parse")
CHAIN_NEEDS = ("GStreamer 1.22 or later with gstreamer1.0-plugins-good and gstreamer1.0-plugins-bad "
               "(h264timestamper came with 1.22)")
#: what `auto` tries, best first; then OpenCV. The hardware presets take the decode off the CPU;
#: PyAV decodes with FFmpeg as OpenCV does, into the same pictures, without OpenCV's own BGR picture
#: (about 6 MB less per 1080p camera, docs/benchmarks.md "Memory per camera"); software GStreamer holds more
#: (its buffer pools and queues) than either
AUTO_ORDER = (Decoder.JETSON, Decoder.NVIDIA, Decoder.VAAPI, Decoder.PYAV, Decoder.GSTREAMER)


def sink_launch(live: bool) -> str:
    """I420 frames into a bounded appsink; Python converts them to BGR (BT.601, as OpenCV's
    FFmpeg path does), which costs less CPU than videoconvert's BGR and gives the same pictures
    as `decoder: opencv`. Live: the oldest frame is dropped when the reader is behind, as a
    camera would. Files: never dropped; a full sink holds the decoder back."""
    drop = "true" if live else "false"
    return (f"video/x-raw,format=I420 ! appsink name={SINK_NAME} "
            f"max-buffers={SINK_MAX_BUFFERS} drop={drop} sync=false")


def rtsp_launch(preset: Preset, element: str, open_timeout_s: float) -> str:
    """The robust RTSP chain (module docstring); rtspsrc's location is set as a property."""
    tcp_timeout_us = max(1, int(open_timeout_s * 1_000_000))
    return (f"rtspsrc name={SOURCE_NAME} protocols=tcp latency={RTSP_LATENCY_MS} drop-on-latency=true "
            f"tcp-timeout={tcp_timeout_us} ! application/x-rtp,media=video ! queue "
            f"! rtph264depay request-keyframe=true wait-for-keyframe=true ! h264parse ! h264timestamper "
            f"! {element} ! {preset.to_system_memory}{sink_launch(live=True)}")


def file_launch(preset: Preset, element: str) -> str:
    """Software: decodebin (any container and codec). Hardware: parsebin, then H.264 only."""
    if preset.decoder is Decoder.GSTREAMER:
        return (f"filesrc name={SOURCE_NAME} ! decodebin name={DECODEBIN_NAME} ! {preset.to_system_memory}"
                f"{sink_launch(live=False)}")
    return (f"filesrc name={SOURCE_NAME} ! parsebin ! h264parse ! {element} ! {preset.to_system_memory}"
            f"{sink_launch(live=False)}")


def with_location(launch: str, location: str) -> str:
    """The launch string as it is shown: with the source's location in its display form."""
    shown = redact_url(location)
    return launch.replace(f"name={SOURCE_NAME}", f"name={SOURCE_NAME} location={_quote(shown)}", 1)


def _quote(value: str) -> str:
    if value and not any(c.isspace() or c in "!\"'" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
