"""The host's half of `decoder: dvpp`: a camera's H.264 / H.265 access units, demultiplexed by
FFmpeg through PyAV and never decoded here (the Atlas card's VDEC decodes them).

`AccessUnitReader` opens what `decoder: pyav` opens -- an rtsp:// camera (over TCP, with the same
bounded open and read timeouts: FFmpeg's interrupt callback) or a video file -- takes its first
video stream, tells what it is (`StreamInfo`, enough for `backends.dvpp_limits` to refuse a
stream the card cannot decode before anything is sent) and hands out one `AccessUnit` per packet:
Annex-B byte stream, with the parameter sets in front of every keyframe, so a decoder that starts
(or starts again) at any keyframe can decode it (`demux_nal`). An MP4/MKV stream's length-prefixed
units go through FFmpeg's own `h264_mp4toannexb` / `hevc_mp4toannexb` filter; whether a stream
needs it is read from its extradata, as FFmpeg's filters decide it, not assumed from the URL.

Files are read as fast as the consumer pulls, as `pyav.PyAvSource` reads them: the camera reader
paces them by `nominal_fps`; each unit's `pts_s` is its media time from the file's start,
continuing across `loop`'s passes (the file is opened again at its end). For RTSP, `pts_s` is the
stream's own time.

Decoding: none, not even while opening. FFmpeg's `avformat_find_stream_info` would decode a
stream's first frames (H.264: until it has guessed the reordering delay) to learn the pixel format;
it is told to skip every frame (`skip_frame`), the chroma format and bit depth are read from the
SPS (`demux_sps`), and a live stream is probed for `LIVE_ANALYZE_S` only (without decoding, FFmpeg
would read its full default of 5 s). Size, profile, level and frame rate are FFmpeg's, from its
parser and the container.

Errors are the sources': `SourceError` (`UnsupportedSourceError` where retrying cannot help), with
FFmpeg's text and a redacted URL, never PyAV's exception text. One thread uses a reader.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..redact import redact_url
from .base import DEFAULT_FILE_FPS, SourceError, SourceKind, UnsupportedSourceError, local_path, source_kind
from .demux_layout import Chroma, pix_fmt_layout
from .demux_sps import layout_pix_fmt, sps_layout
from .demux_nal import Codec, ParameterSets, extradata_parameter_sets, length_prefixed, split_annexb, starts_annexb
from .pyav import _stream_fps, ffmpeg_reason, load_av

log = logging.getLogger(__name__)

#: FFmpeg's decoder names for the codecs the card decodes, and their bitstream filters
_CODECS = {"h264": Codec.H264, "hevc": Codec.H265}
#: FFmpeg opens a stream without decoding any of it (its probe would decode H.264 frames to learn
#: the pixel format, read here from the SPS instead: `demux_sps`)
PROBE_OPTIONS = {"skip_frame": "all"}
#: how much of a live stream FFmpeg reads while it opens it: without decoding, FFmpeg never
#: finishes guessing H.264's reordering delay, and would read its default 5 s every time
LIVE_ANALYZE_S = 0.5
#: an open that fails after this fraction of its timeout was given up by the interrupt
OPEN_TIMED_OUT_FRACTION = 0.95
_TO_ANNEXB = {Codec.H264: "h264_mp4toannexb", Codec.H265: "hevc_mp4toannexb"}


@dataclass(frozen=True)
class StreamInfo:
    """A video stream as the demuxer describes it, before any frame is decoded. `codec` is "h264",
    "h265" or FFmpeg's name for another codec; `profile` FFmpeg's name ("High", "Main 10");
    `level` the codec's level number times ten for H.264 ("4.1": 41), times 30 for H.265, None
    when unknown; `chroma` and `bit_depth` are read from `pix_fmt` (`demux_layout`)."""

    codec: str
    profile: str | None
    level: int | None
    pix_fmt: str | None
    width: int
    height: int
    fps: float | None
    chroma: Chroma | None
    bit_depth: int | None


@dataclass(frozen=True, slots=True)
class AccessUnit:
    """One access unit (one picture) in Annex-B format: a keyframe has its parameter sets in front.
    `pts_s`: presentation time in seconds (a file's media time; None when the stream has none)."""

    data: bytes
    pts_s: float | None
    keyframe: bool


class AccessUnitReader:
    """A camera's access units (module docstring). `read()` gives the next one, or None at the end
    (`eof`: a file read to its end) or on a failure (`error`, a stream's end included); iterating
    gives them until then. Raises SourceError when the source does not open."""

    def __init__(self, url: str, *, camera: str | None = None, loop: bool = False, open_timeout_s: float = 10.0,
                 read_timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        kind = source_kind(url)
        if kind not in (SourceKind.RTSP, SourceKind.FILE):
            raise UnsupportedSourceError(f"decoder: dvpp reads rtsp:// cameras and video files, not a {kind.value} "
                                         f"source")
        self._target = url if kind is SourceKind.RTSP else local_path(url)
        self.description = redact_url(url) if kind is SourceKind.RTSP else self._target
        self.camera = camera
        self.kind = kind
        self.is_live = kind.is_live
        self._loop = loop and not self.is_live
        self._timeouts = (open_timeout_s, read_timeout_s)
        self._clock = clock
        self._av = load_av()
        self.eof = False
        self.error: str | None = None
        self.nominal_fps: float | None = None
        self.frame_count = 0
        self.info: StreamInfo
        self._container: Any = None
        self._stream: Any = None
        self._packets: Iterator[Any] | None = None
        self._filter: Any = None  # the mp4toannexb bitstream filter, for length-prefixed streams
        self._sets: ParameterSets | None = None
        self._ready: deque[AccessUnit] = deque()
        self._ended = False  # the demuxer gave its last packet (the filter was flushed)
        self._units_this_pass = 0
        self._pass_start_s = 0.0  # media time of this pass's first unit (loops add up)
        self._start_pts: int | None = None
        self._last_s = 0.0  # the latest presentation time handed out (files)
        self._told_sps = False
        self._open()

    # -- opening -----------------------------------------------------------------------------------
    def _open(self) -> None:
        av = self._av
        if self.kind is SourceKind.FILE and not os.path.isfile(self._target):
            raise SourceError(f"{self.description}: no such file")
        options = dict(PROBE_OPTIONS)
        if self.kind is SourceKind.RTSP:
            options.update(rtsp_transport="tcp", analyzeduration=str(int(LIVE_ANALYZE_S * 1e6)))
        started = self._clock()
        try:
            container = av.open(self._target, mode="r", options=options,
                                timeout=self._timeouts if self.is_live else None)
        except (av.error.FFmpegError, OSError) as exc:
            # FFmpeg's RTSP client turns the interrupt of a silent server into "Invalid data": an
            # open that failed once its timeout had passed was that interrupt
            if isinstance(exc, av.error.ExitError) or \
                    (self.is_live and self._clock() - started >= OPEN_TIMED_OUT_FRACTION * self._timeouts[0]):
                raise SourceError(f"{self.description}: cannot open stream: no answer within "
                                  f"{self._timeouts[0]:.1f} s (open timed out)") from None
            what = "stream" if self.is_live else "video file"
            raise SourceError(f"{self.description}: cannot open {what}: {ffmpeg_reason(exc)}") from None
        try:
            self._prepare(container)
        except BaseException:
            container.close()
            raise

    def _prepare(self, container: Any) -> None:
        """Take the container's first video stream: its description, and how its packets become
        Annex-B access units."""
        if not container.streams.video:
            raise SourceError(f"{self.description}: has no video stream")
        stream = container.streams.video[0]
        context = stream.codec_context
        if context is None:
            raise UnsupportedSourceError(f"{self.description}: FFmpeg has no decoder for its video codec, so it "
                                         f"cannot describe it")
        codec = _CODECS.get(context.name)
        self._filter, self._sets = None, None
        if codec is not None:
            extradata = context.extradata
            try:
                self._sets = ParameterSets(codec, extradata_parameter_sets(codec, extradata))
            except ValueError as exc:
                raise SourceError(f"{self.description}: {exc}") from None
            if length_prefixed(extradata):
                self._filter = self._av.bitstream.BitStreamFilterContext(_TO_ANNEXB[codec], stream)
        self.info = stream_info(stream, self._layout())
        self.nominal_fps = self.info.fps
        self.frame_count = max(0, int(stream.frames or 0))
        self._container, self._stream = container, stream
        self._packets = container.demux(stream)  # the other streams are discarded, never read
        self._ready.clear()
        self._ended = False
        self._start_pts = None

    def _layout(self) -> tuple[Chroma, int] | None:
        """The chroma format and bit depth the latest SPS states; None before one came (or when it
        does not parse: the log says so once)."""
        sps = self._sets.sps() if self._sets is not None else None
        if sps is None or self._sets is None:
            return None
        try:
            return sps_layout(self._sets.codec, sps)
        except ValueError as exc:
            if not self._told_sps:
                self._told_sps = True
                log.warning("%s: %s", self.description, exc, extra={"camera": self.camera})
            return None

    # -- reading -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[AccessUnit]:
        while (unit := self.read()) is not None:
            yield unit

    def read(self) -> AccessUnit | None:
        """The next access unit, or None (see `eof` and `error`)."""
        if self._container is None:
            self.error = self.error or "source released"
            return None
        if self._sets is None:
            self.error = (f"{self.description}: its video is {self.info.codec}, not H.264 or H.265: it has no "
                          f"access units for the card's decoder")
            return None
        while not self._ready:
            if self._pull():
                continue
            if self.error is None and self._loop and self._units_this_pass > 0 and self._rewind():
                continue
            self._note_end()
            return None
        self._units_this_pass += 1
        return self._ready.popleft()

    def _pull(self) -> bool:
        """Demultiplex one packet into `_ready` (it may give no unit). False at the end (the
        filter flushed) or on a failure (`error` set)."""
        av = self._av
        if self._ended or self._packets is None:
            return False
        try:
            packet = next(self._packets)
        except StopIteration:
            self._ended = True
            return self._take(self._filter.filter(None) if self._filter is not None else [])
        except av.error.ExitError:
            self.error = f"{self.description}: no access unit for {self._timeouts[1]:.1f} s (read timed out)"
            return False
        except (av.error.FFmpegError, OSError) as exc:
            self.error = f"{self.description}: read failed: {ffmpeg_reason(exc)}"
            return False
        if packet.size == 0:  # the flush packet demux() ends with: nothing to hand out
            return True
        try:
            packets = self._filter.filter(packet) if self._filter is not None else [packet]
        except av.error.FFmpegError as exc:
            self.error = f"{self.description}: a packet could not be made Annex-B: {ffmpeg_reason(exc)}"
            return False
        return self._take(packets) or self.error is None

    def _take(self, packets: list[Any]) -> bool:
        """Queue the packets as access units. False (with `error`) on one that is not Annex-B."""
        sets = self._sets
        if sets is None:
            return False
        for packet in packets:
            data = bytes(packet)
            if not data:
                continue
            if not starts_annexb(data):
                self.error = (f"{self.description}: a packet is neither Annex-B nor length-prefixed as its "
                              f"extradata says (it starts {data[:4].hex()})")
                return False
            keyframe = bool(packet.is_keyframe) or sets.is_keyframe(split_annexb(data))
            self._ready.append(AccessUnit(sets.prepare(data, keyframe), self._pts_s(packet), keyframe))
        if self.info.chroma is None and self._sets is not None and self._sets.sps() is not None:
            layout = self._layout()  # the stream's first SPS came in-band (none in the SDP)
            if layout is not None:
                self.info = stream_info(self._stream, layout)
        return bool(packets)

    def _pts_s(self, packet: Any) -> float | None:
        """A file's media time from its start (continuing across loops); a stream's own time."""
        if packet.pts is None or packet.time_base is None:
            return None
        if self.is_live:
            return float(packet.pts * packet.time_base)
        if self._start_pts is None:
            start = self._stream.start_time
            self._start_pts = int(start) if start is not None else int(packet.pts)
        position = self._pass_start_s + float((packet.pts - self._start_pts) * packet.time_base)
        self._last_s = max(self._last_s, position)
        return position

    def _rewind(self) -> bool:
        """Start again at the first unit (`loop`): opened again, as PyAvSource does."""
        log.debug("%s: end of file, starting again (loop)", self.description, extra={"camera": self.camera})
        self._pass_start_s = self._last_s + 1.0 / (self.nominal_fps or DEFAULT_FILE_FPS)
        self._units_this_pass = 0
        self._close()
        try:
            self._open()
        except SourceError as exc:
            self.error = str(exc)
            return False
        return True

    def _note_end(self) -> None:
        if self.error is not None:
            return
        if self.is_live:
            self.error = f"{self.description}: the stream ended"
        elif self._units_this_pass == 0:
            self.error = f"{self.description}: no access unit could be read"
        else:
            self.eof = True

    # -- releasing ---------------------------------------------------------------------------------
    def _close(self) -> None:
        packets, self._packets = self._packets, None
        container, self._container = self._container, None
        self._stream = self._filter = None
        self._ready.clear()
        if packets is not None and hasattr(packets, "close"):
            packets.close()  # the generator frees its packet
        if container is not None:
            container.close()

    def close(self) -> None:
        """Close the stream or file. Idempotent."""
        self._close()

    release = close  # the sources' name for it

    def __enter__(self) -> "AccessUnitReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_info(stream: Any, layout: tuple[Chroma, int] | None = None) -> StreamInfo:
    """What a PyAV video stream says about itself, without decoding (`StreamInfo`); `layout`, the
    SPS's chroma format and bit depth, goes before the pixel format FFmpeg names (which it knows
    only when its probe decoded), and names it where FFmpeg does not."""
    context = stream.codec_context
    name = context.name
    codec = _CODECS[name].value if name in _CODECS else name
    pix_fmt = context.format.name if context.format is not None else None
    chroma, bit_depth = pix_fmt_layout(pix_fmt) if layout is None else layout
    if pix_fmt is None and chroma is not None and bit_depth is not None:
        pix_fmt = layout_pix_fmt(chroma, bit_depth)
    level = getattr(context, "level", None)
    return StreamInfo(codec=codec, profile=context.profile, level=int(level) if level and level > 0 else None,
                      pix_fmt=pix_fmt, width=int(context.width), height=int(context.height),
                      fps=_stream_fps(stream), chroma=chroma, bit_depth=bit_depth)
