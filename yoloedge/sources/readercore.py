"""What the parts of a camera reader share: its counters, its log, and one connection attempt.

`reader.CameraReader` owns a `ReaderCounters` and a `CameraLog` and hands them to its two
parts: the connection supervisor (`connection.ConnectionSupervisor`: open, stall watch, backoff,
retries) and the frame delivery (`delivery.FrameDelivery`: pacing, sampling, the sink). A
`Connection` is one attempt, shared by the supervisor (which watches it) and the connection
thread (which reads through the delivery).

Locks: the reader's state lock (state changes and their callbacks) may be held while taking the
counters' lock, never the other way round; the counters' lock is a leaf, held for a few
assignments only.
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass
from enum import Enum

from ..redact import redact_text


@dataclass
class ReaderCounters:
    """What a reader counts and last saw, for `CameraReader.stats()`; read and written only under
    the reader's counters lock."""

    frames_in: int = 0
    frames_out: int = 0
    sampled_out: int = 0
    late_frames: int = 0
    reconnects: int = 0
    stalls: int = 0
    images_skipped: int = 0
    #: the video decoder in use (`auto` resolved once a connection has opened the source)
    decoder: str = ""
    decoder_reason: str | None = None  # why that one (`opening.Choice.reason`)
    jpeg_decoder: str | None = None  # the decoder the last opened source uses (folders, HTTP)
    error: str | None = None  # the failure the camera is in now; None once it streams again
    last_error: str | None = None  # the latest failure, kept after a recovery
    last_error_at: str | None = None  # when it happened (UTC)
    last_good_at: float | None = None
    frame_size: tuple[int, int] | None = None  # the latest frame's (width, height)
    size_changes: int = 0  # frames that came at another size than the one before them
    retry_in_s: float | None = None


class CameraLog:
    """A camera's log records: each with the camera's name (journald CAMERA=), every text
    scrubbed of credentials first."""

    def __init__(self, camera: str, logger: logging.Logger):
        self.camera = camera
        self._logger = logger

    def scrub(self, text: str) -> str:
        """Remove credentials from text that may quote the URL (FFmpeg, OpenCV, exceptions): the raw
        URL and its secrets in whatever form they appear (registered by the reader), then every
        URL in its display form."""
        return redact_text(text)

    def log(self, level: int, msg: str, *args: object) -> None:
        self._logger.log(level, msg, *args, extra={"camera": self.camera})

    def exception(self, what: str, exc: BaseException) -> None:
        """Log with the traceback, scrubbed: exception texts may quote the camera URL."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.log(logging.ERROR, "camera %s: %s\n%s", self.camera, what, self.scrub(text).rstrip())


class Outcome(Enum):
    """How one connection attempt ended."""

    ENDED = "ended"  # a finite source was read to its end
    ERROR = "error"  # open failed, the stream broke, or the reader hit a bug
    STALLED = "stalled"  # the watchdog gave up on a silent source
    STOPPED = "stopped"  # stop() was called
    SINK_CLOSED = "sink closed"  # the camera's sink takes no more frames: it is being removed
    UNSUPPORTED = "unsupported"  # the URL can never work


class Connection:
    """One connection attempt. Its thread owns the source; the supervisor only reads these
    fields and sets `cancelled`."""

    def __init__(self, number: int, now: float):
        self.number = number
        self.cancelled = threading.Event()  # supervisor: stop, stall or give-up; the thread exits
        self.wakeup = threading.Event()  # thread: first frame or finished; the supervisor looks
        self.started_at = now
        self.opened_at: float | None = None
        self.opened_wall = 0.0  # time.time() when the source opened
        self.first_frame_at: float | None = None
        self.last_good_at: float | None = None
        self.late_at: float | None = None  # when the last late read returned
        self.frame_size: tuple[int, int] | None = None  # of the first frame
        self.size: tuple[int, int] | None = None  # of the latest frame
        self.sizes_told: set[tuple[int, int]] = set()  # sizes a change to was logged for
        self.skipped_seen = 0  # the source's skipped-image count already added to the reader's
        #: while `reading`, a stall is counted from here: the start of the first read after the
        #: last good frame (time spent pacing or blocked on a full lossless queue does not count)
        self.progress_mark: float | None = None
        self.reading = False
        self.finished = False
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.thread: threading.Thread | None = None

    def finish(self, outcome: Outcome, reason: str | None) -> None:
        if self.finished:
            return
        self.outcome, self.reason = outcome, reason
        self.finished = True
        self.wakeup.set()

    def abandon(self) -> None:
        self.cancelled.set()

    def streamed_s(self, now: float) -> float | None:
        return None if self.first_frame_at is None else now - self.first_frame_at
