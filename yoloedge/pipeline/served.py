"""A model as one device worker serves it, and what one opening of the device holds of it.

An accelerator group loads each of its models on every one of its devices (see `groups`): per
model one batcher (the cameras' queues and the devices' input sets for it) and one post stage,
shared by the group's devices; per device and model one backend. `ServedModel` is what a worker
is given for a model; `LoadedModel` is that model opened by one incarnation: its detector, its
output sets and the batches it ran.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..backends.base import Backend
from ..config.model import ModelConfig
from ..config.schema import AcceleratorConfig
from .batcher import Batcher
from .detector import Detector
from .modelinfo import ModelInfo
from .post import PostStage
from .slots import OutputSet

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ServedModel:
    model: ModelConfig
    batcher: Batcher
    post: PostStage
    factory: Callable[[], Backend]  # this device's backend for the model (constructed, not opened)
    #: the model's description for post-processing, made once per group (see `groups`)
    describe: Callable[[Detector], ModelInfo] = ModelInfo.of

    @property
    def name(self) -> str:
        return self.model.name


@dataclass(eq=False)
class LoadedModel:
    """One model opened by one incarnation. Its output sets come back here (`release_output_set`),
    waking whoever waits on the incarnation's `outputs_back` condition."""

    index: int  # its position among the worker's served models
    served: ServedModel
    detector: Detector
    outputs_back: threading.Condition
    allocated_sets: int = 1  # output sets the backend allocated
    output_sets: int = 0  # ... of them in circulation (after the warm-up): what must come back
    free_outputs: queue.SimpleQueue[OutputSet] = field(default_factory=queue.SimpleQueue)
    batches: int = 0  # run on this opening
    consecutive_errors: int = 0  # its inferences that failed in a row (the device gives up on any model's)

    @property
    def name(self) -> str:
        return self.served.name

    @classmethod
    def open(cls, index: int, served: ServedModel, backend: Backend, accelerator: AcceleratorConfig,
             outputs_back: threading.Condition) -> LoadedModel:
        """Open `served` on `backend` (on the device's thread), with the accelerator's input sets;
        a backend that fails to open is closed (it releases what it took)."""
        sets = accelerator.input_buffers + 1  # one more being post-processed while the device writes
        try:
            detector = Detector(served.model, backend, max_batch=accelerator.batch,
                                input_sets=accelerator.input_buffers, output_sets=sets)
        except BaseException:
            backend.close()
            raise
        return cls(index, served, detector, outputs_back, allocated_sets=sets)

    def warm_up(self, device: str) -> None:
        """One blank batch; then its output sets go into circulation."""
        detector = self.detector
        detector.warm_up()
        model = self.served.describe(detector)
        for number in range(self.allocated_sets):
            self.free_outputs.put(OutputSet(device, number, detector.max_batch, model, self.release_output_set))
        self.output_sets = self.allocated_sets
        log.info("%s ready: model %s, %s, batch %d, %d input and %d output buffers", device, self.name,
                 detector.backend.description, detector.max_batch, self.allocated_sets - 1, self.allocated_sets,
                 extra={"device": device})

    def release_output_set(self, output_set: OutputSet) -> None:
        with self.outputs_back:
            self.free_outputs.put(output_set)
            self.outputs_back.notify_all()

    def all_back(self) -> bool:
        return self.free_outputs.qsize() >= self.output_sets
