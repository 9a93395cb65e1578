"""A model as one device worker serves it, and what one opening of the device holds of it.

An accelerator group loads each of its models on every one of its devices (see `groups`): per
model one batcher (the cameras' queues and the devices' input sets for it) and one post stage,
shared by the group's devices; per device and model one backend. `ServedModel` is what a worker
is given for a model; `LoadedModel` is that model opened by one incarnation: its detector, its
output sets and the batches it ran.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..backends.base import Backend
from ..config.model import ModelConfig
from .batcher import Batcher
from .detector import Detector
from .modelinfo import ModelInfo
from .post import PostStage
from .slots import OutputSet


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
    output_sets: int = 0
    free_outputs: queue.SimpleQueue[OutputSet] = field(default_factory=queue.SimpleQueue)
    batches: int = 0  # run on this opening
    consecutive_errors: int = 0  # its inferences that failed in a row (the device gives up on any model's)

    @property
    def name(self) -> str:
        return self.served.name

    def release_output_set(self, output_set: OutputSet) -> None:
        with self.outputs_back:
            self.free_outputs.put(output_set)
            self.outputs_back.notify_all()

    def all_back(self) -> bool:
        return self.free_outputs.qsize() >= self.output_sets
