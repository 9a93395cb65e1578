"""What every frame source is: `Source`, the errors a source raises, and the kind of a camera URL.

Every source has the same small surface -- `read()` returning a BGR image or None, `eof` and
`error` to tell the end of a finite source from a failure, `is_live`, `nominal_fps`, `release()` --
so the reader's state machine does not care where frames come from. One module per kind builds
on this one: `stream` (OpenCV network streams and V4L2 devices), `files` (video files), `folder`
(image folders), `synthetic`, `mjpeg`, `gstreamer`, `pyav`; `opening` picks one for a camera.
Nothing here imports OpenCV.

A source is used by one thread only, from open to release: OpenCV captures are not safe to
release while another thread is inside read(), so the reader never shares one.
"""

from __future__ import annotations

import logging
import os
import re
from enum import Enum
from typing import Callable
from urllib.parse import unquote, urlsplit

import numpy as np

from ..config.sources import PLAUSIBLE_FPS, SYNTHETIC_SCHEME
from ..errors import YoloedgeError
from ..redact import redact_url
from .frame import DevicePicture

log = logging.getLogger(__name__)

_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: FFmpeg decoder threads per camera unless configured (CameraConfig.decode_threads); 0: the
#: decoder's own default (OpenCV: one per CPU core)
DEFAULT_DECODE_THREADS = 1


class SourceError(YoloedgeError):
    """A source could not be opened or read; the message is safe to log (no credentials)."""


class UnsupportedSourceError(SourceError):
    """The URL names a kind of source yoloedge cannot read; retrying will not help."""


class SourceKind(str, Enum):
    RTSP = "rtsp"
    HTTP = "http"  # MJPEG (multipart/x-mixed-replace) or anything else FFmpeg reads over HTTP
    FILE = "file"
    V4L2 = "v4l2"
    FOLDER = "folder"
    SYNTHETIC = "synthetic"  # one pre-decoded frame, delivered at a fixed rate (benchmarks, dry runs)
    PIPELINE = "pipeline"  # a camera's own GStreamer launch string (sources.gstreamer); it says if live

    @property
    def is_live(self) -> bool:
        return self in (SourceKind.RTSP, SourceKind.HTTP, SourceKind.V4L2, SourceKind.SYNTHETIC)


def source_kind(url: str) -> SourceKind:
    """Classify a camera URL. A path is a folder if it is a directory now, else a video file."""
    lower = url.lower()
    if lower.startswith(("rtsp://", "rtsps://")):
        return SourceKind.RTSP
    if lower.startswith(("http://", "https://")):
        return SourceKind.HTTP
    if lower.startswith(SYNTHETIC_SCHEME):
        return SourceKind.SYNTHETIC
    if _URL_SCHEME.match(url) and not lower.startswith("file://"):
        raise UnsupportedSourceError(f"unsupported camera URL scheme: {redact_url(url)}")
    path = local_path(url)
    if path.startswith("/dev/"):
        return SourceKind.V4L2
    return SourceKind.FOLDER if os.path.isdir(path) else SourceKind.FILE


def local_path(url: str) -> str:
    """The filesystem path of a plain path or a file:// URL."""
    if url.lower().startswith("file://"):
        return unquote(urlsplit(url).path)
    return url



#: a file that tells neither its frame rate nor its frames' times advances this fast in media time
DEFAULT_FILE_FPS = 25.0


def plausible_fps(value: float) -> float | None:
    """`value` when it is a frame rate a source could have, else None (a container default, garbage)."""
    low, high = PLAUSIBLE_FPS
    return float(value) if low <= value <= high else None


class Source:
    """A frame source. Subclasses implement `read()`, or `grab()` and `retrieve()` (OpenCV captures,
    `OpenCvCapture`); `eof`/`error` explain a None or False from them.

    The reader takes every frame in two steps: `grab()` the next frame, and `retrieve()` it only
    when it is kept (sampling, late frames). The defaults build both on `read()`, so a source that
    can do no better keeps its own array and hands it over as it is.
    """

    kind: SourceKind
    is_live: bool = True
    #: frames per second the source delivers, when it says so (files); None when unknown
    nominal_fps: float | None = None
    #: the JPEG decoder in use (a `config.sources.JpegDecoderKind` value) for folders and HTTP
    #: cameras; None for sources whose frames are not JPEGs
    jpeg_decoder: str | None = None
    #: why the camera's video decoder is the one it is (`opening.Choice.reason`); None: not said
    decoder_reason: str | None = None
    #: retrieve() converts into the array it is given (OpenCV captures): the reader lends it one
    #: from its `FramePool`. Other sources hand over arrays of their own and ignore it.
    fills_buffers = False

    def __init__(self, description: str, camera: str | None = None):
        self.description = description  # redacted; used in logs and errors
        self.camera = camera  # for log records (journald CAMERA=)
        self.eof = False
        self.error: str | None = None
        #: decode every frame into the same array: for a reader whose sink is done with a frame
        #: when it returns. Saves a frame-sized allocation (6.2 MB at 1080p) per read, and the
        #: memory the allocator keeps around after freeing them.
        self.reuse_frame = False
        self._frame: np.ndarray | None = None
        self._grabbed: np.ndarray | None = None  # the default grab()'s frame, until retrieved
        #: images skipped because they could not be read or were over the bounds (folders)
        self.skipped = 0

    def _warn(self, msg: str, *args: object) -> None:
        log.warning(msg, *args, extra={"camera": self.camera})

    def read(self) -> np.ndarray | None:
        raise NotImplementedError

    def _open_again(self, close: Callable[[], None], open_: Callable[[], None]) -> bool:
        """Close and open again, at the first frame (a file's `loop`: reopening works for every
        container and pipeline, where seeking does not). False, with `error` set to why, when it
        does not open: the reader then treats it as any failed read."""
        close()
        try:
            open_()
        except SourceError as exc:
            self.error = str(exc)
            return False
        return True

    def grab(self) -> bool:
        """Take the next frame without handing it over; False at the end or on a failure (see
        `eof` and `error`). Default: read() it, and hold it for retrieve()."""
        self._grabbed = None
        self._grabbed = self.read()
        return self._grabbed is not None

    def grabbed_size(self) -> tuple[int, int] | None:
        """(width, height) of the grabbed frame as retrieve() would give it, without retrieving it."""
        image = self._grabbed
        return None if image is None else (int(image.shape[1]), int(image.shape[0]))

    def retrieve(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The grabbed frame as a BGR (or gray) image; None on a failure (see `error`). A source
        that `fills_buffers` writes it into `out` when the shape fits (else into a new array);
        the default hands over read()'s own array and does not use `out`."""
        image, self._grabbed = self._grabbed, None
        return image

    def take_picture(self) -> DevicePicture | None:
        """The retrieved frame's picture on an accelerator, for sources the card decodes
        (`decoder: dvpp`); their retrieve() gives an empty (h, w, 0) placeholder. None for the
        others. Handed over once: the caller owns it (and releases it)."""
        return None

    def position_s(self) -> float | None:
        """The grabbed frame's media time in seconds from the start of the file, continuing
        across loops; None for live sources (their frames' time is when they were captured)."""
        return None

    def release(self) -> None:
        """Free the device/connection. Idempotent."""


class FillingSource(Source):
    """A source whose retrieve() converts into the array it is given (`fills_buffers`): read() is
    grab() and retrieve(), into the previous frame's array when `reuse_frame` is set. OpenCV's
    captures and `pyav.PyAvSource`."""

    fills_buffers = True

    def read(self) -> np.ndarray | None:
        """grab() and retrieve(), into the previous frame's array when `reuse_frame` is set."""
        if not self.grab():
            return None
        image = self.retrieve(self._frame if self.reuse_frame else None)
        if image is not None and self.reuse_frame:
            self._frame = image
        return image

