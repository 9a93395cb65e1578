"""The preallocated units a batch lives in on its way through the pipeline.

    camera queue --(preparer letterboxes)--> BatchBuffer slot --(worker runs)--> OutputSet --> post

A `BatchBuffer` is one input set of one device (its array is the backend's own buffer: pinned host
memory on Ascend, an IOBinding-bound array on ONNX Runtime); an `OutputSet` is one output set. Both
carry a list of `SlotMeta`, one per batch slot, allocated once. When a batch has run, the worker
*swaps* the two meta lists instead of copying them, so the frames' details travel on with the
outputs while the input buffer is refilled at once, and nothing is allocated per frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..preprocess import Geometry
from .modelinfo import ModelInfo


@dataclass(slots=True)
class SlotMeta:
    """What is known of the frame in one batch slot. Reused for frame after frame."""

    camera: str = ""
    seq: int = -1
    capture_time: float = 0.0  # wall clock, published as `ts`
    capture_mono: float = 0.0
    #: the frame's own time (Unix s; media time for files, see `sources.frame.Frame.frame_time`)
    frame_time: float = 0.0
    taken_mono: float = 0.0  # left its camera queue to be letterboxed
    geometry: Geometry | None = None  # None: the letterbox failed and the slot holds no frame

    @property
    def valid(self) -> bool:
        return self.geometry is not None


def new_metas(capacity: int) -> list[SlotMeta]:
    return [SlotMeta() for _ in range(capacity)]


class BatchBuffer:
    """One input set of one device: filled slot by slot by preparers, run as one batch.

    Its counters are guarded by the batcher's condition: `claimed` slots were handed to preparers,
    `filled` of them are written; a sealed buffer runs once `filled == claimed`.
    """

    def __init__(self, owner: str, index: int, array: np.ndarray,
                 device_slots: tuple[int, int] | None = None):
        self.owner = owner  # the worker that runs it (it is that device's memory)
        self.index = index  # input set number, for backend.run
        self.array = array
        #: (device address, bytes per slot) of an input set the card fills itself (`decoder:
        #: dvpp`: pictures letterboxed by its VPC straight into the model input); None: host memory
        self.device_slots = device_slots
        self.capacity = len(array)
        self.metas = new_metas(self.capacity)
        self.claimed = 0
        self.filled = 0
        self.opened_mono = 0.0  # when its first slot was claimed
        self.sealed = False
        self.ticket = -1  # publishing order, given when sealed

    def reset(self) -> None:
        self.claimed = self.filled = 0
        self.opened_mono = 0.0
        self.sealed = False
        self.ticket = -1

    @property
    def ready(self) -> bool:
        """Sealed, and every claimed slot written: the worker may run it."""
        return self.sealed and self.filled == self.claimed


class OutputSet:
    """One output set of one device: the outputs of one run and the frames they belong to, until
    post-processing has published them and hands the set back (`release`) to the opening of the
    device that made it (`give_back`, see `incarnation.Incarnation`)."""

    def __init__(self, device: str, index: int, capacity: int, model: ModelInfo,
                 give_back: Callable[[OutputSet], None]):
        self.device = device  # the worker's name, e.g. "ascend0/1"
        self.index = index  # output set number, for backend.run
        self.model = model  # what decodes the outputs, and the labels of their class ids
        self._give_back = give_back
        self.metas = new_metas(capacity)
        self.outputs: list[np.ndarray] = []
        self.count = 0  # slots of this run
        self.ticket = -1
        self.started_mono = 0.0  # the device call began
        self.inferred_mono = 0.0  # ... and returned

    def release(self) -> None:
        """Post-processing is done with it: the worker may run into it again."""
        self.outputs = []
        self._give_back(self)
