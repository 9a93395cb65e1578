"""A camera's way into every model it feeds: the frame decoded once, handed to each model's intake.

Each model has its own intake (`intake.CameraIntake`: its own resize to that model's input size,
its own ring of pictures, its own bounded queue in that model's batcher), so a slow model fills
and drops from its own queue only (a live camera's queues keep the latest frame, each counting its
own drops) and never holds the other model back. The reader's decoded frame is lent only for this
call; each intake's resize reads it, none copies it whole.

A lossless camera (`realtime: false`) waits for room in every model's queue: its reader hands the
same frame over in slices (see `sources.delivery`); a slice that finds one model's queue full
returns False, and the next slice skips the models that already took the frame, so none gets it
twice. The models are asked in order, so those that took it are always the first ones: a count
is all the feed keeps, and nothing is allocated per frame.
"""

from __future__ import annotations

from typing import Mapping

from ..sources.frame import Frame
from .intake import CameraIntake
from .queues import FrameQueue


class CameraFeed:
    def __init__(self, intakes: Mapping[str, CameraIntake]):
        self.intakes = dict(intakes)  # model name -> its intake, in `models:` order
        self._order = tuple(self.intakes.values())
        self._pending: Frame | None = None  # a frame the first `_given` intakes took, the next one refused
        self._given = 0

    def __call__(self, frame: Frame, timeout_s: float) -> bool:
        """The camera's `FrameSink` (the reader's thread): True once every model has the frame."""
        if frame is not self._pending:  # the reader offers a refused frame again, the same object
            self._given = 0
        for intake in self._order[self._given:]:
            if not intake(frame, timeout_s):
                self._pending = frame
                return False
            self._given += 1
        self._pending = None
        return True

    @property
    def queues(self) -> dict[str, FrameQueue]:
        return {name: intake.queue for name, intake in self.intakes.items()}

    @property
    def dropped(self) -> int:
        return sum(intake.queue.dropped for intake in self.intakes.values())

    def close(self) -> None:
        for intake in self.intakes.values():
            intake.close()
