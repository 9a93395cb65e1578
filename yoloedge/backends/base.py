"""The contract between the shared pipeline and an accelerator runtime.

A backend only does device work: load the model, allocate every buffer once, copy in, execute,
copy out. Letterbox, decode and NMS live in `preprocess` / `postprocess` and are shared.

Lifecycle (all calls on the one thread that owns the device):

    backend = SomeBackend(model_path, config)   # cheap, touches no device
    spec = backend.open(max_batch)              # load + allocate; returns the model's tensors
    buf = backend.input_buffer                  # [max_batch, ...] host buffer to letterbox into
    outs = backend.run(n)                       # run the first n slots; outputs [n, ...] each
    backend.close()                             # free in reverse order; idempotent
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..model.spec import ModelSpec


class Backend(ABC):
    #: Registry key, e.g. "onnxruntime", "ascend".
    name: str = ""

    @abstractmethod
    def open(self, max_batch: int) -> ModelSpec:
        """Load the model and allocate all buffers for batches of up to `max_batch` frames."""

    @property
    @abstractmethod
    def input_buffer(self) -> np.ndarray:
        """Host buffer of shape [max_batch, ...] that pre-processing fills in place."""

    @property
    @abstractmethod
    def max_batch(self) -> int:
        """Largest batch one `run` call accepts."""

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the model runs natively (dynamic-batch gears); others are padded up."""
        return (self.max_batch,)

    @property
    def description(self) -> str:
        """One line for logs and status: runtime, device, provider."""
        return self.name

    @abstractmethod
    def run(self, n: int) -> list[np.ndarray]:
        """Execute on the first `n` slots of `input_buffer`; one array [n, ...] per model output.

        The arrays may be views of buffers reused by the next call: consume or copy them first.
        """

    @abstractmethod
    def close(self) -> None:
        """Release device resources in reverse order of acquisition; safe to call twice."""
