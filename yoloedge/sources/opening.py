"""Opening a camera: which decoder reads it (`choose_decoder`), and the source that decoder opens.

`open_camera` is what the reader calls for every connection. It resolves the camera's `decoder:`
on this machine (`auto`: the first hardware GStreamer preset present, then PyAV, then software
GStreamer, then OpenCV), and opens the source: OpenCV's (`open_source`: a stream, a video file, a
V4L2 device, an image folder, a synthetic camera, or an MJPEG camera read as JPEGs for a GPU
decoder), GStreamer's or PyAV's. Neither PyGObject nor PyAV is imported (each module imports
it on first use) unless a camera asks for it, and `auto` looks for them without importing them.

No silent fallback to the CPU: a camera whose `decoder:` names a preset this machine cannot build
fails (UnsupportedSourceError: no retries) with the missing element and the GStreamer version.
`auto` may pass over presets, but says which and why: in the camera's status (`decoder_reason`,
`Choice.reason`) and in the log, once per camera and reason -- a warning where a hardware decoder
is present but its chain cannot be built (the case that used to read a Jetson's cameras on the
CPU unannounced), info otherwise.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from ..config.schema import CameraConfig
from ..config.sources import Decoder, JpegDecoderKind, av_installed, display_launch
from ..redact import redact_url
from .base import (DEFAULT_DECODE_THREADS, Source, SourceError, SourceKind, UnsupportedSourceError, local_path,
                   source_kind)
from .dvpp import DvppSource, MediaEngine
from .files import VideoFileSource
from .folder import ImageFolderSource
from .gstlaunch import AUTO_ORDER, CHAIN_NEEDS, PRESETS, TIMESTAMPER, Preset, RtspChain
from .gstreamer import GStreamerSource, chain_missing, gst, gst_version, launch_spec, preset_element, rtsp_chain
from .imagesize import DEFAULT_LIMITS, ImageLimits
from .jpeg import JpegDecoder, JpegDecoderMissing, JpegDecoderUnavailable, choose
from .mjpeg import MjpegSource, NotMjpegError
from .pyav import PyAvSource, load_av
from .stream import open_stream, open_v4l2
from .synthetic import SyntheticSource

log = logging.getLogger(__name__)

#: what `auto` said once per process (PyAV broken; a camera's reason), and the lock for it
_auto_told: set[str] = set()
_told_lock = threading.Lock()


@dataclass(frozen=True)
class Choice:
    """The decoder a camera ends up with (`auto` resolved), its decoder element, and why."""

    decoder: Decoder
    element: str | None = None  # None for OpenCV and for `pipeline:` cameras
    reason: str = ""  # shown in status (`decoder_reason`) and, for `auto`, logged
    passed_over_hardware: bool = False  # auto: a hardware decoder is here but its chain is not


def choose_decoder(config: CameraConfig) -> Choice:
    """Resolve a camera's decoder on this machine. `auto`: the first hardware preset whose
    elements are present, then PyAV, then software GStreamer, then OpenCV (no PyGObject, or a
    source the presets do not read), saying what it passed over. An explicit preset whose
    elements are missing is an error naming them and the GStreamer version."""
    if config.pipeline:
        gst()
        return Choice(Decoder.GSTREAMER, reason=f"pipeline: as configured ({gst_version()})")
    requested = Decoder(config.decoder)
    if requested is Decoder.OPENCV:
        return Choice(Decoder.OPENCV, reason="as configured")
    if requested is Decoder.DVPP:  # the card decodes: open_camera opens it with the camera's media engine
        raise UnsupportedSourceError("decoder: dvpp decodes on the camera's Atlas card, which this camera has "
                                     "not been given; use decoder: auto or pyav")
    kind = source_kind(config.url)
    if kind not in (SourceKind.RTSP, SourceKind.FILE):
        if requested is Decoder.AUTO:
            return Choice(Decoder.OPENCV, reason=f"auto: PyAV and GStreamer read rtsp:// cameras and video files, "
                                                 f"not a {kind.value} source")
        raise UnsupportedSourceError(f"decoder: {requested} reads rtsp:// cameras and video files, not a "
                                     f"{kind.value} source: use decoder: opencv or auto, or a pipeline:")
    if requested is Decoder.AUTO:
        return _auto(kind)
    if requested is Decoder.PYAV:
        load_av()  # only for the cameras that use it
        return Choice(Decoder.PYAV, reason="as configured")
    gst()
    version = gst_version()
    if requested is Decoder.GSTREAMER and kind is SourceKind.FILE:
        element: str | None = "decodebin"
    else:
        element = preset_element(PRESETS[requested])
    if element is None:
        preset = PRESETS[requested]
        raise UnsupportedSourceError(f"decoder: {requested} needs the GStreamer element {_wanted(preset)}, which "
                                     f"this machine ({version}) does not have; it needs {preset.needs}. Use "
                                     f"decoder: auto (picks what is there, and says so) or decoder: gstreamer "
                                     f"(software)")
    missing = chain_missing(requested, kind)
    if missing:
        raise UnsupportedSourceError(f"decoder: {requested} on a {kind.value} source also needs the GStreamer "
                                     f"element(s) {', '.join(missing)}, which this machine ({version}) does not "
                                     f"have; they need {CHAIN_NEEDS}. Use decoder: opencv (or auto), or a "
                                     f"pipeline: without them")
    return Choice(requested, element, f"as configured: {_chain_text(element, kind, version)}")


def _wanted(preset: Preset) -> str:
    return " or ".join(preset.elements) + "".join(f" with {helper}" for helper in preset.helpers)


def _chain_text(element: str, kind: SourceKind, version: str) -> str:
    """The element and, for RTSP, the chain in front of it (`gstlaunch.RtspChain`), with the version."""
    if kind is not SourceKind.RTSP:
        return f"{element} ({version})"
    chain = rtsp_chain()
    why = "" if chain is RtspChain.TIMESTAMPED else f", no {TIMESTAMPER} before GStreamer 1.22"
    return f"{element} after {chain.value} ({version}{why})"


def _auto(kind: SourceKind) -> Choice:
    """AUTO_ORDER's first decoder this machine has for `kind`, else OpenCV (no PyGObject and no
    PyAV: auto means OpenCV); the reason lists what it passed over and why."""
    try:
        gst()
        have_gst = True
    except UnsupportedSourceError:
        have_gst = False
    version = gst_version() if have_gst else ""
    passed: list[str] = []
    hardware_unused = False
    for decoder in AUTO_ORDER:
        if decoder is Decoder.PYAV:
            if _pyav_loads():
                return _auto_choice(Choice(decoder), passed, hardware_unused)
            passed.append("pyav: PyAV is not installed or does not load")
            continue
        if not have_gst:
            passed.append(f"{decoder}: no PyGObject (GStreamer)")
            continue
        if decoder is Decoder.GSTREAMER and kind is SourceKind.FILE:
            element: str | None = "decodebin"
        else:
            element = preset_element(PRESETS[decoder])
        if element is None:
            passed.append(f"{decoder}: no {_wanted(PRESETS[decoder])} on this machine")
            continue
        missing = chain_missing(decoder, kind)
        if missing:
            passed.append(f"{decoder}: {element} is here but {', '.join(missing)} is not ({version})")
            hardware_unused = hardware_unused or decoder in _HARDWARE
            continue
        return _auto_choice(Choice(decoder, element, _chain_text(element, kind, version)), passed, hardware_unused)
    return _auto_choice(Choice(Decoder.OPENCV), passed, hardware_unused)


#: the presets that decode on a GPU or a media engine
_HARDWARE = (Decoder.JETSON, Decoder.NVIDIA, Decoder.VAAPI)


def _auto_choice(choice: Choice, passed: list[str], hardware_unused: bool) -> Choice:
    reason = f"auto: {choice.decoder}" + (f", {choice.reason}" if choice.reason else "")
    if passed:
        reason += "; passed over " + "; ".join(passed)
    return Choice(choice.decoder, choice.element, reason, hardware_unused)


def _pyav_loads() -> bool:
    """Whether PyAV is installed and loads; one that is installed but broken is said once."""
    if not av_installed():
        return False
    try:
        load_av()
    except UnsupportedSourceError as exc:
        with _told_lock:
            first = "pyav" not in _auto_told
            _auto_told.add("pyav")
        if first:
            log.warning("decoder: auto passes over PyAV: %s", exc)
        return False
    return True


def camera_description(config: CameraConfig) -> str:
    """How a camera's source is shown in logs and status: its URL, or its launch string, redacted."""
    return display_launch(config.pipeline) if config.pipeline else redact_url(config.url)


def open_camera(config: CameraConfig, *, camera: str | None = None, reuse_frame: bool = False,
                image_limits: ImageLimits = DEFAULT_LIMITS, media: MediaEngine | None = None) -> tuple[Source, Decoder]:
    """Open a camera's source with its decoder; returns the source and the decoder in use (and
    why, on the source's `decoder_reason`). `media`: the camera's way onto its card's media
    engine, where its group has one that its models can take pictures from (`decoder: dvpp`, and
    what `auto` picks first there)."""
    dvpp = _open_dvpp(config, camera, media)
    if dvpp is not None:
        dvpp.decoder_reason = ("as configured" if Decoder(config.decoder) is Decoder.DVPP
                               else "auto: dvpp, the camera's card decodes")
        return dvpp, Decoder.DVPP
    choice = choose_decoder(config)
    _tell_auto(config, choice, camera)
    if choice.decoder is Decoder.PYAV:
        pyav_source = PyAvSource(config.url, camera=camera, loop=config.loop, open_timeout_s=config.open_timeout_s,
                                 read_timeout_s=config.read_timeout_s, decode_threads=config.decode_threads)
        pyav_source.reuse_frame = reuse_frame
        pyav_source.decoder_reason = choice.reason
        return pyav_source, Decoder.PYAV
    if choice.decoder is Decoder.OPENCV:
        source = open_source(config.url, loop=config.loop, open_timeout_s=config.open_timeout_s,
                             read_timeout_s=config.read_timeout_s, camera=camera,
                             decode_threads=config.decode_threads, reuse_frame=reuse_frame,
                             image_limits=image_limits, jpeg_decoder=config.jpeg_decoder)
        source.decoder_reason = choice.reason
        return source, Decoder.OPENCV
    source = GStreamerSource(launch_spec(config, choice.decoder, choice.element), camera=camera, loop=config.loop,
                             open_timeout_s=config.open_timeout_s, read_timeout_s=config.read_timeout_s,
                             decode_threads=config.decode_threads)
    source.reuse_frame = reuse_frame
    source.decoder_reason = choice.reason
    return source, choice.decoder


def _open_dvpp(config: CameraConfig, camera: str | None, media: MediaEngine | None) -> Source | None:
    """The card decodes: `decoder: dvpp` (an error without a media engine), or `auto` where the
    camera's group has one and the source is a stream or a file the card reads."""
    requested = Decoder(config.decoder)
    if config.pipeline or requested not in (Decoder.DVPP, Decoder.AUTO):
        return None
    if media is None:
        if requested is Decoder.AUTO:
            return None
        raise UnsupportedSourceError("decoder: dvpp needs the camera's accelerator to be an Ascend group whose "
                                     "model takes the card's pictures (an .om converted with `yoloedge convert "
                                     "atc --aipp yuv420sp`); use decoder: auto or pyav")
    kind = source_kind(config.url)
    if kind not in (SourceKind.RTSP, SourceKind.FILE):
        if requested is Decoder.AUTO:
            return None
        raise UnsupportedSourceError(f"decoder: dvpp reads rtsp:// cameras and video files here, not a "
                                     f"{kind.value} source; use decoder: opencv for this camera")
    load_av()  # the demuxer
    return DvppSource(config.url, kind, media, loop=config.loop, open_timeout_s=config.open_timeout_s,
                      read_timeout_s=config.read_timeout_s, camera=camera, description=redact_url(config.url))


def _tell_auto(config: CameraConfig, choice: Choice, camera: str | None) -> None:
    """Log what `auto` chose and why, once per camera and reason (a reconnect does not repeat it)."""
    if Decoder(config.decoder) is not Decoder.AUTO or config.pipeline:
        return
    key = f"{camera}\0{choice.reason}"
    with _told_lock:
        first = key not in _auto_told
        _auto_told.add(key)
    if not first:
        return
    if choice.passed_over_hardware:
        log.warning("decoder %s: a hardware decoder is here but cannot be used; %s", choice.decoder,
                    choice.reason, extra={"camera": camera})
    else:
        log.info("decoder %s: %s", choice.decoder, choice.reason, extra={"camera": camera})


def open_source(url: str, *, loop: bool = False, open_timeout_s: float = 10.0,
                read_timeout_s: float = 10.0, camera: str | None = None,
                decode_threads: int = DEFAULT_DECODE_THREADS, reuse_frame: bool = False,
                image_limits: ImageLimits = DEFAULT_LIMITS, jpeg_decoder: str = JpegDecoderKind.CPU.value) -> Source:
    """Open `url` as the right kind of source. Raises SourceError (safe to log) on failure,
    UnsupportedSourceError when the URL can never work. `camera` names it in log records.
    `decode_threads` applies to what FFmpeg decodes (files and network streams); `reuse_frame`
    lets OpenCV captures decode every frame into the same array (see `Source.reuse_frame`);
    `image_limits` bounds the image files of a folder (see `imagesize`); `jpeg_decoder` decodes
    the JPEGs of folders and HTTP MJPEG cameras (see `jpeg`)."""
    source = _open(url, loop, open_timeout_s, read_timeout_s, camera, decode_threads, image_limits, jpeg_decoder)
    source.reuse_frame = reuse_frame
    return source


def _open(url: str, loop: bool, open_timeout_s: float, read_timeout_s: float, camera: str | None,
          decode_threads: int, image_limits: ImageLimits, jpeg_decoder: str) -> Source:
    kind = source_kind(url)
    if kind is SourceKind.HTTP and jpeg_decoder != JpegDecoderKind.CPU.value:
        mjpeg = _open_mjpeg(url, jpeg_decoder, open_timeout_s, read_timeout_s, camera, image_limits)
        if mjpeg is not None:
            return mjpeg
    if kind in (SourceKind.RTSP, SourceKind.HTTP):
        stream = open_stream(url, kind, open_timeout_s, read_timeout_s, camera, decode_threads)
        stream.jpeg_decoder = JpegDecoderKind.CPU.value if kind is SourceKind.HTTP else None
        return stream
    if kind is SourceKind.SYNTHETIC:
        return SyntheticSource(url, camera)
    path = local_path(url)
    if kind is SourceKind.V4L2:
        return open_v4l2(path, camera)
    if kind is SourceKind.FOLDER:
        return ImageFolderSource(path, loop, camera, image_limits, _jpeg_decoder(jpeg_decoder))
    return VideoFileSource(path, loop, camera, decode_threads)


def _jpeg_decoder(requested: str) -> JpegDecoder:
    """`jpeg.choose`, its errors as source errors: a missing module can never work."""
    try:
        return choose(requested)
    except JpegDecoderMissing as exc:
        raise UnsupportedSourceError(str(exc)) from None
    except JpegDecoderUnavailable as exc:
        raise SourceError(str(exc)) from None


def _open_mjpeg(url: str, jpeg_decoder: str, open_timeout_s: float, read_timeout_s: float, camera: str | None,
                image_limits: ImageLimits) -> Source | None:
    """The MJPEG camera read as JPEGs for a GPU decoder; None when OpenCV is to read it instead:
    `auto` chose the CPU, or found no MJPEG stream at the URL (FFmpeg reads other kinds)."""
    decoder = _jpeg_decoder(jpeg_decoder)
    if decoder.kind is JpegDecoderKind.CPU:
        return None
    try:
        return MjpegSource(url, decoder, open_timeout_s, read_timeout_s, camera, image_limits)
    except NotMjpegError as exc:
        if jpeg_decoder != JpegDecoderKind.AUTO.value:
            raise UnsupportedSourceError(f"{exc}: jpeg_decoder {jpeg_decoder} reads MJPEG cameras only; "
                                         f"use jpeg_decoder: auto or cpu") from None
        log.info("%s; FFmpeg reads it, JPEGs are not decoded on the GPU", exc, extra={"camera": camera})
        return None
