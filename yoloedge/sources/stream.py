"""Network streams (RTSP, HTTP) and V4L2 capture devices read through cv2.VideoCapture."""

from __future__ import annotations

import cv2

from ..redact import redact_url
from .base import DEFAULT_DECODE_THREADS, SourceError, SourceKind, plausible_fps
from .opencv import OpenCvCapture, check_decode_threads, decode_thread_params


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
    check_decode_threads(cap, decode_threads)
    return CaptureSource(kind, cap, safe, camera)


def open_v4l2(path: str, camera: str | None = None) -> CaptureSource:
    cap = cv2.VideoCapture(path, cv2.CAP_V4L2)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open V4L2 device")
    return CaptureSource(SourceKind.V4L2, cap, path, camera)

