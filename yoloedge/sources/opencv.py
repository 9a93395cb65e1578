"""What every cv2.VideoCapture source shares: grab without converting, retrieve into the caller's array,
and FFmpeg's decoder thread count.

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
frames it skips are never converted (`yoloedge bench memory`, docs/benchmarks.md "Memory per camera").
`decoder: pyav` (`sources.pyav`) decodes with FFmpeg without OpenCV's picture in between.
"""

from __future__ import annotations

import logging
import threading

import cv2
import numpy as np

from .base import FillingSource

log = logging.getLogger(__name__)

#: the open parameter that sets FFmpeg's decoder thread count (OpenCV 4.7+); None in older OpenCV
_N_THREADS_PROP: int | None = getattr(cv2, "CAP_PROP_N_THREADS", None)
_noted: set[str] = set()
_noted_lock = threading.Lock()


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


def check_decode_threads(cap: cv2.VideoCapture, decode_threads: int) -> None:
    """Say once in the debug log when the backend did not take the thread count (e.g. a plugin)."""
    if decode_threads <= 0 or _N_THREADS_PROP is None:
        return
    used = int(cap.get(_N_THREADS_PROP))
    if used != decode_threads:
        _note_once("FFmpeg decodes with %d threads, not the %d decode_threads asks for "
                   "(this OpenCV backend does not honour CAP_PROP_N_THREADS)", used, decode_threads)



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

