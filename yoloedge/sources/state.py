"""The states a camera reader reports (status, MQTT `state` messages, logs).

A str-valued enum, so a state compares equal to its name and serializes without help.
"""

from __future__ import annotations

from enum import Enum


class CameraState(str, Enum):
    CONNECTING = "connecting"  # opening the source, or opened and waiting for the first frame
    STREAMING = "streaming"  # good frames are arriving
    STALLED = "stalled"  # no good frame for stall_timeout_s; the capture is abandoned
    BACKOFF = "backoff"  # waiting before the next connection attempt
    FAILED = "failed"  # max_retries consecutive attempts failed; the reader gave up
    DISABLED = "disabled"  # `enabled: false`: never opened
    ENDED = "ended"  # a file or folder without `loop` has been read to its end
    STOPPED = "stopped"  # stop() was called

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        """True for states the reader never leaves on its own (its thread has finished)."""
        return self in _TERMINAL


_TERMINAL = frozenset({CameraState.FAILED, CameraState.DISABLED, CameraState.ENDED, CameraState.STOPPED})
