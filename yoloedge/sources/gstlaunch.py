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
packet) never hands the decoder pictures whose references it never saw (rtph264depay's
`request-keyframe` and `wait-for-keyframe`: "Since: 1.20" in gst-plugins-good's
gst/rtp/gstrtph264depay.c). The file chains never decode audio: decodebin exposes non-video
streams undecoded (`gstreamer.py`), parsebin's audio pads stay unlinked.

Two RTSP chains, by what the machine's GStreamer has (`RtspChain`, chosen in `gstreamer.py` by
whether the element is registered, not by a version number a distribution may have patched):

* `TIMESTAMPED` (GStreamer 1.22+): `h264parse ! h264timestamper`. RTP carries presentation
  times only, so rtph264depay's buffers have a PTS and no DTS; h264timestamper (gst-plugins-bad,
  "Since: 1.22" in gst/codectimestamper/gsth264timestamper.c) derives a DTS from the SPS's
  reorder depth (VUI num_reorder_frames, else the level's DPB size), holding back as many frames
  as the stream may reorder. Its own documentation names RTP/RTSP input as the case it is for.
* `BYTE_STREAM` (GStreamer 1.20: Ubuntu 22.04, JetPack 6): `h264parse config-interval=-1 !
  video/x-h264,stream-format=byte-stream,alignment=au`, the chain DeepStream's own RTSP sources
  and NVIDIA's Jetson GStreamer guide put before nvv4l2decoder (rtph264depay ! h264parse !
  nvv4l2decoder). Byte-stream with whole access units is what nvv4l2decoder (and the V4L2
  decoders it is forked from) takes; one access unit per buffer gives every buffer the PTS of its
  own picture; config-interval=-1 repeats SPS/PPS in front of every IDR, so a decoder that joins
  or recovers at a key frame always has the parameter sets. Why a missing DTS is harmless here:
  the decoders are GstVideoDecoder subclasses, which order their output by PTS and only
  interpolate when PTS is missing too; and nothing downstream reads a timestamp at all -- the
  appsink has sync=false and the reader paces and stamps frames on its own clock. DTS matters to
  muxers (the case h264timestamper was written for), not to this chain.
  UNCONFIRMED on a real Jetson: nvv4l2decoder (JetPack 6, L4T R36) fed PTS-only byte-stream from
  this chain was not run here; the same string with avdec_h264 in its place is tested on
  GStreamer 1.22 with h264timestamper removed from the registry. No nvv4l2decoder property is set
  (`disable-dpb` would break streams with B-frames; `enable-max-performance` trades power for
  clocks, a choice for the board's owner, through a `pipeline:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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
#: the elements around the decoder in each chain (`rtsp_launch`, `file_launch`); the RTSP chain
#: adds TIMESTAMPER where the machine has it (`RtspChain`)
RTSP_CHAIN = ("rtspsrc", "rtph264depay", "h264parse")
SOFTWARE_FILE_CHAIN = ("filesrc", "decodebin")
HARDWARE_FILE_CHAIN = ("filesrc", "parsebin", "h264parse")
#: gst-plugins-bad 1.22+; GStreamer 1.20 (Ubuntu 22.04, JetPack 6) has none
TIMESTAMPER = "h264timestamper"
CHAIN_NEEDS = ("GStreamer 1.20 or later with gstreamer1.0-plugins-good (rtspsrc, rtph264depay) and "
               "gstreamer1.0-plugins-bad (h264parse, parsebin)")
#: the caps the 1.20 chain fixes between h264parse and the decoder (module docstring)
BYTE_STREAM_CAPS = "video/x-h264,stream-format=byte-stream,alignment=au"


class RtspChain(str, Enum):
    """Between rtph264depay and the decoder (module docstring): which one a camera got is in its
    decoder's reason in status and in the log."""

    TIMESTAMPED = "h264parse ! h264timestamper"  # GStreamer 1.22+
    BYTE_STREAM = f"h264parse config-interval=-1 ! {BYTE_STREAM_CAPS}"  # 1.20: no h264timestamper
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


def rtsp_launch(preset: Preset, element: str, open_timeout_s: float,
                chain: RtspChain = RtspChain.TIMESTAMPED) -> str:
    """The robust RTSP chain (module docstring), with `chain` between the depayloader and the
    decoder; rtspsrc's location is set as a property."""
    tcp_timeout_us = max(1, int(open_timeout_s * 1_000_000))
    return (f"rtspsrc name={SOURCE_NAME} protocols=tcp latency={RTSP_LATENCY_MS} drop-on-latency=true "
            f"tcp-timeout={tcp_timeout_us} ! application/x-rtp,media=video ! queue "
            f"! rtph264depay request-keyframe=true wait-for-keyframe=true ! {chain.value} "
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
