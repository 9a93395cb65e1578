"""`decoder: dvpp`: a camera the Atlas card decodes. The host demultiplexes the stream into access
units (`demux`: PyAV's demuxer, no decoding) and hands them to the card's VDEC; the pictures come
back as `DevicePicture`s in the card's memory and travel on to the model input without the host
ever reading their pixels (the preparer letterboxes them on the card, `pipeline.prepare`).

The card's side is not imported here (`sources` never imports `backends`): the camera's reader is
given a `MediaEngine` by whoever assembles the camera (the daemon, through `pipeline.media`), which
opens the camera's decoder channel on its card once and keeps it across reconnects.

The source's frame is an empty (h, w, 0) placeholder array, so everything that counts, paces,
samples and sizes frames works unchanged; `take_picture` hands over the picture itself. A grabbed
picture that is sampled out is given back at the next grab.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .base import Source, SourceError, SourceKind, UnsupportedSourceError, plausible_fps
from .frame import DevicePicture

if TYPE_CHECKING:
    from .demux import AccessUnit, AccessUnitReader, StreamInfo

log = logging.getLogger(__name__)


class VideoDecoder(Protocol):
    """One camera's hardware decoder channel on its card (opened once, reused across reconnects)."""

    def send(self, data: bytes, pts_s: float | None) -> bool:
        """Queue one Annex-B access unit for decoding; False (not sent) while decoded pictures
        wait to be taken and nothing else can be decoded into; SourceError when the card refuses it."""
        ...

    def next_picture(self, timeout_s: float) -> DevicePicture | None:
        """The next decoded picture (held for the caller), waiting up to `timeout_s`; None if none."""
        ...

    def flush(self, timeout_s: float) -> None:
        """The end of the stream: every access unit sent comes out as a picture (or an error)."""
        ...

    @property
    def error(self) -> str | None:
        """Why the last picture failed to decode, if one did (for logs; the stream goes on)."""
        ...


class MediaEngine(Protocol):
    """A camera's way onto its card's media engine."""

    @property
    def device(self) -> str:
        """The device (worker name) whose input sets take this camera's pictures."""
        ...

    def unsupported(self, info: StreamInfo) -> str | None:
        """Why the card cannot decode this stream (codec, profile, chroma, size), or None."""
        ...

    def video_decoder(self, info: StreamInfo) -> VideoDecoder:
        """The camera's decoder channel for `info` (the same one again after a reconnect)."""
        ...


class DvppSource(Source):
    """rtsp:// cameras and video files decoded by the card (module docstring). A frame the card
    cannot decode is counted (status' `decode_errors` of the card) and the stream goes on, as a
    host decoder skips a broken frame."""

    def __init__(self, url: str, kind: SourceKind, engine: MediaEngine, *, loop: bool = False,
                 open_timeout_s: float = 10.0, read_timeout_s: float = 10.0, camera: str | None = None,
                 description: str = ""):
        super().__init__(description or url, camera)
        self.kind = kind
        self.is_live = kind.is_live
        self._url = url
        self._engine = engine
        self._loop = loop
        self._open_timeout_s = open_timeout_s
        self._read_timeout_s = read_timeout_s
        self._demux: AccessUnitReader | None = None
        self._decoder: VideoDecoder | None = None
        self._held: DevicePicture | None = None  # grabbed, not yet retrieved
        self._picture: DevicePicture | None = None  # retrieved, not yet taken
        self._placeholder = np.empty((0, 0, 0), np.uint8)
        self._flushed = False
        self._last_pts = 0.0
        self._pending: AccessUnit | None = None  # read, not yet taken by the decoder
        self._open()

    def _open(self) -> None:
        from .demux import AccessUnitReader  # PyAV, on first use
        demux = AccessUnitReader(self._url, camera=self.camera, loop=self._loop, open_timeout_s=self._open_timeout_s,
                                 read_timeout_s=self._read_timeout_s)
        try:
            info = demux.info
            why = self._engine.unsupported(info)
            if why is not None:
                raise UnsupportedSourceError(f"{self.description}: the card cannot decode this stream: {why}; "
                                             f"use decoder: pyav or opencv for this camera")
            self._decoder = self._engine.video_decoder(info)
        except BaseException:
            demux.close()
            raise
        self._demux = demux
        self.nominal_fps = plausible_fps(info.fps) if info.fps else None
        self._flushed = False
        log.info("camera %s: %s %dx%d decoded on %s (DVPP)", self.camera, info.codec, info.width, info.height,
                 self._engine.device, extra={"camera": self.camera})

    def grab(self) -> bool:
        self._drop_grabbed()
        decoder, demux = self._decoder, self._demux
        if decoder is None or demux is None:
            self.error = "source released"
            return False
        while True:
            picture = decoder.next_picture(0.0)
            if picture is not None:
                self._held = picture
                return True
            if self._flushed:  # the flush waited for every picture sent: none is on its way
                picture = decoder.next_picture(0.0)
                if picture is not None:
                    self._held = picture
                    return True
                self.eof = True  # the demuxer loops a file itself (`loop`), across which times add up
                return False
            unit, self._pending = self._pending or demux.read(), None
            if unit is None:
                if demux.error:
                    self.error = f"{self.description}: {demux.error}"
                    return False
                decoder.flush(self._read_timeout_s)
                self._flushed = True
                continue
            try:
                if not decoder.send(unit.data, unit.pts_s):
                    self._pending = unit  # pictures first: taking them frees the ring
            except SourceError as exc:
                self.error = str(exc)
                return False

    def read(self) -> np.ndarray | None:
        """grab() and retrieve(): the placeholder; the picture waits for `take_picture` (or goes
        back to its ring at the next retrieve)."""
        return self.retrieve() if self.grab() else None

    def grabbed_size(self) -> tuple[int, int] | None:
        picture = self._held
        return None if picture is None else (picture.width, picture.height)

    def retrieve(self, out: np.ndarray | None = None) -> np.ndarray | None:
        picture, self._held = self._held, None
        if picture is None:
            return None
        if picture.pts_s is not None:
            self._last_pts = picture.pts_s
        if self._picture is not None:  # retrieved before and never taken
            self._picture.release()
        self._picture = picture
        if self._placeholder.shape[:2] != (picture.height, picture.width):
            self._placeholder = np.empty((picture.height, picture.width, 0), np.uint8)
        return self._placeholder

    def take_picture(self) -> DevicePicture | None:
        picture, self._picture = self._picture, None
        return picture

    def position_s(self) -> float | None:
        return None if self.is_live else self._last_pts

    def _drop_grabbed(self) -> None:
        picture, self._held = self._held, None
        if picture is not None:
            picture.release()

    def _close_demux(self) -> None:
        demux, self._demux = self._demux, None
        if demux is not None:
            demux.close()

    def release(self) -> None:
        """The demuxer closes; the decoder channel stays open for the next connection."""
        self._drop_grabbed()
        picture, self._picture = self._picture, None
        if picture is not None:
            picture.release()
        self._close_demux()
        self._decoder = None
