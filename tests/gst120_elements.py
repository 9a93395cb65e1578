"""A recorded list of the GStreamer 1.20 elements, and of their properties, that the presets use.

GStreamer 1.20 is what Ubuntu 22.04 and JetPack 6 (L4T R36, Ubuntu 22.04 based) ship. This list is
written down, not read from a machine (this one has 1.22), so a launch string that names an
element or a property 1.20 lacks fails `tests/test_gstreamer_120.py` here. Only what the presets
and `gstreamer.py` set is listed; `name` is every GstObject's.

Where each entry is from (the 1.20 source of each module, its element and property definitions;
a `Since:` tag newer than 1.20 would rule an entry out):

* core: `filesrc` (location), `queue`, `capsfilter` -- plugins/elements in gstreamer 1.20;
  `pipeline` (GstBin's deep-element-added signal, "Since: 1.10" in gst/gstbin.c).
* gst-plugins-base 1.20: `appsink` (caps, drop, emit-signals, max-buffers, sync: gst-libs/gst/app/
  gstappsink.c), `videoconvert`, `decodebin` (the autoplug-continue and autoplug-select signals),
  `parsebin` (gst/playback, since 1.10).
* gst-plugins-good 1.20: `rtspsrc` (location, protocols, latency, drop-on-latency, tcp-timeout:
  gst/rtsp/gstrtspsrc.c, all long before 1.20), `rtph264depay` (request-keyframe and
  wait-for-keyframe: "Since: 1.20" in gst/rtp/gstrtph264depay.c).
* gst-plugins-bad 1.20: `h264parse` (config-interval, -1 meaning "with every IDR frame":
  gst/videoparsers/gsth264parse.c), `nvh264dec` (sys/nvcodec), `vah264dec` (sys/va, the va plugin
  came with 1.18). NOT in 1.20: `h264timestamper` ("Since: 1.22" in gst/codectimestamper/
  gsth264timestamper.c).
* gstreamer-vaapi 1.20: `vaapih264dec`.
* gst-libav 1.20: `avdec_h264` (max-threads).
* JetPack 6 (NVIDIA's "Accelerated GStreamer" guide for Jetson Linux R36): `nvv4l2decoder`,
  `nvvidconv`; the presets set none of their properties.

UNCONFIRMED: whether a given distribution's 1.20 build enables a plugin (e.g. Ubuntu 22.04's
gst-plugins-bad and the va plugin) is the packager's choice; the list says what 1.20 has.
"""

from __future__ import annotations

#: element -> the properties (and signals) of it the presets use, all present in GStreamer 1.20
ELEMENTS_1_20: dict[str, frozenset[str]] = {
    "pipeline": frozenset({"deep-element-added"}),
    "filesrc": frozenset({"location"}),
    "queue": frozenset(),
    "capsfilter": frozenset({"caps"}),
    "appsink": frozenset({"caps", "drop", "emit-signals", "max-buffers", "sync"}),
    "videoconvert": frozenset(),
    "decodebin": frozenset({"autoplug-continue", "autoplug-select"}),
    "parsebin": frozenset(),
    "rtspsrc": frozenset({"location", "protocols", "latency", "drop-on-latency", "tcp-timeout"}),
    "rtph264depay": frozenset({"request-keyframe", "wait-for-keyframe"}),
    "h264parse": frozenset({"config-interval"}),
    "avdec_h264": frozenset({"max-threads"}),
    "nvh264dec": frozenset(),
    "vah264dec": frozenset(),
    "vaapih264dec": frozenset(),
    "nvv4l2decoder": frozenset(),
    "nvvidconv": frozenset(),
}
#: came later than 1.20: a preset that needs one cannot build there
NOT_IN_1_20 = frozenset({"h264timestamper"})
#: the elements of the list only NVIDIA's JetPack provides (not checked against this machine)
JETPACK_ONLY = frozenset({"nvv4l2decoder", "nvvidconv"})
#: the media types the presets' caps filters name, each produced by an element of the list
CAPS_MEDIA_TYPES = frozenset({"application/x-rtp", "video/x-h264", "video/x-raw"})
