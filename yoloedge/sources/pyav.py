"""`decoder: pyav`: video files and rtsp:// cameras decoded by FFmpeg through PyAV, converted
straight into the reader's buffer.

`decoder: opencv` decodes with the same FFmpeg, but cv2.VideoCapture converts every frame it is
asked for into a BGR picture of its own and then copies that into the caller's array: about 6 MB
per 1080p camera (the picture and its swscale context) that its API cannot avoid. Here the
decoder's yuv420p (or NV12) planes are converted by `yuv.I420Converter` -- swscale's own
arithmetic, so the pictures are cv2.VideoCapture's, byte for byte -- into the buffer the reader
lends from its `FramePool`, and only for the frames the camera keeps (`grab()` decodes,
`retrieve(out)` converts). Other pictures (an odd height, 4:2:2, 4:4:4, 10-bit, grey, and with
OpenCV 5 wide-gamut or HDR colours, which its FFmpeg maps to BT.709) are converted by swscale itself,
through PyAV, called as OpenCV calls it -- the same pictures again, byte for byte -- into an array
of its own, then copied (a frame-sized allocation per kept frame; the log says so once).

What stays the same as `decoder: opencv`: the decoder's thread count (`decode_threads`; 0: one per
CPU core, at most 16, as OpenCV picks), frame and slice threading as FFmpeg's default, the open and
read timeouts on network streams (FFmpeg's interrupt callback, the mechanism OpenCV uses), and end
of file and `loop` (the file is opened again at its end). RTSP goes over TCP (`rtsp_transport=tcp`),
as the GStreamer presets do. What differs: a frame whose size changes mid-stream is delivered at
its own size (OpenCV scales it to the first one's), and a rotated video (a phone recording with a
display matrix) is not turned (OpenCV turns it): the log says so once.

`av` is imported on first use only (`load_av`): configuration checks and cameras with another
decoder never load it, and a missing PyAV is an error naming the extra to install. FFmpeg's own
log stays off (PyAV's default), and errors are built from FFmpeg's error text, never from PyAV's
exception text, which quotes the URL with its credentials.

One thread uses a source from open to release, as every source.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Iterator

import numpy as np

from ..config.sources import PYAV_HINT
from ..redact import redact_text, redact_url
from .base import (DEFAULT_DECODE_THREADS, FillingSource, SourceError, SourceKind, UnsupportedSourceError, local_path,
                   plausible_fps, source_kind)
from .yuv import Colorimetry, I420Converter, Matrix, opencv_colorimetry, opencv_reads_tags, plane

log = logging.getLogger(__name__)

#: what OpenCV gives FFmpeg's decoder for decode_threads 0: one thread per CPU core, at most this
MAX_AUTO_THREADS = 16
#: packets in a row that gave no frame (all refused by the decoder) before the stream counts as
#: broken; OpenCV's grab() gives up after the same number of attempts
MAX_PACKETS_WITHOUT_FRAME = 4096
#: the decoder's planar 4:2:0 formats (yuvj420p: full range, FFmpeg's older way to say so)
I420_FORMATS = frozenset({"yuv420p", "yuvj420p"})
#: 4:2:0 with U and V interleaved in one plane (V first for nv21)
SEMI_PLANAR_FORMATS = {"nv12": (0, 1), "nv21": (1, 0)}
#: AVColorSpace values and the swscale matrix each one selects (others: BT.601, FFmpeg's default)
_MATRICES = {1: Matrix.BT709, 4: Matrix.FCC, 5: Matrix.BT601, 6: Matrix.BT601, 7: Matrix.SMPTE240M,
             9: Matrix.BT2020, 10: Matrix.BT2020}
_FULL_RANGE = 2  # AVCOL_RANGE_JPEG
#: AVColorPrimaries FFmpeg 8 converts as they are (reserved, BT.709, unspecified, BT.470M/BG,
#: SMPTE 170M/240M), as `gstreamer._PLAIN_PRIMARIES`; AVColorTransferCharacteristic PQ and HLG
_PLAIN_PRIMARIES = frozenset(range(8))
_HDR_TRANSFERS = {16: "SMPTE2084", 18: "ARIB_STD_B67"}
#: what OpenCV 5's FFmpeg maps the colours of such a stream to (AVCOL_PRI_BT709, AVCOL_TRC_BT709)
BT709_PRIMARIES = 1
BT709_TRANSFER = 1

_load_lock = threading.Lock()


def load_av() -> Any:
    """The `av` module. Raises UnsupportedSourceError naming the extra when PyAV is missing or does
    not load: retrying cannot help."""
    with _load_lock:
        try:
            import av
            import av.error  # noqa: F401 - the exception classes
            import av.video.reformatter  # noqa: F401 - swscale's flags
        except ImportError as exc:
            raise UnsupportedSourceError(f"decoder: pyav needs PyAV, which is not installed or does not load "
                                         f"({exc}): {PYAV_HINT}") from None
        return av


def decoder_threads(decode_threads: int) -> int:
    """FFmpeg decoder threads for `decode_threads`: as given, or for 0 what OpenCV picks."""
    if decode_threads > 0:
        return decode_threads
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_THREADS))


def ffmpeg_reason(exc: Exception) -> str:
    """FFmpeg's text for an error (PyAV's `strerror`), without the file name or URL PyAV adds."""
    reason = getattr(exc, "strerror", None)
    return redact_text(str(reason)) if reason else type(exc).__name__


def frame_colorimetry(frame: Any) -> Colorimetry:
    """The matrix and range a decoded frame states (BT.601 limited where it states none)."""
    full = frame.color_range == _FULL_RANGE or frame.format.name.startswith("yuvj")
    return Colorimetry(_MATRICES.get(int(frame.colorspace), Matrix.BT601), full)


def colour_managed(frame: Any) -> str | None:
    """What in a frame's tags OpenCV 5's FFmpeg 8 maps to BT.709 before converting, or None."""
    primaries = int(getattr(frame, "color_primaries", 2))  # PyAV before 15 does not tell: unspecified
    if primaries not in _PLAIN_PRIMARIES:
        return f"colour primaries (AVColorPrimaries {primaries})"
    transfer = _HDR_TRANSFERS.get(int(getattr(frame, "color_trc", 2)))
    return f"HDR transfer function ({transfer})" if transfer else None


class PyAvSource(FillingSource):
    """A video file or an rtsp:// camera decoded by PyAV (module docstring).

    `grab()` decodes the next frame and holds it (the decoder's own picture, no copy);
    `grabbed_size()` is its size; `retrieve(out)` converts it into `out` (or a new array). A file
    that ends is `eof` (with `loop` it is opened again); a stream that ends, fails or is silent
    for `read_timeout_s` is an `error`.
    """


    def __init__(self, url: str, *, camera: str | None = None, loop: bool = False, open_timeout_s: float = 10.0,
                 read_timeout_s: float = 10.0, decode_threads: int = DEFAULT_DECODE_THREADS):
        kind = source_kind(url)
        if kind not in (SourceKind.RTSP, SourceKind.FILE):
            raise UnsupportedSourceError(f"decoder: pyav reads rtsp:// cameras and video files, not a {kind.value} "
                                         f"source: use decoder: opencv or auto")
        self._target = url if kind is SourceKind.RTSP else local_path(url)
        super().__init__(redact_url(url) if kind is SourceKind.RTSP else self._target, camera)
        self.kind = kind
        self.is_live = kind.is_live
        self._loop = loop and not self.is_live
        self._timeouts = (open_timeout_s, read_timeout_s)
        self._threads = decoder_threads(decode_threads)
        self._av = load_av()
        self._converter = I420Converter(keep_buffers=False)  # it converts only the kept frames
        self._reformatter: Any = None  # PyAV's swscale, for the pictures the converter does not take
        self._told: set[str] = set()
        self._container: Any = None
        self._stream: Any = None
        self._packets: Iterator[Any] | None = None
        self._decoded: deque[Any] = deque()  # frames a packet gave beyond the one grabbed
        self._current: Any = None  # the grabbed frame, until the next grab
        self._drained = False  # the decoder was flushed: no frame follows
        self._frames_this_pass = 0
        self.frame_count = 0
        self._open()

    # -- opening -----------------------------------------------------------------------------------
    def _open(self) -> None:
        av = self._av
        if self.kind is SourceKind.FILE and not os.path.isfile(self._target):
            raise SourceError(f"{self.description}: no such file")
        options = {"rtsp_transport": "tcp"} if self.kind is SourceKind.RTSP else {}
        try:
            container = av.open(self._target, mode="r", options=options,
                                timeout=self._timeouts if self.is_live else None)
        except av.error.ExitError:
            raise SourceError(f"{self.description}: cannot open stream: no answer within "
                              f"{self._timeouts[0]:.1f} s (open timed out)") from None
        except (av.error.FFmpegError, OSError) as exc:
            what = "stream" if self.is_live else "video file"
            raise SourceError(f"{self.description}: cannot open {what}: {ffmpeg_reason(exc)}") from None
        if not container.streams.video:
            container.close()
            raise SourceError(f"{self.description}: has no video stream")
        stream = container.streams.video[0]
        context = stream.codec_context
        context.thread_count = self._threads
        context.thread_type = "AUTO"  # frame and slice threads, FFmpeg's default (and OpenCV's)
        self._container, self._stream = container, stream
        self._packets = container.demux(stream)  # the other streams are discarded, never read
        self._decoded.clear()
        self._drained = False
        self.nominal_fps = _stream_fps(stream)
        self.frame_count = max(0, int(stream.frames or 0))

    # -- reading -----------------------------------------------------------------------------------
    def grab(self) -> bool:
        self._current = None
        self._grabbed = None
        if self._container is None:
            self.error = "source released"
            return False
        frame = self._next_frame()
        if frame is None and self.error is None and self._loop and self._frames_this_pass > 0:
            frame = self._rewind()
        if frame is None:
            self._note_end()
            return False
        self._current = frame
        self._frames_this_pass += 1
        return True

    def grabbed_size(self) -> tuple[int, int] | None:
        frame = self._current
        return None if frame is None else (int(frame.width), int(frame.height))

    def retrieve(self, out: np.ndarray | None = None) -> np.ndarray | None:
        frame, self._current = self._current, None  # the decoder's picture goes back to its pool
        if frame is None:
            self.error = self.error or "no frame grabbed"
            return None
        try:
            return self._convert(frame, out)
        except (self._av.error.FFmpegError, TypeError, ValueError) as exc:
            self.error = f"{self.description}: a frame could not be converted: {ffmpeg_reason(exc)}"
            return None

    def _next_frame(self) -> Any:
        """The next decoded frame, or None with `error` set, or at the end (the decoder drained)."""
        av = self._av
        refused = 0
        while not self._decoded:
            if self._drained or self._packets is None:
                return None
            try:
                packet = next(self._packets)
            except StopIteration:
                self._drained = True
                return None
            except av.error.ExitError:
                self.error = f"{self.description}: no frame for {self._timeouts[1]:.1f} s (read timed out)"
                return None
            except (av.error.FFmpegError, OSError) as exc:
                self.error = f"{self.description}: read failed: {ffmpeg_reason(exc)}"
                return None
            try:
                self._decoded.extend(self._stream.codec_context.decode(packet))
            except av.error.FFmpegError as exc:  # a corrupt packet: skipped, as OpenCV's grab() does
                refused += 1
                if refused >= MAX_PACKETS_WITHOUT_FRAME:
                    self.error = (f"{self.description}: {refused} packets in a row could not be decoded "
                                  f"(the last: {ffmpeg_reason(exc)})")
                    return None
                continue
            if packet.size == 0:  # the flush packet demux() ends with: the decoder gave its last frames
                self._drained = True
        return self._decoded.popleft()

    def _rewind(self) -> Any:
        """Start again at the first frame (`loop`): opened again, as VideoFileSource does."""
        log.debug("%s: end of file, starting again (loop)", self.description, extra={"camera": self.camera})
        self._frames_this_pass = 0
        if not self._open_again(self._close, self._open):
            return None
        return self._next_frame()

    def _note_end(self) -> None:
        """Why grab() gave nothing: a file's end (`eof`), or an error (a stream that ended, a file
        that never gave a frame, a failure)."""
        if self.error is not None:
            return
        if self.is_live:
            self.error = f"{self.description}: the stream ended"
        elif self._frames_this_pass == 0:
            self.error = f"{self.description}: no frame could be decoded"
        else:
            self.eof = True
            if self.frame_count and self._frames_this_pass < self.frame_count - max(2, self.frame_count // 100):
                self._warn("%s: ended after %d of %d frames the container announced",
                           self.description, self._frames_this_pass, self.frame_count)

    # -- converting --------------------------------------------------------------------------------
    def _convert(self, frame: Any, out: np.ndarray | None) -> np.ndarray:
        """The frame as BGR in `out` (when its shape fits): 4:2:0 of an even height by
        `yuv.I420Converter`, anything else by swscale as OpenCV calls it (`_swscale`)."""
        name = frame.format.name
        rotation = getattr(frame, "rotation", 0)
        if rotation:
            self._tell([f"it is rotated by {rotation} degrees: OpenCV turns such frames, decoder: pyav does not"])
        managed = colour_managed(frame) if opencv_reads_tags() else None  # OpenCV 4 converts such colours as they are
        if (name in I420_FORMATS or name in SEMI_PLANAR_FORMATS) and frame.height % 2 == 0 and managed is None:
            luma, u, v = _planes(frame, name)
            return self._converter.planes_to_bgr(luma, u, v, opencv_colorimetry(frame_colorimetry(frame)), out)
        if name not in self._told:
            self._told.add(name)
            log.info("%s: %s %dx%d%s is converted by swscale (PyAV), into a frame-sized array of its own and "
                     "copied", self.description, name, frame.width, frame.height, f", {managed}" if managed else "",
                     extra={"camera": self.camera})
        return self._swscale(frame, out, to_bt709=managed is not None)

    def _swscale(self, frame: Any, out: np.ndarray | None, to_bt709: bool) -> np.ndarray:
        """swscale (PyAV's) called as OpenCV calls it: SWS_BICUBIC, and with OpenCV 5 the stream's
        matrix and range, wide-gamut and HDR colours mapped to BT.709 (`to_bt709`); with OpenCV 4
        BT.601. The same pictures, byte for byte, for odd heights, 4:2:2, 4:4:4, 10-bit, grey, BT.2020
        primaries and PQ (measured, OpenCV 5.0). Into an array of its own, copied into `out`."""
        reformatter = self._av.video.reformatter
        colorspace = None if opencv_reads_tags() else reformatter.Colorspace.ITU601
        mapped = {"dst_color_primaries": BT709_PRIMARIES, "dst_color_trc": BT709_TRANSFER} if to_bt709 else {}
        if self._reformatter is None:  # one per source: it keeps swscale's context (and its colour map)
            self._reformatter = reformatter.VideoReformatter()
        image = self._reformatter.reformat(frame, format="bgr24", interpolation=reformatter.Interpolation.BICUBIC,
                                           src_colorspace=colorspace, threads=1, **mapped).to_ndarray()
        if out is not None and out.shape == image.shape and out.dtype == image.dtype:
            np.copyto(out, image)
            return out
        return np.ascontiguousarray(image)

    def _tell(self, reasons: list[str]) -> None:
        """Log once per source what makes its pictures differ from decoder: opencv's."""
        for reason in reasons:
            if reason not in self._told:
                self._told.add(reason)
                self._warn("%s: pictures differ from decoder: opencv's: %s", self.description, reason)

    # -- releasing ---------------------------------------------------------------------------------
    def _close(self) -> None:
        packets, self._packets = self._packets, None
        container, self._container = self._container, None
        self._stream = None
        self._current = None
        self._decoded.clear()
        if packets is not None and hasattr(packets, "close"):
            packets.close()  # the generator frees its packet
        if container is not None:
            container.close()

    def release(self) -> None:
        self._close()
        self._grabbed = None
        self._reformatter = None  # kept across a loop's reopening: its colour map takes seconds to build


def _planes(frame: Any, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views (no copy) of a 4:2:0 frame's Y, U and V samples."""
    width, height = int(frame.width), int(frame.height)
    chroma_w, chroma_h = (width + 1) // 2, (height + 1) // 2
    planes = frame.planes
    luma = plane(planes[0], 0, planes[0].line_size, height, width)
    if name in I420_FORMATS:
        return (luma, plane(planes[1], 0, planes[1].line_size, chroma_h, chroma_w),
                plane(planes[2], 0, planes[2].line_size, chroma_h, chroma_w))
    pairs = plane(planes[1], 0, planes[1].line_size, chroma_h, chroma_w * 2)
    u_at, v_at = SEMI_PLANAR_FORMATS[name]
    return luma, pairs[:, u_at::2], pairs[:, v_at::2]


def _stream_fps(stream: Any) -> float | None:
    """The stream's frame rate as OpenCV reports it (the average rate, else the guessed one), when plausible."""
    for rate in (stream.average_rate, stream.guessed_rate):
        if rate:
            fps = plausible_fps(float(rate))
            if fps is not None:
                return fps
    return None
