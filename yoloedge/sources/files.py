"""Video files read through cv2.VideoCapture (FFmpeg), with their media time, looped on request."""

from __future__ import annotations

import logging
import math
import os

import cv2

from .base import DEFAULT_DECODE_THREADS, DEFAULT_FILE_FPS, SourceError, SourceKind, plausible_fps
from .opencv import OpenCvCapture, check_decode_threads, decode_thread_params

log = logging.getLogger(__name__)


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



def open_video_file(path: str, decode_threads: int = DEFAULT_DECODE_THREADS) -> cv2.VideoCapture:
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file")
    cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, decode_thread_params(decode_threads))
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"{path}: cannot open video file")
    check_decode_threads(cap, decode_threads)
    return cap

