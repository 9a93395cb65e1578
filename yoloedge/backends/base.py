"""The contract between the shared pipeline and an accelerator runtime.

A backend only does device work: load the model, allocate every buffer once, copy in, execute,
copy out. Letterbox, decode and NMS live in `preprocess` / `postprocess` and are shared.

Lifecycle (all device calls on the one thread that owns the device):

    backend = SomeBackend(model_path, config)        # cheap, touches no device
    spec = backend.open(max_batch, input_hw,         # load + allocate, once
                        input_sets=2, output_sets=3)
    bufs = backend.input_buffers                     # input sets: [max_batch, ...] host buffers
    outs = backend.run(n, input_set=i, output_set=o) # run the first n slots of set i
    backend.close()                                  # free in reverse order; idempotent

Why several sets: the pipeline letterboxes the next batch into one input set (on other threads)
while the device executes another, and post-processing reads one output set while the device
writes the next. The backend owns these buffers because only it knows what memory the device
can copy from fastest (pinned host memory on Ascend, IOBinding-bound arrays on ONNX Runtime).
Neither `run` nor anything else after `open` may allocate per batch.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from ..errors import BackendError, ModelError
from ..files import regular_file_problem
from ..model.spec import ModelSpec

log = logging.getLogger(__name__)


class DeviceScope:
    """What the backends of one opening of one device share (placeholder: nothing yet)."""


class Backend(ABC):
    #: Catalogue key (`config.catalogue`), e.g. "onnxruntime", "ascend".
    name: str = ""
    scope: DeviceScope | None = None

    def __init__(self, model_path: str, config: Any = None) -> None:
        """Cheap and device-free: the worker constructs the backend anywhere, then calls `open` on
        the thread that will own the device. `config` is the catalogue entry's per-device settings
        object (a custom backend gets its `options:` mapping with `device_id` added)."""
        self.model_path = model_path
        self.config = config

    @abstractmethod
    def open(self, max_batch: int, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        """Load the model and allocate `input_sets` input and `output_sets` output buffers, each
        for batches of up to `max_batch` frames. `input_hw` sizes a model whose input axes are
        dynamic; a backend whose model size is fixed ignores it (with a warning)."""

    @property
    @abstractmethod
    def input_buffers(self) -> Sequence[np.ndarray]:
        """One host buffer [max_batch, ...] per input set, filled in place by pre-processing."""

    @property
    def input_buffer(self) -> np.ndarray:
        """Input set 0: what single-threaded callers (the CLI, `Detector.detect`) fill."""
        return self.input_buffers[0]

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
    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        """Execute on the first `n` slots of input set `input_set`; one array [n, ...] per model
        output, views of output set `output_set`, valid until that output set is run again."""

    @abstractmethod
    def close(self) -> None:
        """Release device resources in reverse order of acquisition; safe to call twice."""

    def use_scope(self, scope: DeviceScope) -> None:
        """What the backends one worker thread opens on one device share (see `DeviceScope`);
        called before `open`. Not called: the backend shares nothing."""
        self.scope = scope

    def memory(self) -> dict | None:
        """What this model's buffers take (`device_bytes`, `host_bytes`); None when unknown.
        Called from other threads: no device calls."""
        return None

    def telemetry(self) -> dict | None:
        """Device health for status (temperature, memory, ...); None when the backend has none.
        Called from other threads: must not make device calls that need the owning thread."""
        return None


def host_buffer(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zeroed host buffer with every page touched now, at start: `np.zeros` maps pages lazily,
    so the first batches would page-fault on the hot path and RSS would hide the memory until then."""
    buffer = np.empty(shape, dtype)
    buffer.fill(0)
    return buffer


def check_open_request(max_batch: int, input_sets: int, output_sets: int) -> None:
    """What every backend's `open` refuses before touching a device."""
    if max_batch < 1:
        raise BackendError(f"max_batch must be >= 1, got {max_batch}")
    if input_sets < 1 or output_sets < 1:
        raise BackendError(f"need at least one input and one output set, got {input_sets} and {output_sets}")


def warn_fixed_imgsz(model_path: str, input_hw: tuple[int, int] | None, imgsz: tuple[int, int] | None,
                     fixed: str) -> None:
    """`model.imgsz` names a size the compiled model (an .om, an engine) cannot take: say it is
    ignored. `fixed` says where the size was fixed ("at conversion", "when it was built")."""
    if input_hw and imgsz is not None and tuple(input_hw) != imgsz:
        log.warning("%s: model.imgsz %s ignored: the model takes %s (fixed %s)",
                    model_path, list(input_hw), list(imgsz), fixed)


def require_model_file(path: str) -> None:
    """ModelError unless `path` is a regular file: a FIFO given as the model would block the open
    forever, and "not found" would send the operator looking in the wrong place."""
    problem = regular_file_problem(path)
    if problem is None:
        return
    if problem.reason == "not found":
        raise ModelError(f"model file not found: {path}")
    raise ModelError(f"model file {problem}")
