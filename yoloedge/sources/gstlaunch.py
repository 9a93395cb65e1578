"""Which decoder a camera uses, and the GStreamer launch strings of the decoder presets.

Pure text and enums: neither PyGObject, PyAV nor OpenCV is imported here, so the config reader can
validate `decoder:` and `pipeline:` without loading any (`decoder: opencv`, the default, never
imports `gi` or `av`). `gstreamer.py` builds and runs the pipelines, `pyav.py` the PyAV decoder.

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

import importlib.util
import re
from dataclasses import dataclass
from enum import Enum

from ..redact import MASK, SECRETS, redact_text, redact_url


class Decoder(str, Enum):
    """`decoder:` of a camera. OPENCV is FFmpeg inside OpenCV (no GStreamer at all)."""

    OPENCV = "opencv"
    PYAV = "pyav"  # FFmpeg through PyAV: no OpenCV picture in between (sources.pyav)
    GSTREAMER = "gstreamer"  # software decoders, through GStreamer
    JETSON = "jetson"  # nvv4l2decoder (NVIDIA Jetson)
    VAAPI = "vaapi"  # VA-API (AMD, Intel)
    NVIDIA = "nvidia"  # NVDEC (NVIDIA discrete GPUs)
    AUTO = "auto"  # the best of the above that this machine has

    def __str__(self) -> str:
        return self.value

    @property
    def uses_gstreamer(self) -> bool:
        """Whether this choice needs PyGObject whatever the machine (AUTO falls back to OpenCV)."""
        return self not in (Decoder.OPENCV, Decoder.PYAV, Decoder.AUTO)


DECODERS = tuple(d.value for d in Decoder)

#: the pip extra that installs PyGObject; named in every message about a missing `gi`
GSTREAMER_EXTRA = "pip install yoloedge[gstreamer]"
GSTREAMER_HINT = (f"{GSTREAMER_EXTRA} (PyGObject; building it needs libgirepository1.0-dev and libcairo2-dev), "
                  "with GStreamer's system packages gir1.2-gstreamer-1.0, gstreamer1.0-plugins-good, "
                  "gstreamer1.0-plugins-bad and gstreamer1.0-libav")

#: the pip extra that installs PyAV; named in every message about a missing `av`
PYAV_EXTRA = "pip install yoloedge[pyav]"
PYAV_HINT = f"{PYAV_EXTRA} (PyAV: FFmpeg's own libraries in the wheel, no system packages needed)"

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
#: (about 6 MB less per 1080p camera, README "Memory per camera"); software GStreamer holds more
#: (its buffer pools and queues) than either
AUTO_ORDER = (Decoder.JETSON, Decoder.NVIDIA, Decoder.VAAPI, Decoder.PYAV, Decoder.GSTREAMER)


def gi_installed() -> bool:
    """Whether PyGObject can be imported, without importing it."""
    try:
        return importlib.util.find_spec("gi") is not None
    except (ImportError, ValueError):
        return False


def av_installed() -> bool:
    """Whether PyAV can be imported, without importing it (it loads FFmpeg's libraries)."""
    try:
        return importlib.util.find_spec("av") is not None
    except (ImportError, ValueError):
        return False


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


# -- `pipeline:` launch strings --------------------------------------------------------------------

_SCHEME_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: an element property that holds a credential outside any URL: rtspsrc's and souphttpsrc's
#: user-id/user-pw/proxy-id/proxy-pw, srtsrc's passphrase, and any *password, *passwd, *secret,
#: *token. The user names too, as a URL's user-info is hidden whole. Value: quoted, or to white space.
_CREDENTIAL_PROPERTY = re.compile(
    r"""(?<![^\s])((?:user|proxy)-id|[\w-]*(?:-pw|passphrase|password|passwd|secret|token))="""
    r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\S+)""",
    re.IGNORECASE)


def split_links(launch: str) -> list[str]:
    """The launch string cut at every '!' that is not inside quotes (gst-launch syntax)."""
    parts: list[str] = []
    current: list[str] = []
    quote, escaped = "", False
    for char in launch:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "!":
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


def launch_problem(launch: str) -> str | None:
    """Why `launch` cannot be a camera's pipeline (without GStreamer: the text only), or None."""
    last = split_links(launch)[-1].split()
    if not last or last[0] != "appsink":
        return "must end in an appsink (the frames come out of it)"
    return None


def launch_urls(launch: str) -> list[str]:
    """The URLs inside a launch string; a quoted one up to its closing quote (a password may
    hold spaces), else up to the next white space."""
    urls = []
    for match in _SCHEME_START.finditer(launch):
        start = match.start()
        quote = launch[start - 1] if start > 0 and launch[start - 1] in "\"'" else ""
        end = launch.find(quote, match.end()) if quote else -1
        if end == -1:
            space = re.search(r"\s", launch[match.end():])
            end = match.end() + space.start() if space else len(launch)
        urls.append(launch[start:end])
    return urls


def register_launch_secrets(launch: str) -> None:
    """Register the credentials of every URL in a launch string, as camera URLs are, and the
    values of its credential properties (`user-pw=`): before any check, so no message about the
    pipeline can quote them."""
    for url in launch_urls(launch):
        SECRETS.add_url(url)
    for match in _CREDENTIAL_PROPERTY.finditer(launch):
        if not match.group(1).lower().endswith("-id"):  # a bare user name ("admin") is not scrubbed
            SECRETS.add_secret(_unquote(match.group(2)))  # from every log line, as in url_secrets


def _unquote(value: str) -> str:
    """A launch-string value as the element receives it: quotes off, backslash escapes undone."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def display_launch(launch: str) -> str:
    """A launch string as logs and status show it (secrets registered first); a credential
    property's value is `***` whatever its length (one too short to register is still hidden)."""
    register_launch_secrets(launch)
    return redact_text(_CREDENTIAL_PROPERTY.sub(lambda m: f"{m.group(1)}={MASK}", launch))
