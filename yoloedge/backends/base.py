"""The contract between the shared pipeline and an accelerator runtime.

A backend only does device work: load the model, allocate every buffer once, copy in, execute,
copy out. Letterbox, decode and NMS live in `preprocess` / `postprocess` and are shared.

Lifecycle (all device calls on the one thread that owns the device):

    backend = SomeBackend(model_path, config)        # cheap, touches no device
    spec = backend.open(max_batch, input_hw,         # load + allocate, once
                        input_sets=2, output_sets=3)
    bufs = backend.input_buffers                     # input sets: [max_batch, ...] host buffers
    outs = backend.run(n, input_set=i, output_set=o) # run the first n slots of set i
    t = backend.submit(n, i, o); outs = backend.complete(t)  # the same, split (`pipelined`)
    backend.close()                                  # free in reverse order; idempotent

Why several sets: the pipeline letterboxes the next batch into one input set (on other threads)
while the device executes another, and post-processing reads one output set while the device
writes the next. The backend owns these buffers because only it knows what memory the device
can copy from fastest (pinned host memory on Ascend, IOBinding-bound arrays on ONNX Runtime).
Neither `run` nor anything else after `open` may allocate per batch.

Several models on one device: the device worker of one incarnation (one opening of one device)
creates one backend per model of its group, hands them all one `DeviceScope` (`use_scope`) and
opens them on its thread. What the backends of one scope share (an Ascend context and stream, a
CUDA stream) is created by the first backend that needs it and released after the last one closed;
each backend keeps its own model and buffers. A backend never given a scope opens a private one,
which is what a single model always did. Device recovery opens a new incarnation with a new scope,
so a hung old one keeps its own context while the new one gets its own.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..errors import BackendError, ModelError
from ..files import regular_file_problem
from ..model.spec import ModelSpec
from .undo import raise_collected

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class BatchTiming:
    """Where the device time of the last batch went (seconds): copying the frames in, executing,
    copying the outputs out. A backend that cannot tell the copies apart says None for them and
    puts everything in `execute_s`. `source` says how it was measured: "events" (the device's own
    timestamps) or "host" (a clock around synchronous calls)."""

    copy_in_s: float | None
    execute_s: float
    copy_out_s: float | None
    source: str = "host"


@dataclass(frozen=True)
class Ticket:
    """A batch handed to `Backend.submit`, to be waited for by `Backend.complete`: its size, its
    input and output sets, and the host clock readings (before the copy-in, the execution and the
    copy-out) that a backend without device events splits its time by."""

    n: int
    input_set: int
    output_set: int
    host: tuple[float, float, float] = (0.0, 0.0, 0.0)
    outputs: tuple[np.ndarray, ...] | None = None  # the default `submit`: what `run` returned


@dataclass
class _Shared:
    value: Any
    release: Callable[[Any], None]
    users: int


class DeviceScope:
    """What the backends one worker thread opens on one device share: resources by key, counted.

    `shared(key, create, release)` hands out the resource under `key`, creating it on its first
    use; each call counts one user, and `release(key)` counts one less, releasing the resource (with
    the `release` given when it was created) after the last. A backend pushes that `release(key)` on
    its undo stack right after `shared`, so its own resources (model, buffers) go first and the
    shared ones only after the last backend of the scope closed. `close()` releases whatever is
    left, newest first (nothing, when every backend closed), and refuses further use.

    Thread confinement: a scope belongs to one incarnation, and its backends are opened, run and
    closed on that incarnation's worker thread (a close from another thread comes after that
    worker is gone: sequential, never concurrent). So it takes no lock; its resources are device
    handles bound to that thread's use anyway. A new incarnation must get a new scope.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name  # for logs: e.g. "ascend device 0, incarnation 2"
        self._entries: dict[str, _Shared] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"DeviceScope({self.name!r}, {dict((k, e.users) for k, e in self._entries.items())})"

    @property
    def closed(self) -> bool:
        return self._closed

    def users(self, key: str) -> int:
        """How many backends hold `key` now (0: not created, or already released)."""
        entry = self._entries.get(key)
        return entry.users if entry is not None else 0

    def keys(self) -> tuple[str, ...]:
        """The resources held now, oldest first."""
        return tuple(self._entries)

    def shared(self, key: str, create: Callable[[], T], release: Callable[[T], None]) -> T:
        """The resource under `key`, created now by `create()` when nobody holds it; counts one user.
        A `create` that raises leaves nothing behind (it releases what it took itself)."""
        if self._closed:
            raise BackendError(f"device scope {self.name!r} is closed; a new incarnation needs a new scope")
        entry = self._entries.get(key)
        if entry is None:
            value = create()
            self._entries[key] = _Shared(value, release, 1)
            return value
        entry.users += 1
        return entry.value

    def release(self, key: str) -> None:
        """One user of `key` less; the last releases the resource (its error is raised)."""
        entry = self._entries.get(key)
        if entry is None:
            raise BackendError(f"device scope {self.name!r}: {key!r} released more often than taken")
        entry.users -= 1
        if entry.users == 0:
            del self._entries[key]
            entry.release(entry.value)

    def close(self) -> None:
        """Release every resource still held (newest first, whatever its count) and refuse further
        use. The worker calls it after closing every backend of its incarnation; the first failure
        is raised, the others logged."""
        self._closed = True
        errors: list[Exception] = []
        for key in reversed(list(self._entries)):
            entry = self._entries.pop(key)
            log.warning("device scope %r: %s still held by %d backend(s) at close; releasing it",
                        self.name, key, entry.users)
            try:
                entry.release(entry.value)
            except Exception as exc:  # noqa: BLE001 - collected and raised below
                errors.append(exc)
        raise_collected(errors, f"device scope {self.name!r}")


class Backend(ABC):
    #: Catalogue key (`config.catalogue`), e.g. "onnxruntime", "ascend".
    name: str = ""

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
    def device_inputs(self) -> Sequence[tuple[int, int]] | None:
        """Per input set, (device address, bytes per frame slot) when the card fills the input
        itself (Ascend with a YUV420SP AIPP model: the DVPP letterboxes decoded pictures straight
        into it, `decoder: dvpp`), so `run` copies nothing in; the host `input_buffers` are then
        empty placeholders of the right length. None (the default): pre-processing fills the host
        buffers."""
        return None

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
    def warm_up_batches(self) -> tuple[int, ...]:
        """The batch sizes to run once before the device reports ready: (1,) by default; a backend
        whose first run of each native batch size is slow (an .om's gears) names one per size."""
        return (1,)

    @property
    def description(self) -> str:
        """One line for logs and status: runtime, device, provider."""
        return self.name

    @abstractmethod
    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        """Execute on the first `n` slots of input set `input_set`; one array [n, ...] per model
        output, views of output set `output_set`, valid until that output set is run again."""

    @property
    def pipelined(self) -> bool:
        """Whether `submit` returns before the batch is done, so that a worker may submit the next
        batch (another input and output set) before it `complete`s this one. False by default:
        `submit` runs the batch and `complete` only hands its outputs over."""
        return False

    def submit(self, n: int, input_set: int = 0, output_set: int = 0) -> Ticket:
        """Start a batch (see `run`); its outputs come from `complete(ticket)`. A pipelining
        backend only queues it: the input set must not be refilled, nor the output set read, until
        `complete` returned. By default it runs the batch now."""
        return Ticket(n, input_set, output_set, outputs=tuple(self.run(n, input_set, output_set)))

    def complete(self, ticket: Ticket) -> list[np.ndarray]:
        """Wait for the batch `ticket` names and return its outputs (as `run` does); its errors
        are raised here. `last_timing` then describes this batch."""
        if ticket.outputs is None:
            raise BackendError(f"{self.model_path}: a ticket this backend did not hand out")
        return list(ticket.outputs)

    @abstractmethod
    def close(self) -> None:
        """Release device resources in reverse order of acquisition; safe to call twice."""

    def use_scope(self, scope: DeviceScope) -> None:
        """Share `scope` with the other backends of this incarnation; called by the worker before
        `open`. The default shares nothing (one ONNX Runtime session per model needs nothing of
        the others), so it only accepts the scope."""
        log.debug("%s: nothing to share in %r", self.model_path, scope)

    def last_timing(self) -> BatchTiming | None:
        """The split of the last successful `run` or `complete` (see `BatchTiming`), read by the
        worker thread right after it returned; None (the default) where the backend does not measure it."""
        return None

    def runtime_info(self) -> dict | None:
        """What status shows of the runtime under the model (versions, chip) and the problems
        found with it at open ({"problems": [...]}, more keys per backend); None by default.
        Called from other threads: makes no device call."""
        return None

    def memory(self) -> dict | None:
        """What this model's buffers take, from what `open` allocated: {"device_bytes": int,
        "host_bytes": int} (0 where a side is not used or not known); None before `open` or for a
        backend that does not say. Called from other threads: makes no device call."""
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
