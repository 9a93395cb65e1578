"""Opening a camera URL as a frame source: RTSP, HTTP MJPEG, video files, V4L2 devices, image folders.

Every source has the same small surface -- `read()` returning a BGR image or None, `eof` and
`error` to tell the end of a finite source from a failure, `is_live`, `nominal_fps`, `release()` --
so the reader's state machine does not care where frames come from.

A source is used by one thread only, from open to release: OpenCV captures are not safe to
release while another thread is inside read(), so the reader never shares one.
"""

from __future__ import annotations

import logging
import os
import re
from enum import Enum
from pathlib import Path
from urllib.parse import unquote, urlsplit

import cv2
import numpy as np

from ..errors import YoloedgeError
from ..redact import redact_url

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm"})
#: a reported frame rate outside this range is a container default or garbage, not information
_PLAUSIBLE_FPS = (0.1, 1000.0)
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


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

    @property
    def is_live(self) -> bool:
        return self in (SourceKind.RTSP, SourceKind.HTTP, SourceKind.V4L2)


def source_kind(url: str) -> SourceKind:
    """Classify a camera URL. A path is a folder if it is a directory now, else a video file."""
    lower = url.lower()
    if lower.startswith(("rtsp://", "rtsps://")):
        return SourceKind.RTSP
    if lower.startswith(("http://", "https://")):
        return SourceKind.HTTP
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


def plausible_fps(value: float) -> float | None:
    low, high = _PLAUSIBLE_FPS
    return float(value) if low <= value <= high else None


class Source:
    """A frame source. Subclasses implement `read()`; `eof`/`error` explain a None from it."""

    kind: SourceKind
    is_live: bool = True
    #: frames per second the source delivers, when it says so (files); None when unknown
    nominal_fps: float | None = None

    def __init__(self, description: str, camera: str | None = None):
        self.description = description  # redacted; used in logs and errors
        self.camera = camera  # for log records (journald CAMERA=)
        self.eof = False
        self.error: str | None = None

    def _warn(self, msg: str, *args: object) -> None:
        log.warning(msg, *args, extra={"camera": self.camera})

    def read(self) -> np.ndarray | None:
        raise NotImplementedError

    def release(self) -> None:
        """Free the device/connection. Idempotent."""


class CaptureSource(Source):
    """Anything cv2.VideoCapture reads: network streams, video files, V4L2 devices."""

    def __init__(self, kind: SourceKind, cap: cv2.VideoCapture, description: str, camera: str | None = None):
        super().__init__(description, camera)
        self.kind = kind
        self.is_live = kind.is_live
        self._cap: cv2.VideoCapture | None = cap
        self.nominal_fps = plausible_fps(cap.get(cv2.CAP_PROP_FPS))

    def read(self) -> np.ndarray | None:
        if self._cap is None:
            self.error = "source released"
            return None
        ok, image = self._cap.read()
        if ok and image is not None:
            return image
        self.error = f"{self.description}: stream ended or read failed"
        return None

    def release(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()


class VideoFileSource(Source):
    """A video file; with `loop` it is reopened at its end and reading goes on."""

    kind = SourceKind.FILE
    is_live = False

    def __init__(self, path: str, loop: bool, camera: str | None = None):
        super().__init__(path, camera)
        self._path = path
        self._loop = loop
        self._cap: cv2.VideoCapture | None = open_video_file(path)
        self.nominal_fps = plausible_fps(self._cap.get(cv2.CAP_PROP_FPS))
        self.frame_count = max(0, int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT)))
        self._frames_this_pass = 0

    def read(self) -> np.ndarray | None:
        image = self._read_once()
        if image is not None or not self._loop or self._frames_this_pass == 0:
            if image is None:
                self._note_end()
            return image
        try:
            self._rewind()
        except SourceError as exc:
            self.error = str(exc)
            return None
        image = self._read_once()
        if image is None:
            self._note_end()
        return image

    def _read_once(self) -> np.ndarray | None:
        if self._cap is None:
            return None
        ok, image = self._cap.read()
        if not ok or image is None:
            return None
        self._frames_this_pass += 1
        return image

    def _rewind(self) -> None:
        """Start again at the first frame. Reopening is slower than seeking but works for every
        container and codec, and happens once per pass."""
        log.debug("%s: end of file, starting again (loop)", self._path, extra={"camera": self.camera})
        self.release()
        self._frames_this_pass = 0
        self._cap = open_video_file(self._path)

    def _note_end(self) -> None:
        """A finite file that yielded frames has ended; one that never yielded any is broken."""
        if self._frames_this_pass == 0:
            self.error = f"{self._path}: no frame could be decoded"
            return
        self.eof = True
        if self.frame_count and self._frames_this_pass < self.frame_count - max(2, self.frame_count // 100):
            self._warn("%s: ended after %d of %d frames the container announced",
                       self._path, self._frames_this_pass, self.frame_count)

    def release(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()


class ImageFolderSource(Source):
    """The image files of a folder, in sorted name order, one per read; `loop` rescans and restarts.

    An unreadable image is skipped with a warning rather than failing the camera: one corrupt file
    must not stop a folder of thousands. A pass that yields no image at all is an error.
    """

    kind = SourceKind.FOLDER
    is_live = False
    nominal_fps = None

    def __init__(self, folder: str, loop: bool, camera: str | None = None):
        super().__init__(folder, camera)
        self._folder = folder
        self._loop = loop
        self._files = list_images(folder)
        if not self._files:
            raise SourceError(f"{folder}: no image files")
        self._index = 0
        self._images_this_pass = 0

    def read(self) -> np.ndarray | None:
        while True:
            if self._index >= len(self._files):
                if not self._loop or self._images_this_pass == 0:
                    self._note_end()
                    return None
                self._restart()
                continue
            path = self._files[self._index]
            self._index += 1
            image = cv2.imread(path, cv2.IMREAD_COLOR)
            if image is not None:
                self._images_this_pass += 1
                return image
            self._warn("%s: cannot decode image, skipped", path)

    def _restart(self) -> None:
        self._files = list_images(self._folder)
        self._index = 0
        self._images_this_pass = 0

    def _note_end(self) -> None:
        if self._images_this_pass == 0:
            self.error = f"{self._folder}: no readable image"
        else:
            self.eof = True


def list_images(folder: str) -> list[str]:
    """Image files directly in `folder`, sorted by name (hidden files ignored)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise SourceError(f"{folder}: cannot list folder: {exc.strerror}") from exc
    return [os.path.join(folder, n) for n in names
            if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES
            and os.path.isfile(os.path.join(folder, n))]


def open_video_file(path: str) -> cv2.VideoCapture:
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file")
    cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open video file")
    return cap


def open_stream(url: str, kind: SourceKind, open_timeout_s: float, read_timeout_s: float,
                camera: str | None = None) -> CaptureSource:
    """Open an RTSP or HTTP stream with FFmpeg.

    The timeouts must be given to the constructor: set() after opening is silently ignored, and
    without them a silent camera blocks read() for OpenCV's built-in 30 s (research/infra.md).
    """
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, max(1, int(open_timeout_s * 1000)),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC, max(1, int(read_timeout_s * 1000)),
    ]
    safe = redact_url(url)
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{safe}: cannot open stream")
    return CaptureSource(kind, cap, safe, camera)


def open_v4l2(path: str, camera: str | None = None) -> CaptureSource:
    cap = cv2.VideoCapture(path, cv2.CAP_V4L2)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open V4L2 device")
    return CaptureSource(SourceKind.V4L2, cap, path, camera)


def open_source(url: str, *, loop: bool = False, open_timeout_s: float = 10.0,
                read_timeout_s: float = 10.0, camera: str | None = None) -> Source:
    """Open `url` as the right kind of source. Raises SourceError (safe to log) on failure,
    UnsupportedSourceError when the URL can never work. `camera` names it in log records."""
    kind = source_kind(url)
    if kind in (SourceKind.RTSP, SourceKind.HTTP):
        return open_stream(url, kind, open_timeout_s, read_timeout_s, camera)
    path = local_path(url)
    if kind is SourceKind.V4L2:
        return open_v4l2(path, camera)
    if kind is SourceKind.FOLDER:
        return ImageFolderSource(path, loop, camera)
    return VideoFileSource(path, loop, camera)
