"""Opening a camera URL as a frame source: RTSP, HTTP MJPEG, video files, V4L2 devices, image folders,
and synthetic frames (benchmarks and dry runs).

Every source has the same small surface -- `read()` returning a BGR image or None, `eof` and
`error` to tell the end of a finite source from a failure, `is_live`, `nominal_fps`, `release()` --
so the reader's state machine does not care where frames come from.

A source is used by one thread only, from open to release: OpenCV captures are not safe to
release while another thread is inside read(), so the reader never shares one.

FFmpeg decodes files and network streams with `decode_threads` threads per camera (default 1).
OpenCV's own default is one decoder thread per CPU core (at most 16) for every capture; with frame
threading each of those threads holds its own decoded pictures, and a decoder of N threads hands
out a frame only N-1 frames late. On a 2-core box a 1080p camera sampled to 5 fps then costs 3 more
threads and 10-20 MB more memory than with one thread (`yoloedge bench memory --decode-threads 0`),
and both grow with the core count. An appliance reads many cameras at once, so the parallelism
comes from the cameras, not from inside one decoder; one thread decodes 1080p H.264 at 110-120
frames/s on a shared x86 core, 4K at about 30 (`yoloedge bench decode --decode-threads 1,2,4`).

What a capture holds, at 1080p: FFmpeg's pictures, 3.1 MB each and, for H.264, about 1 MB more
of motion vectors and macroblock tables per picture -- 3 pictures for a stream without B-frames,
5 to 7 with them (the stream decides: 20.9 MB for one x264 clip, 29.3 MB for a longer encode of
the same scene) -- the demuxer and codec contexts (about 1.8 MB), and, from the first retrieve(),
OpenCV's own BGR picture (6.3 MB) and swscale context: OpenCV converts into that picture and then
copies it into the caller's array, and its API has no way around the copy. That array is the
reader's: `OpenCvCapture` retrieves only the frames a camera keeps, into a buffer the reader
borrows from a `FramePool` shared by the cameras for as long as its sink needs the frame, so a
1080p camera costs a share of one or two 6.2 MB buffers instead of one of its own, and the
frames it skips are never converted (`yoloedge bench memory`, README "Memory per camera").
`decoder: pyav` (`sources.pyav`) decodes with FFmpeg without OpenCV's picture in between.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

import cv2
import numpy as np

from ..errors import ImageError, YoloedgeError
from ..redact import redact_url
from .imagesize import DEFAULT_LIMITS, ImageLimits, read_image
from .jpeg import CpuJpegDecoder, JpegDecoder, JpegDecoderKind, JpegDecoderMissing, JpegDecoderUnavailable, choose
from .jpeg import read_image as read_image_with

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm"})
#: a reported frame rate outside this range is a container default or garbage, not information
_PLAUSIBLE_FPS = (0.1, 1000.0)
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: FFmpeg decoder threads per camera unless configured (CameraConfig.decode_threads); 0: OpenCV's default
DEFAULT_DECODE_THREADS = 1
#: the open parameter that sets FFmpeg's decoder thread count (OpenCV 4.7+); None in older OpenCV
_N_THREADS_PROP: int | None = getattr(cv2, "CAP_PROP_N_THREADS", None)
_noted: set[str] = set()
_noted_lock = threading.Lock()

SYNTHETIC_SCHEME = "synthetic://"
#: largest synthetic frame side (8K is 7680x4320); a typo must not allocate gigabytes
SYNTHETIC_MAX_SIDE = 8192
_SYNTHETIC_SIZE = re.compile(r"^([0-9]+)[xX]([0-9]+)$")


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
    low, high = _PLAUSIBLE_FPS
    return float(value) if low <= value <= high else None


def _note_once(msg: str, *args: object) -> None:
    """A debug line the first time only: said per process, not per camera or reconnect."""
    with _noted_lock:
        if msg in _noted:
            return
        _noted.add(msg)
    log.debug(msg, *args)


def decode_thread_params(decode_threads: int) -> list[int]:
    """VideoCapture open parameters that give FFmpeg's decoder `decode_threads` threads.

    0 (or less) passes nothing: OpenCV then picks one thread per CPU core, at most 16
    (OPENCV_FFMPEG_THREADS overrides that). The count must be given to the constructor: set()
    after opening is refused. An OpenCV without CAP_PROP_N_THREADS (before 4.7) cannot limit it;
    then nothing is passed either -- an unknown open parameter would make FFmpeg refuse to open.
    """
    if decode_threads <= 0:
        return []
    if _N_THREADS_PROP is None:
        _note_once("OpenCV %s has no CAP_PROP_N_THREADS: decode_threads is ignored, FFmpeg uses "
                   "OpenCV's default decoder threads", cv2.__version__)
        return []
    return [_N_THREADS_PROP, int(decode_threads)]


def _check_decode_threads(cap: cv2.VideoCapture, decode_threads: int) -> None:
    """Say once in the debug log when the backend did not take the thread count (e.g. a plugin)."""
    if decode_threads <= 0 or _N_THREADS_PROP is None:
        return
    used = int(cap.get(_N_THREADS_PROP))
    if used != decode_threads:
        _note_once("FFmpeg decodes with %d threads, not the %d decode_threads asks for "
                   "(this OpenCV backend does not honour CAP_PROP_N_THREADS)", used, decode_threads)


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
    #: the JPEG decoder in use (`jpeg.JpegDecoderKind` value) for folders and HTTP cameras; None
    #: for sources whose frames are not JPEGs
    jpeg_decoder: str | None = None
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


class OpenCvCapture(FillingSource):
    """What every cv2.VideoCapture source shares: `grab()` decodes (no conversion, no copy),
    `retrieve(out)` converts to BGR and copies into `out`.

    So the frames a camera does not keep are never converted, and a kept frame costs the reader
    only a buffer lent for as long as the sink needs it (see `framepool`), not an array per camera.
    The size of a grabbed frame comes from the capture's FRAME_WIDTH/HEIGHT: FFmpeg's backend
    scales every frame to the size it opened the stream with (and turns it as the stream's
    rotation says), so those are the size retrieve() gives. Should a backend not tell (0), the
    frame is converted to learn it.
    """

    _cap: cv2.VideoCapture | None

    def _grab_capture(self) -> bool:
        """cap.grab(); the frame converted to learn its size, held for retrieve(), is forgotten."""
        self._grabbed = None
        cap = self._cap
        return cap is not None and bool(cap.grab())

    def grabbed_size(self) -> tuple[int, int] | None:
        cap = self._cap
        if cap is None:
            return None
        width, height = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width > 0 and height > 0:
            return width, height
        if self._grabbed is None:  # the backend does not say: convert it now, hand it over later
            self._grabbed = self._retrieve_capture(None)
        return super().grabbed_size()

    def retrieve(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._grabbed is not None:  # converted already by grabbed_size()
            return super().retrieve(out)
        return self._retrieve_capture(out)

    def _retrieve_capture(self, out: np.ndarray | None) -> np.ndarray | None:
        """cap.retrieve(): OpenCV writes into `out` when size and type match, and returns a new
        array when they do not."""
        cap = self._cap
        if cap is None:
            self.error = "source released"
            return None
        ok, image = cap.retrieve(out) if out is not None else cap.retrieve()
        if not ok or image is None:
            self.error = f"{self.description}: a frame could not be converted"
            return None
        return image

    def release(self) -> None:
        cap, self._cap = self._cap, None
        self._grabbed = None
        if cap is not None:
            cap.release()


class CaptureSource(OpenCvCapture):
    """Anything cv2.VideoCapture reads: network streams, video files, V4L2 devices."""

    def __init__(self, kind: SourceKind, cap: cv2.VideoCapture, description: str, camera: str | None = None):
        super().__init__(description, camera)
        self.kind = kind
        self.is_live = kind.is_live
        self._cap = cap
        self.nominal_fps = plausible_fps(cap.get(cv2.CAP_PROP_FPS))

    def grab(self) -> bool:
        if self._cap is None:
            self.error = "source released"
            return False
        if self._grab_capture():
            return True
        self.error = f"{self.description}: stream ended or read failed"
        return False


class VideoFileSource(OpenCvCapture):
    """A video file; with `loop` it is reopened at its end and reading goes on."""

    kind = SourceKind.FILE
    is_live = False

    def __init__(self, path: str, loop: bool, camera: str | None = None,
                 decode_threads: int = DEFAULT_DECODE_THREADS):
        super().__init__(path, camera)
        self._path = path
        self._loop = loop
        self._decode_threads = decode_threads
        self._cap = open_video_file(path, decode_threads)
        self.nominal_fps = plausible_fps(self._cap.get(cv2.CAP_PROP_FPS))
        self.frame_count = max(0, int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT)))
        self._frames_this_pass = 0
        self._pass_start_s = 0.0  # media time of this pass's first frame (loops add up)
        self._position_s = 0.0  # of the grabbed frame
        self._step_s = 1.0 / (self.nominal_fps or DEFAULT_FILE_FPS)  # last frame-to-frame step

    def grab(self) -> bool:
        if self._grab_once():
            return True
        if not self._loop or self._frames_this_pass == 0:
            self._note_end()
            return False
        try:
            self._rewind()
        except SourceError as exc:
            self.error = str(exc)
            return False
        if self._grab_once():
            return True
        self._note_end()
        return False

    def _grab_once(self) -> bool:
        if not self._grab_capture():
            return False
        self._frames_this_pass += 1
        self._note_position()
        return True

    def _note_position(self) -> None:
        """After a grab, FFmpeg's POS_MSEC is that frame's presentation time from the file's start;
        a backend that does not tell (or goes backwards) gets one step past the previous frame."""
        cap = self._cap
        pos_ms = cap.get(cv2.CAP_PROP_POS_MSEC) if cap is not None else -1.0
        told = math.isfinite(pos_ms) and pos_ms >= 0
        position = self._pass_start_s + pos_ms / 1000.0 if told else -math.inf
        previous = self._position_s
        if self._frames_this_pass == 1:  # a pass's first frame
            position = max(position, self._pass_start_s)
        elif position <= previous:
            position = previous + self._step_s
        else:
            self._step_s = position - previous
        self._position_s = position

    def position_s(self) -> float | None:
        return self._position_s

    def _rewind(self) -> None:
        """Start again at the first frame. Reopening is slower than seeking but works for every
        container and codec, and happens once per pass."""
        log.debug("%s: end of file, starting again (loop)", self._path, extra={"camera": self.camera})
        self.release()
        self._pass_start_s = self._position_s + self._step_s  # the loop goes on in media time
        self._frames_this_pass = 0
        self._cap = open_video_file(self._path, self._decode_threads)

    def _note_end(self) -> None:
        """A finite file that yielded frames has ended; one that never yielded any is broken."""
        if self._frames_this_pass == 0:
            self.error = f"{self._path}: no frame could be decoded"
            return
        self.eof = True
        if self.frame_count and self._frames_this_pass < self.frame_count - max(2, self.frame_count // 100):
            self._warn("%s: ended after %d of %d frames the container announced",
                       self._path, self._frames_this_pass, self.frame_count)


#: a folder source names this many skipped images in the log, one line each, then only counts them
MAX_SKIPS_LOGGED = 100


class ImageFolderSource(Source):
    """The image files of a folder, in sorted name order, one per read; `loop` rescans and restarts.

    An unreadable image -- corrupt, empty, not a regular file, or over `limits` (a decompression
    bomb) -- is skipped and counted rather than failing the camera: one bad file must not stop a
    folder of thousands. Each is logged once, not on every pass of a loop. A pass that yields no
    image at all is an error, which names the last reason.
    """

    kind = SourceKind.FOLDER
    is_live = False
    nominal_fps = None

    def __init__(self, folder: str, loop: bool, camera: str | None = None,
                 limits: ImageLimits = DEFAULT_LIMITS, decoder: JpegDecoder | None = None):
        super().__init__(folder, camera)
        self._decoder: JpegDecoder = decoder or CpuJpegDecoder()
        self.jpeg_decoder = self._decoder.kind.value
        self._folder = folder
        self._loop = loop
        self._limits = limits
        self._files = list_images(folder)
        if not self._files:
            raise SourceError(f"{folder}: no image files")
        self._index = 0
        self._images_this_pass = 0
        self._logged: set[str] = set()
        self._last_skip: str | None = None

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
            try:
                image = read_image_with(path, self._decoder, self._limits)
            except ImageError as exc:
                self._skip(path, str(exc))
                continue
            self._images_this_pass += 1
            return image

    def _skip(self, path: str, reason: str) -> None:
        self.skipped += 1
        self._last_skip = reason
        if path in self._logged or len(self._logged) > MAX_SKIPS_LOGGED:
            return
        self._logged.add(path)
        if len(self._logged) > MAX_SKIPS_LOGGED:
            self._warn("%s: more than %d images skipped; further ones are only counted",
                       self._folder, MAX_SKIPS_LOGGED)
            return
        self._warn("%s, skipped", reason)

    def _restart(self) -> None:
        self._files = list_images(self._folder)
        self._index = 0
        self._images_this_pass = 0

    def _note_end(self) -> None:
        if self._images_this_pass == 0:
            last = f" (the last: {self._last_skip})" if self._last_skip else ""
            self.error = f"{self._folder}: no readable image{last}"
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


# -- synthetic frames ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SyntheticSpec:
    """What `synthetic://WIDTHxHEIGHT?fps=F[&image=PATH]` asks for."""

    width: int
    height: int
    fps: float
    image: str | None = None  # None: a generated textured frame

    @property
    def url(self) -> str:
        """The URL in canonical form (the image path percent-encoded where needed)."""
        fps = f"{self.fps:.15g}"
        image = "" if self.image is None else "&image=" + quote(self.image, safe="/")
        return f"{SYNTHETIC_SCHEME}{self.width}x{self.height}?fps={fps}{image}"


def parse_synthetic_url(url: str) -> SyntheticSpec:
    """Read `synthetic://WIDTHxHEIGHT?fps=F&image=PATH`; raises UnsupportedSourceError saying what
    is wrong (it can never work, so retrying is pointless). `image` is optional and
    percent-decoded ('+' stays a plus: it is a path, not a form value); a relative path is left
    as it is (the config resolves it from the config file's folder)."""
    if not url.lower().startswith(SYNTHETIC_SCHEME):
        raise UnsupportedSourceError(f"a synthetic URL starts with {SYNTHETIC_SCHEME}")
    size, _, query = url[len(SYNTHETIC_SCHEME):].partition("?")
    match = _SYNTHETIC_SIZE.match(size)
    width, height = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not (1 <= width <= SYNTHETIC_MAX_SIDE and 1 <= height <= SYNTHETIC_MAX_SIDE):
        shown = f", not {size!r}" if "@" not in size else ""  # never echo what looks like credentials
        raise UnsupportedSourceError(f"the size must be WIDTHxHEIGHT in pixels, each 1 to {SYNTHETIC_MAX_SIDE}{shown}")
    params: dict[str, str] = {}
    for part in query.split("&") if query else ():
        key, sep, value = part.partition("=")
        if key not in ("fps", "image") or not sep:
            raise UnsupportedSourceError(f"unknown parameter {key!r}: only fps=F and image=PATH")
        if key in params:
            raise UnsupportedSourceError(f"{key} is given twice")
        params[key] = unquote(value)
    if "fps" not in params:
        raise UnsupportedSourceError("fps=F is missing: the frames per second to deliver")
    low, high = _PLAUSIBLE_FPS
    try:
        fps = float(params["fps"])
    except ValueError:
        fps = math.nan
    if not low <= fps <= high:  # also NaN
        raise UnsupportedSourceError(f"fps must be a number from {low:g} to {high:g}, not {params['fps']!r}")
    image = params.get("image")
    if image is not None and not image.strip():
        raise UnsupportedSourceError("image= is empty: give an image file, or leave image out for a generated frame")
    return SyntheticSpec(width, height, fps, image)


def synthetic_image_problem(path: str) -> str | None:
    """Why `path` cannot be a synthetic camera's image, or None. Reads the file's signature only."""
    if not os.path.exists(path):
        return f"image not found: {path}"
    if not os.path.isfile(path):
        return f"image is not a file: {path}"
    if not cv2.haveImageReader(path):
        return f"not an image OpenCV can read: {path}"
    return None


def textured_frame(width: int, height: int) -> np.ndarray:
    """A deterministic BGR test frame with gradients, a checkerboard and smooth detail, so that
    resizing and encoding do real work (a flat frame would flatter them)."""
    x = np.arange(width, dtype=np.float64)[None, :]
    y = np.arange(height, dtype=np.float64)[:, None]
    checker = ((np.arange(width)[None, :] // 48 + np.arange(height)[:, None] // 48) % 2) * 48.0 - 24.0
    channels = (x * (255.0 / max(width - 1, 1)) + checker,
                y * (255.0 / max(height - 1, 1)) + checker,
                127.5 + 127.5 * np.sin(x / 23.0) * np.cos(y / 17.0) - checker)
    frame = np.empty((height, width, 3), dtype=np.uint8)
    for index, channel in enumerate(channels):
        frame[:, :, index] = np.clip(np.broadcast_to(channel, (height, width)), 0, 255)
    return frame


def synthetic_frame(spec: SyntheticSpec) -> np.ndarray:
    """The frame a synthetic source delivers: the image resized once to the requested size
    (cv2.INTER_AREA to shrink, cv2.INTER_LINEAR otherwise), or `textured_frame`. Read-only."""
    if spec.image is None:
        frame = textured_frame(spec.width, spec.height)
    else:
        try:
            image = read_image(spec.image)
        except ImageError as exc:
            raise SourceError(synthetic_image_problem(spec.image) or str(exc)) from None
        frame = resize_to(image, spec.width, spec.height)
    frame = np.ascontiguousarray(frame)
    frame.setflags(write=False)
    return frame


def resize_to(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """`image` at width x height; the image itself when it already is that size."""
    if image.shape[1] == width and image.shape[0] == height:
        return image
    shrink = width <= image.shape[1] and height <= image.shape[0]
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


class SyntheticSource(Source):
    """One pre-decoded frame, delivered `fps` times a second, forever: a camera without decoding.

    Every read returns the same read-only ndarray (never a copy), so decoding and copying cost
    nothing and benchmarks measure the rest of the pipeline. It is a live source: the reader does
    not pace live sources, so read() paces itself. Frame k is due at start + k / fps on the
    (monotonic) clock; read() sleeps until the next frame is due -- never longer than one frame
    period, so a stop request waits at most that long. Oversleeping a little does not accumulate
    (the schedule is kept), and a consumer that falls a whole period or more behind (a pause, a
    slow accelerator) gets the frame at once and the schedule restarts from then: no burst of
    back-to-back frames to catch up, as a live camera whose frames nobody read.

    `clock` and `sleep` are injectable for tests.
    """

    kind = SourceKind.SYNTHETIC
    is_live = True

    def __init__(self, url: str, camera: str | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        try:
            spec = parse_synthetic_url(url)
        except UnsupportedSourceError as exc:
            raise UnsupportedSourceError(f"{redact_url(url)}: {exc}") from exc
        super().__init__(spec.url, camera)
        self.spec = spec
        self.nominal_fps = spec.fps
        self._period = 1.0 / spec.fps
        self._clock = clock
        self._sleep = sleep
        self._frame: np.ndarray | None = synthetic_frame(spec)
        self._due: float | None = None  # when the next frame is due; None: at once

    def read(self) -> np.ndarray | None:
        frame = self._frame
        if frame is None:
            self.error = "source released"
            return None
        now = self._clock()
        due = self._due
        if due is None or now - due >= self._period:
            due = now  # the first frame, or a whole period late: start the schedule again from now
        elif due > now:
            self._sleep(min(due - now, self._period))
        self._due = due + self._period
        return frame

    def release(self) -> None:
        self._frame = None


def open_video_file(path: str, decode_threads: int = DEFAULT_DECODE_THREADS) -> cv2.VideoCapture:
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file")
    cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, decode_thread_params(decode_threads))
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open video file")
    _check_decode_threads(cap, decode_threads)
    return cap


def open_stream(url: str, kind: SourceKind, open_timeout_s: float, read_timeout_s: float,
                camera: str | None = None, decode_threads: int = DEFAULT_DECODE_THREADS) -> CaptureSource:
    """Open an RTSP or HTTP stream with FFmpeg.

    The timeouts and the decoder thread count must be given to the constructor: set() after
    opening is ignored, and without timeouts a silent camera blocks read() for OpenCV's built-in
    30 s (research/infra.md).
    """
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, max(1, int(open_timeout_s * 1000)),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC, max(1, int(read_timeout_s * 1000)),
        *decode_thread_params(decode_threads),
    ]
    safe = redact_url(url)
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, params)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{safe}: cannot open stream")
    _check_decode_threads(cap, decode_threads)
    return CaptureSource(kind, cap, safe, camera)


def open_v4l2(path: str, camera: str | None = None) -> CaptureSource:
    cap = cv2.VideoCapture(path, cv2.CAP_V4L2)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open V4L2 device")
    return CaptureSource(SourceKind.V4L2, cap, path, camera)


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
    from .mjpeg import MjpegSource, NotMjpegError  # here: mjpeg builds on this module's Source

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
