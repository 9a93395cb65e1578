"""Reading a camera through GStreamer (PyGObject): software, Jetson, VA-API and NVDEC decoding.

The OpenCV wheels have no GStreamer, so frames come out of an `appsink` through PyGObject (the
`gstreamer` extra). `GStreamerSource` has the surface of every other source (`read()`, `eof`,
`error`, `release()`), so the reader's state machine, timeouts, stall watchdog and reconnects
apply unchanged.

No GLib main loop runs: the bus is polled between short pulls. A read waits for its frame in
slices of PULL_SLICE_S, looking at the bus in between, so a broken connection ends the read at
once, and a silent one at the read timeout -- the source never blocks longer than that, which the
stall watchdog relies on to get its connection thread back.

`gi` is imported on first use only (`gst()`): a camera with `decoder: opencv` never loads it,
and a missing PyGObject is an error naming the extra to install, not a traceback.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..config.schema import CameraConfig
from ..config.sources import GSTREAMER_HINT, Decoder, display_launch, gi_installed, register_launch_secrets, split_links
from ..redact import redact_text, redact_url
from .base import Source, SourceError, SourceKind, UnsupportedSourceError, local_path, plausible_fps, source_kind
from .gstlaunch import (DECODEBIN_NAME, HARDWARE_FILE_CHAIN, PIPELINE_SINK_CAPS, PRESETS, RTSP_CHAIN, SINK_MAX_BUFFERS,
                        SINK_NAME, SOFTWARE_FILE_CHAIN, SOURCE_NAME, TIMESTAMPER, Preset, RtspChain, file_launch,
                        rtsp_launch)
from .yuv import (BT601, Colorimetry, I420Converter, Matrix, PlaneLayout, opencv_colorimetry, opencv_differences,
                  plane)

log = logging.getLogger(__name__)

#: a read looks at the bus at least this often while it waits for a frame
PULL_SLICE_S = 0.1
_NS = 1_000_000_000
#: decodebin's GstAutoplugSelectResult values (the enum is not in any typelib)
_AUTOPLUG_TRY = 0
_AUTOPLUG_SKIP = 2
#: the name= of an element in a launch string segment
_NAME_IN_SEGMENT = re.compile(r"""\bname=("[^"]*"|'[^']*'|\S+)""")


class PixelFormat(str, Enum):
    """What an appsink may deliver: the presets' I420 (converted to BGR here), or BGR as it is."""

    BGR = "BGR"
    I420 = "I420"


_gst_lock = threading.Lock()
_gst: SimpleNamespace | None = None


def gst() -> SimpleNamespace:
    """Gst, GstApp, GstVideo and GLib, GStreamer initialised once per process. Raises
    UnsupportedSourceError naming what to install when PyGObject or GStreamer's typelibs are
    missing: retrying cannot help."""
    global _gst
    with _gst_lock:
        if _gst is not None:
            return _gst
        if not gi_installed():
            raise UnsupportedSourceError(f"GStreamer decoding needs PyGObject, which is not installed: "
                                         f"{GSTREAMER_HINT}")
        import gi
        try:
            for name in ("Gst", "GstApp", "GstVideo"):
                gi.require_version(name, "1.0")
            from gi.repository import GLib, Gst, GstApp, GstVideo
        except (ImportError, ValueError) as exc:
            raise UnsupportedSourceError(f"GStreamer's typelibs are missing ({exc}): {GSTREAMER_HINT}") from None
        Gst.init(None)
        _gst = SimpleNamespace(Gst=Gst, GstApp=GstApp, GstVideo=GstVideo, GLib=GLib)
        return _gst


def element_present(name: str) -> bool:
    return gst().Gst.ElementFactory.find(name) is not None


def preset_element(preset: Preset) -> str | None:
    """The preset's first decoder element this machine has, if it also has the helpers."""
    if not all(element_present(helper) for helper in preset.helpers):
        return None
    return next((name for name in preset.elements if element_present(name)), None)


def gst_version() -> str:
    """The GStreamer this process runs, as errors and reasons name it ("GStreamer 1.20.3")."""
    return str(gst().Gst.version_string())


def rtsp_chain() -> RtspChain:
    """The RTSP chain this machine can build: h264timestamper where it is registered (1.22+),
    else the 1.20 chain (`gstlaunch`)."""
    return RtspChain.TIMESTAMPED if element_present(TIMESTAMPER) else RtspChain.BYTE_STREAM


def chain_missing(decoder: Decoder, kind: SourceKind) -> list[str]:
    """The elements of the preset's chain around its decoder that this machine lacks: a launch
    string naming one cannot even be built, so `auto` must pass over such a preset."""
    chain: tuple[str, ...]
    if kind is SourceKind.RTSP:
        chain = RTSP_CHAIN
    else:
        chain = SOFTWARE_FILE_CHAIN if decoder is Decoder.GSTREAMER else HARDWARE_FILE_CHAIN
    return [name for name in chain if not element_present(name)]


@dataclass(frozen=True)
class LaunchSpec:
    """What to build: a launch string, the location to give its source element, and what it is."""

    launch: str
    kind: SourceKind
    description: str  # redacted
    decoder: Decoder
    location: str | None = None  # set on the element named SOURCE_NAME
    live: bool | None = None  # None: the pipeline tells (a live source does not preroll)
    sink_name: str = SINK_NAME
    software_only: bool = False  # decodebin may not pick hardware decoders
    user_pipeline: bool = False


def launch_spec(config: CameraConfig, decoder: Decoder, element: str | None = None) -> LaunchSpec:
    """The pipeline for a camera: its own `pipeline:`, or the preset of `decoder` for its URL, with
    `element` (the preset's first one when None) as its decoder element."""
    if config.pipeline:
        launch, sink = _named_sink(config.pipeline)
        return LaunchSpec(launch, SourceKind.PIPELINE, display_launch(config.pipeline), decoder,
                          sink_name=sink, user_pipeline=True)
    preset = PRESETS[decoder]
    element = element or preset.elements[0]
    if source_kind(config.url) is SourceKind.RTSP:
        return LaunchSpec(rtsp_launch(preset, element, config.open_timeout_s, rtsp_chain()), SourceKind.RTSP,
                          redact_url(config.url), decoder, location=config.url, live=True)
    path = local_path(config.url)
    return LaunchSpec(file_launch(preset, element), SourceKind.FILE, path, decoder, location=path,
                      live=False, software_only=decoder is Decoder.GSTREAMER)


def _named_sink(launch: str) -> tuple[str, str]:
    """The launch string with its final appsink named (the name it has, or SINK_NAME added)."""
    match = _NAME_IN_SEGMENT.search(split_links(launch)[-1])
    if match:
        return launch, match.group(1).strip("\"'")
    return f"{launch.rstrip()} name={SINK_NAME}", SINK_NAME


class GStreamerSource(Source):
    """A GStreamer pipeline whose appsink delivers I420 (converted to BGR, `yuv.py`) or BGR frames.

    Opening builds the pipeline, starts it and waits up to `open_timeout_s` for the first frame
    (held for the first read). EOS is the end of a file (`eof`; with `loop` the pipeline starts
    again), or of a live stream (an error: the reader reconnects). A bus ERROR is an error with
    GStreamer's message, redacted. Used by one thread from open to release, as every source.
    """

    def __init__(self, spec: LaunchSpec, *, camera: str | None = None, loop: bool = False,
                 open_timeout_s: float = 10.0, read_timeout_s: float = 10.0, decode_threads: int = 1):
        super().__init__(spec.description, camera)
        self.kind = spec.kind
        self.decoder = spec.decoder
        self._spec = spec
        self._loop = loop
        self._open_timeout_s = open_timeout_s
        self._read_timeout_s = read_timeout_s
        self._decode_threads = decode_threads
        self._broken: str | None = None  # the bus error that stopped the pipeline; it stays stopped
        self._frames_this_pass = 0
        self._caps: Any = None
        self._layout: tuple[PixelFormat, PlaneLayout, Colorimetry] | None = None  # of the frames with _caps
        self._converter = I420Converter()
        self._told: set[str] = set()  # why this stream's pictures differ from decoder: opencv's, logged once
        self._pending: Any = None  # the first sample, pulled while opening
        self._g = gst()
        if spec.user_pipeline:
            register_launch_secrets(spec.launch)
        self._pipeline: Any = None
        self._open()

    def _open(self) -> None:
        self._broken = None
        self._pipeline = self._build()
        try:
            self._start(self._open_timeout_s)
        except BaseException:
            self.release()
            raise

    # -- building ----------------------------------------------------------------------------------
    def _build(self) -> Any:
        Gst, GLib = self._g.Gst, self._g.GLib
        try:
            pipeline = Gst.parse_launch(self._spec.launch)
        except GLib.Error as exc:
            raise UnsupportedSourceError(f"{self.description}: cannot build the GStreamer pipeline: "
                                         f"{redact_text(exc.message)}") from None
        if not isinstance(pipeline, Gst.Bin):
            raise UnsupportedSourceError(f"{self.description}: a pipeline needs a source and an appsink, "
                                         f"linked with '!'")
        if self._spec.location is not None:
            pipeline.get_by_name(SOURCE_NAME).set_property("location", self._spec.location)
        sink = pipeline.get_by_name(self._spec.sink_name)
        if sink is None or sink.get_factory() is None or sink.get_factory().get_name() != "appsink":
            raise UnsupportedSourceError(f"{self.description}: the pipeline's last element must be an appsink")
        appsinks = _elements_of(pipeline, "appsink")
        if len(appsinks) > 1:
            raise UnsupportedSourceError(f"{self.description}: the pipeline has {len(appsinks)} appsinks; it may "
                                         f"have one (nobody reads the others, which would fill memory): end the "
                                         f"other branches in fakesink")
        self._sink = sink
        self._configure_sink(sink)
        decodebin = pipeline.get_by_name(DECODEBIN_NAME)
        if decodebin is not None:
            decodebin.connect("autoplug-continue", _decode_video_only)
            if self._spec.software_only:
                decodebin.connect("autoplug-select", _software_only)
        if self._decode_threads > 0:
            pipeline.iterate_recurse().foreach(_limit_threads, self._decode_threads)
            pipeline.connect("deep-element-added", _on_element_added, self._decode_threads)
        self._bus = pipeline.get_bus()
        return pipeline

    def _configure_sink(self, sink: Any) -> None:
        """Bounded, unsynchronised (the reader paces), I420 or BGR. A `pipeline:` may set its own
        bound and caps; an unbounded sink (max-buffers=0, appsink's default) gets ours."""
        sink.set_property("sync", False)
        sink.set_property("emit-signals", False)
        if sink.get_property("max-buffers") == 0:
            sink.set_property("max-buffers", SINK_MAX_BUFFERS)
        if sink.get_property("caps") is None:
            sink.set_property("caps", self._g.Gst.Caps.from_string(PIPELINE_SINK_CAPS))

    def _start(self, open_timeout_s: float) -> None:
        Gst = self._g.Gst
        answer = self._pipeline.set_state(Gst.State.PAUSED)
        if answer == Gst.StateChangeReturn.FAILURE:
            raise SourceError(self._bus_error() or f"{self.description}: the pipeline would not start")
        self.is_live = self._spec.live if self._spec.live is not None else answer == Gst.StateChangeReturn.NO_PREROLL
        self._sink.set_property("drop", self.is_live)  # files: back-pressure, never a lost frame
        if self._pipeline.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
            raise SourceError(self._bus_error() or f"{self.description}: the pipeline would not start")
        sample = self._pull(open_timeout_s)
        if sample is None:
            if self.eof:
                raise SourceError(f"{self.description}: ended before its first frame")
            raise SourceError(self.error or f"{self.description}: no frame within {open_timeout_s:.1f} s")
        self._pending = sample
        self.eof, self.error = False, None
        self.nominal_fps = _frame_rate(sample.get_caps())

    # -- reading -----------------------------------------------------------------------------------
    def read(self) -> np.ndarray | None:
        if self._pipeline is None:
            self.error = "source released"
            return None
        sample, self._pending = self._pending, None
        if sample is None:
            sample = self._pull(self._read_timeout_s)
        if sample is None and self.eof and self._loop and self._frames_this_pass > 0:
            sample = self._restart()
        if sample is None:
            self._note_end()
            return None
        image = self._image(sample)
        if image is not None:
            self._frames_this_pass += 1
        return image

    def _pull(self, timeout_s: float) -> Any:
        """The next sample within `timeout_s`, or None with `eof` or `error` saying why."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._broken = self._broken or self._bus_error()
            if self._broken is not None:
                self.error = self._broken
                return None
            left = deadline - time.monotonic()
            sample = self._sink.try_pull_sample(int(max(0.0, min(PULL_SLICE_S, left)) * _NS))
            if sample is not None:
                return sample
            if self._sink.is_eos():
                # An element that fails posts its ERROR, then sends EOS downstream: the EOS can
                # reach the sink while this slice waits, so the bus is read again before it
                # counts as an end (else a 404 or a caps mismatch reads as "ended").
                self._broken = self._bus_error()
                if self._broken is not None:
                    self.error = self._broken
                else:
                    self.eof = True
                return None
            if left <= PULL_SLICE_S:
                self.error = f"{self.description}: no frame for {timeout_s:.1f} s (read timed out)"
                return None

    def _note_end(self) -> None:
        """A live stream that ends is broken (reconnect); a file that gave no frame is too."""
        if not self.eof:
            return
        if self.is_live:
            self.eof = False
            self.error = f"{self.description}: the stream ended"
        elif self._frames_this_pass == 0:
            self.eof = False
            self.error = f"{self.description}: no frame could be decoded"

    def _restart(self) -> Any:
        """Play the file again from its start (`loop`): a new pipeline, as a new connection would
        build. Stopping and restarting the old one does not work: decodebin drops its source pads
        at NULL, and launch-string links to them are made only once. Returns the first sample."""
        log.debug("%s: end of stream, starting again (loop)", self.description, extra={"camera": self.camera})
        self.eof = False
        self._frames_this_pass = 0
        if not self._open_again(self.release, self._open):
            return None
        sample, self._pending = self._pending, None
        return sample

    def _image(self, sample: Any) -> np.ndarray | None:
        """The sample's picture as a BGR array of our own (the buffer goes back to GStreamer):
        into the previous frame's array when `reuse_frame` is set and the size is unchanged."""
        buf = sample.get_buffer()
        found = self._frame_layout(sample.get_caps(), buf)
        if found is None:
            return None
        pixel_format, layout, colorimetry = found
        ok, info = buf.map(self._g.Gst.MapFlags.READ)
        if not ok:
            self.error = f"{self.description}: cannot read a frame's memory"
            return None
        reuse = self._frame if self.reuse_frame else None
        try:
            if pixel_format is PixelFormat.I420:
                image = self._converter.to_bgr(info.data, layout, colorimetry, reuse)
            else:
                image = _bgr_copy(info.data, layout, reuse)
        except TypeError:  # numpy: the buffer is smaller than the caps say
            self.error = f"{self.description}: a frame is smaller than its {layout.width}x{layout.height} caps"
            return None
        finally:
            buf.unmap(info)
        if self.reuse_frame:
            self._frame = image
        return image

    def _frame_layout(self, caps: Any, buf: Any) -> tuple[PixelFormat, PlaneLayout, Colorimetry] | None:
        """The frame's format, plane layout and colorimetry; the caps are read once until they change."""
        GstVideo = self._g.GstVideo
        if self._caps is None or not caps.is_equal(self._caps):
            self._caps, self._layout = caps, None
            info = GstVideo.VideoInfo.new_from_caps(caps)
            pixel_format = _pixel_format(GstVideo, info)
            if pixel_format is None:
                shown = redact_text(caps.to_string()) if caps is not None else "no caps"
                self.error = (f"{self.description}: the appsink must receive video/x-raw,format=BGR (or I420), "
                              f"not {shown}; end the pipeline with videoconvert ! video/x-raw,format=BGR ! appsink")
                return None
            planes = range(info.finfo.n_planes)
            layout = PlaneLayout(info.width, info.height, tuple(info.offset[p] for p in planes),
                                 tuple(info.stride[p] for p in planes))
            stream, colour_managed = _colorimetry(GstVideo, caps, info)
            self._layout = (pixel_format, layout, opencv_colorimetry(stream))
            if pixel_format is PixelFormat.I420:
                self._tell_differences(layout, colour_managed)
        if self._layout is None:
            return None
        pixel_format, layout, colorimetry = self._layout
        meta = GstVideo.buffer_get_video_meta(buf)
        if meta is not None:  # the producer's own plane layout (padding) overrides the default one
            planes = range(len(layout.offsets))
            layout = PlaneLayout(layout.width, layout.height, tuple(meta.offset[p] for p in planes),
                                 tuple(meta.stride[p] for p in planes))
        return pixel_format, layout, colorimetry

    def _tell_differences(self, layout: PlaneLayout, colour_managed: str | None) -> None:
        """Log once per stream what makes its pictures differ from decoder: opencv's (`yuv.py`)."""
        for reason in opencv_differences(layout.height, colour_managed):
            if reason not in self._told:
                self._told.add(reason)
                log.warning("%s: pictures differ from decoder: opencv's: %s", self.description, reason,
                            extra={"camera": self.camera})

    def _bus_error(self) -> str | None:
        """The first ERROR on the bus as a message safe to log, or None. Other messages are
        dropped (nothing else reads this bus)."""
        Gst = self._g.Gst
        while True:
            message = self._bus.pop_filtered(Gst.MessageType.ERROR)
            if message is None:
                return None
            error, debug = message.parse_error()
            origin = message.src.get_name() if message.src is not None else "pipeline"
            detail = (debug or "").strip().splitlines()[-1:] or [""]
            text = f"{self.description}: {origin}: {error.message}"
            if detail[0] and detail[0] not in error.message:
                text += f" ({detail[0]})"
            return redact_text(text + _hint(detail[0], self._spec))

    def release(self) -> None:
        pipeline, self._pipeline = self._pipeline, None
        self._pending = None
        if pipeline is not None:
            pipeline.set_state(self._g.Gst.State.NULL)


def _pixel_format(GstVideo: Any, info: Any) -> PixelFormat | None:
    """The appsink's format when it is one we take, else None."""
    if info is None:
        return None
    return {GstVideo.VideoFormat.BGR: PixelFormat.BGR, GstVideo.VideoFormat.I420: PixelFormat.I420}.get(
        info.finfo.format)


#: swscale's table row for each GstVideo.VideoColorMatrix (by name); unknown and RGB: BT.601, as FFmpeg
#: takes an unspecified matrix
_MATRICES = {"BT709": Matrix.BT709, "BT601": Matrix.BT601, "FCC": Matrix.FCC, "SMPTE240M": Matrix.SMPTE240M,
             "BT2020": Matrix.BT2020}
#: primaries FFmpeg 8 converts as they are: those close enough to BT.709 (measured, OpenCV 5.0:
#: FILM, BT.2020, DCI-P3, Display P3, EBU 3213 and XYZ are mapped to BT.709 first)
_PLAIN_PRIMARIES = ("UNKNOWN", "BT709", "BT470M", "BT470BG", "SMPTE170M", "SMPTE240M")
#: transfer functions FFmpeg 8 tone-maps (HDR)
_HDR_TRANSFERS = ("SMPTE2084", "ARIB_STD_B67")


def _colorimetry(GstVideo: Any, caps: Any, info: Any) -> tuple[Colorimetry, str | None]:
    """The matrix and range the stream's caps state (BT.601 limited range where they state none:
    GstVideo would guess BT.709 for HD there, FFmpeg does not), and what in them FFmpeg 8 maps
    before converting (wide-gamut primaries, an HDR transfer), or None."""
    if not caps.get_structure(0).has_field("colorimetry"):
        return BT601, None
    colorimetry = info.colorimetry
    matrix = _MATRICES.get(_enum_name(GstVideo.VideoColorMatrix, colorimetry.matrix), Matrix.BT601)
    full_range = colorimetry.range == getattr(GstVideo.VideoColorRange, "0_255")  # not a Python name
    primaries = _enum_name(GstVideo.VideoColorPrimaries, colorimetry.primaries)
    transfer = _enum_name(GstVideo.VideoTransferFunction, colorimetry.transfer)
    mapped = None
    if primaries not in _PLAIN_PRIMARIES:
        mapped = f"colour primaries ({primaries})"
    elif transfer in _HDR_TRANSFERS:
        mapped = f"HDR transfer function ({transfer})"
    return Colorimetry(matrix, full_range), mapped


def _enum_name(enum: Any, value: Any) -> str:
    """A GstVideo enum value's name (BT709 for GST_VIDEO_COLOR_MATRIX_BT709), UNKNOWN for others."""
    return next((name for name in dir(enum) if name.isupper() and getattr(enum, name) == value), "UNKNOWN")


def _bgr_copy(data: Any, layout: PlaneLayout, out: np.ndarray | None) -> np.ndarray:
    """A BGR picture copied out of its buffer (rows may be padded): into `out` when it fits."""
    rows = plane(data, layout.offsets[0], layout.strides[0], layout.height, layout.width * 3)
    view = rows.reshape(layout.height, layout.width, 3)
    if out is not None and out.shape == view.shape:
        np.copyto(out, view)
        return out
    return view.copy()


def _frame_rate(caps: Any) -> float | None:
    """The caps' frame rate when it is a plausible one (a live source may say 0/1: unknown)."""
    if caps is None or caps.get_size() == 0:
        return None
    found, num, den = caps.get_structure(0).get_fraction("framerate")
    return plausible_fps(num / den) if found and den > 0 else None


def _hint(detail: str, spec: LaunchSpec) -> str:
    """What to do about the two errors a preset or pipeline meets for want of the right input."""
    if "not-linked" in detail and spec.kind is SourceKind.FILE and not spec.software_only:
        return f"; the file's video is not H.264, which decoder: {spec.decoder} decodes: use decoder: gstreamer"
    if ("not-linked" in detail or "not-negotiated" in detail) and spec.kind is SourceKind.RTSP:
        return ("; the presets read H.264 cameras: for another codec use decoder: opencv, or a pipeline: "
                "(e.g. rtph265depay ! h265parse ! <decoder>)")
    if "not-negotiated" in detail and spec.user_pipeline:
        return "; end the pipeline with videoconvert ! video/x-raw,format=BGR ! appsink"
    return ""


def _decode_video_only(_bin: Any, _pad: Any, caps: Any) -> bool:
    """decodebin: decode video; leave audio, subtitles and data streams undecoded (and unlinked)."""
    if caps is None or caps.get_size() == 0:
        return True
    media = caps.get_structure(0).get_name().split("/", 1)[0]
    return media not in ("audio", "text", "subpicture", "application")


def _software_only(_bin: Any, _pad: Any, _caps: Any, factory: Any) -> int:
    """decodebin (decoder: gstreamer): never a hardware decoder, whatever its rank."""
    klass = factory.get_metadata("klass") or ""
    return _AUTOPLUG_SKIP if "Hardware" in klass.split("/") else _AUTOPLUG_TRY


def _limit_threads(element: Any, threads: int) -> None:
    """Give FFmpeg (avdec_*) decoders `decode_threads` threads, as the OpenCV path does."""
    factory = element.get_factory()
    if factory is not None and factory.get_name().startswith("avdec_") \
            and element.find_property("max-threads") is not None:
        element.set_property("max-threads", threads)


def _elements_of(pipeline: Any, factory_name: str) -> list[Any]:
    """The elements of `pipeline` (in bins too) made by the factory `factory_name`."""
    found: list[Any] = []

    def keep(element: Any, _data: Any) -> None:
        factory = element.get_factory()
        if factory is not None and factory.get_name() == factory_name:
            found.append(element)
    pipeline.iterate_recurse().foreach(keep, None)
    return found


def _on_element_added(_bin: Any, _sub_bin: Any, element: Any, threads: int) -> None:
    _limit_threads(element, threads)
