"""The skeleton every backend with pinned host buffers shares; each one fills in its device calls.

TensorRT and Ascend (and the next one, RKNN) do the same thing around different runtime calls:
one model on one device, every buffer allocated once in `open`, the letterbox writing straight
into pinned host memory, and `run` copying the frames of one batch in, executing, and copying the
outputs out into one of several output sets. What they share is here, once:

* `open`: idempotent under the lock, the request checked before any device is touched, and a
  failed open releasing what it took (`_abandon_open`) before its own error is raised;
* the undo stack (`undo`): every acquisition pushes its own release, so `close` and a failed
  `open` release precisely what was acquired, newest first;
* the tensors (`DeviceTensor`): one device buffer each, and one pinned host buffer per input set
  (the image input) or per output set (every output), with typed numpy views of those;
* `run` (= `complete(submit(...))`): its argument checks, then the device's steps in a fixed order
  (the hooks below; `submit` up to `_queued`, `complete` from `_synchronize`), and the
  split of its time (`last_timing`: host clock readings between the steps, which the backend turns
  into copy-in / execute / copy-out, or its device events);
* `close`: bind the device on the closing thread (which may not be the one that opened), unwind,
  reset, raise the first failure and log the rest.

A backend implements these hooks, and nothing else of the above:

    _open(max_batch, input_sets, output_sets) -> ModelSpec   load, describe, allocate, bind
    _malloc(nbytes) -> int            device memory (pushing its release)
    _pinned(nbytes) -> (host, array)  one pinned host buffer (pushing its release) and its bytes
    _activate(detail)                 bind the device/context to this thread (run, close)
    _set_batch_for(n)                 what the runtime must know of the batch size (optional)
    _copy_input(inp, n, input_set)    the first n frames of an input set to the device
    _execute()                        run the model
    _copy_output(out, n, output_set)  the first n items of an output to its output set
    _queued()                         mark the end of the queued batch (optional)
    _synchronize()                    wait for the queued work of `_output_set` (optional)
    _timing(host) -> BatchTiming      the split of the run (optional: all of it as execution)
    _input_device_buffer(nbytes)      an input set's device buffer, with device_input_per_set (optional)
    _device_output_per_set() -> bool  one device buffer per output set (optional; pipelined backends)
    _output_batch() -> int            the outputs' batch axis in the spec (DYNAMIC or fixed)
    _imgsz() -> (h, w)                the model's fixed input size
    _settle()                         process-wide bookkeeping after open/close (optional)

Several models on one device (`base.DeviceScope`): `use_scope` before `open` hands the backend
the scope its incarnation's backends share; a backend never given one opens a private scope of its
own (today's behaviour: nothing shared). A backend takes what it shares with `_shared(key, create,
release)`, which also pushes the matching `scope.release(key)` on its undo stack: its own
resources are released first, and a shared resource after the last backend holding it closed.

Memory for status (`memory()`): computed once at the end of `open` from the tensors' device
buffers and pinned host sets (what was allocated), kept as one dict that other threads read
without the lock and without a device call.

Thread-safety: one lock, `_lock` (re-entrant), held by `open`, `run` and `close`; the hooks run
under it and take no other lock of ours. The scope is thread-confined (see `DeviceScope`).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import numpy as np

from ..errors import BackendError
from ..model.spec import ModelMetadata, ModelSpec, TensorSpec
from .base import Backend, BatchTiming, DeviceScope, Ticket, check_open_request, warn_fixed_imgsz
from .undo import UndoStack, raise_collected

log = logging.getLogger(__name__)

#: what a backend keeps for one pinned host buffer: its pointer, or an object that knows it
HostT = TypeVar("HostT")
T = TypeVar("T")


@dataclass
class DeviceTensor(Generic[HostT]):
    """One model input or output: its device buffer and its pinned host buffers (typed views)."""

    name: str
    dtype: np.dtype
    item_shape: tuple[int, ...]  # one batch item
    item_bytes: int
    device_bytes: int  # the device buffer: the largest batch the model runs
    index: int = 0  # its position among the model's inputs or outputs, where the runtime needs it
    device_ptr: int = 0
    #: one device buffer per input set where the backend asks for that (`device_input_per_set`);
    #: `device_ptr` is then the first of them
    device_ptrs: list[int] = field(default_factory=list)
    hosts: list[HostT] = field(default_factory=list)  # one pinned buffer per input/output set
    arrays: list[np.ndarray] = field(default_factory=list)  # [capacity, *item_shape] views of them


class PinnedDeviceBackend(Backend, Generic[HostT]):
    #: where the model's input size was fixed, for the warning when `model.imgsz` differs
    fixed_when = "at conversion"
    #: one device buffer for the image input per input set (True), or one shared by every set:
    #: a backend whose copies are queued on a stream needs its own per set, so that the copy-in of
    #: one set never overwrites what another queued batch still reads
    device_input_per_set = False

    def __init__(self, model_path: str, config: Any):
        super().__init__(str(model_path), config)
        self._lock = threading.RLock()
        self._undo = UndoStack()
        self._given_scope: DeviceScope | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        """Forget everything `open` set (a backend extends this with its own handles)."""
        self._spec: ModelSpec | None = None
        self._input: DeviceTensor[HostT] | None = None
        self._outputs: list[DeviceTensor[HostT]] = []
        self._capacity = 0  # frames per run() call
        self._scope: DeviceScope | None = None  # the one in use from open to close
        self._memory: dict | None = None  # memory(): set at the end of open
        self._input_set = 0  # the input set of the run in progress (the hooks read it)
        self._output_set = 0  # ... and its output set
        self._last_timing: BatchTiming | None = None

    # -- sharing with the other models of the incarnation ----------------------------------------
    def use_scope(self, scope: DeviceScope) -> None:
        with self._lock:
            if self._spec is not None:
                raise BackendError(f"{self.model_path}: use_scope after open; the worker hands the scope "
                                   f"over before opening")
            self._given_scope = scope

    def _shared(self, key: str, create: Callable[[], T], release: Callable[[T], None]) -> T:
        """The resource `key` of this backend's scope (created by the first backend asking), its
        release pushed on the undo stack: after this backend's own resources, before the next."""
        scope = self._scope
        if scope is None:  # _open runs under open(), which set it
            raise BackendError("no device scope: _shared outside open")
        value = scope.shared(key, create, release)
        self._undo.push(f"release shared {key}", lambda: scope.release(key))
        return value

    def memory(self) -> dict | None:
        memory = self._memory  # one reference read: any thread, no lock, no device call
        return dict(memory) if memory is not None else None

    def _tensors(self) -> list[DeviceTensor[HostT]]:
        """Every tensor with a device buffer (a backend adds its extra inputs)."""
        return [t for t in (self._input, *self._outputs) if t is not None]

    def _count_memory(self) -> dict:
        """From what `_allocate_sets` (and the backend) allocated: one device buffer per tensor,
        one pinned host buffer of `capacity` items per set."""
        tensors = self._tensors()
        return {"device_bytes": sum(t.device_bytes * max(1, len(t.device_ptrs)) for t in tensors if t.device_ptr),
                "host_bytes": sum(len(t.hosts) * self._capacity * t.item_bytes for t in tensors)}

    # -- open ----------------------------------------------------------------------------------
    def open(self, max_batch: int = 1, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        with self._lock:
            if self._spec is not None:
                return self._spec
            check_open_request(max_batch, input_sets, output_sets)
            self._scope = self._given_scope or DeviceScope(f"{self.name} {self.model_path} (private)")
            try:
                spec = self._open(max_batch, input_sets, output_sets)
            except BaseException:
                self._abandon_open()
                raise
            self._memory = self._count_memory()
            self._settle()
            warn_fixed_imgsz(self.model_path, input_hw, spec.metadata.imgsz, self.fixed_when)
            return spec

    def _abandon_open(self) -> None:
        """Release what a failed `open` took; the open's own error is the one raised."""
        errors = self._undo.unwind()
        self._reset_state()
        try:
            self._settle()
        except Exception as exc:  # noqa: BLE001 - logged below; the open's error takes precedence
            errors.append(exc)
        for err in errors:
            log.error("while releasing after a failed open of %s: %s", self.model_path, err)

    @abstractmethod
    def _open(self, max_batch: int, input_sets: int, output_sets: int) -> ModelSpec:
        """Everything `open` does on the device; each acquisition pushes its undo step."""

    def _settle(self) -> None:
        """After an open, a failed open, or a close of a backend never opened: bookkeeping shared
        by the process's backends (Ascend's acl.init/finalize). Nothing by default."""

    # -- buffers -------------------------------------------------------------------------------
    def _allocate_sets(self, input_sets: int, output_sets: int) -> None:
        """One device buffer per tensor; pinned host buffers for `capacity` frames, one per input
        set (the image input) and per output set (every output), with their typed views."""
        inp = self._image
        for tensor, sets in ((inp, input_sets), *((o, output_sets) for o in self._outputs)):
            if tensor is inp and self.device_input_per_set:
                tensor.device_ptrs = [self._input_device_buffer(tensor.device_bytes) for _ in range(sets)]
                tensor.device_ptr = tensor.device_ptrs[0]
            elif tensor is not inp and self._device_output_per_set():
                tensor.device_ptrs = [self._malloc(tensor.device_bytes) for _ in range(sets)]
                tensor.device_ptr = tensor.device_ptrs[0]
            else:
                tensor.device_ptr = self._malloc(tensor.device_bytes)
            host_bytes = self._capacity * tensor.item_bytes
            for _ in range(sets):
                host, raw = self._pinned(host_bytes)
                tensor.hosts.append(host)
                tensor.arrays.append(raw[:host_bytes].view(tensor.dtype).reshape(self._capacity, *tensor.item_shape))

    def _device_output_per_set(self) -> bool:
        """One device buffer per output set for every output (True), or one shared by the sets: a
        backend that keeps two batches queued (`pipelined`) needs its own per set, so that one
        batch's execution never overwrites outputs another batch has yet to copy out."""
        return False

    @abstractmethod
    def _malloc(self, nbytes: int) -> int:
        """`nbytes` of device memory; pushes its release."""

    def _input_device_buffer(self, nbytes: int) -> int:
        """The device buffer of one input set (`device_input_per_set`); plain device memory by
        default (a backend whose card fills the input itself allocates it where that can write)."""
        return self._malloc(nbytes)

    @abstractmethod
    def _pinned(self, nbytes: int) -> tuple[HostT, np.ndarray]:
        """`nbytes` of pinned host memory (pushing its release): what the tensor keeps of it, and
        a uint8 array of at least `nbytes` that the typed views are cut from."""

    def _model_spec(self) -> ModelSpec:
        inp = self._image
        batch = self._output_batch()
        return ModelSpec(
            self.model_path,
            (TensorSpec(inp.name, (self._capacity, *inp.item_shape), inp.dtype),),
            tuple(TensorSpec(o.name, (batch, *o.item_shape), o.dtype) for o in self._outputs),
            ModelMetadata(imgsz=self._imgsz()))

    @abstractmethod
    def _output_batch(self) -> int:
        """The batch axis of the outputs in the spec: DYNAMIC, or the model's fixed batch."""

    @abstractmethod
    def _imgsz(self) -> tuple[int, int]:
        """(height, width) of the image the model takes."""

    # -- running -------------------------------------------------------------------------------
    @property
    def _image(self) -> DeviceTensor[HostT]:
        """The image input: set by `_open` (describing the model), cleared by `close`."""
        if self._input is None:
            raise BackendError("backend is not open")
        return self._input

    @property
    def input_buffers(self) -> list[np.ndarray]:
        if self._spec is None:
            raise BackendError("backend is not open")
        return self._image.arrays

    @property
    def max_batch(self) -> int:
        return self._capacity if self._spec is not None else 0

    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        with self._lock:
            return self.complete(self.submit(n, input_set, output_set))

    def submit(self, n: int, input_set: int = 0, output_set: int = 0) -> Ticket:
        """The argument checks, then every step up to the wait: synchronous steps are done when it
        returns, queued ones (a backend whose `pipelined` is True) are on the stream."""
        with self._lock:
            inp = self._input
            if self._spec is None or inp is None:
                raise BackendError("backend is not open")
            if not 1 <= n <= self._capacity:
                raise BackendError(f"batch of {n} outside 1..{self._capacity}")
            if not 0 <= input_set < len(inp.hosts):
                raise BackendError(f"input set {input_set} outside 0..{len(inp.hosts) - 1}")
            if not 0 <= output_set < len(self._outputs[0].hosts):
                raise BackendError(f"output set {output_set} outside 0..{len(self._outputs[0].hosts) - 1}")
            self._activate()
            self._input_set, self._output_set = input_set, output_set
            self._last_timing = None
            self._set_batch_for(n)
            t0 = time.perf_counter()
            self._copy_input(inp, n, input_set)
            t1 = time.perf_counter()
            self._execute()
            t2 = time.perf_counter()
            for out in self._outputs:
                self._copy_output(out, n, output_set)
            self._queued()
            return Ticket(n, input_set, output_set, (t0, t1, t2))

    def complete(self, ticket: Ticket) -> list[np.ndarray]:
        """Wait for the batch of `ticket` (its errors are raised here) and return its outputs."""
        with self._lock:
            if self._spec is None:
                raise BackendError("backend is not open")
            self._activate()
            self._input_set, self._output_set = ticket.input_set, ticket.output_set
            self._last_timing = None
            self._synchronize()
            self._last_timing = self._timing((*ticket.host, time.perf_counter()))
            return [out.arrays[ticket.output_set][:ticket.n] for out in self._outputs]

    def last_timing(self) -> BatchTiming | None:
        return self._last_timing

    def _timing(self, host: tuple[float, float, float, float]) -> BatchTiming | None:
        """The split of the run that just ended, from the host clock read before the copy-in, the
        execution, the copy-out and after the synchronisation. By default all of it counts as
        execution: the steps may be queued on a stream, so the host cannot tell them apart. A
        backend with synchronous steps, or with device events, says more."""
        return BatchTiming(None, host[3] - host[0], None)

    @abstractmethod
    def _activate(self, detail: str = "") -> None:
        """Bind the device (or context) to the calling thread; BackendError when refused."""

    def _set_batch_for(self, n: int) -> None:
        """Tell the runtime the batch size a run of `n` frames executes; nothing by default."""

    @abstractmethod
    def _copy_input(self, inp: DeviceTensor[HostT], n: int, input_set: int) -> None:
        """The first `n` frames of input set `input_set` to the device buffer."""

    @abstractmethod
    def _execute(self) -> None:
        """Run the model on the device buffers."""

    @abstractmethod
    def _copy_output(self, out: DeviceTensor[HostT], n: int, output_set: int) -> None:
        """The first `n` items of `out` from the device into output set `output_set`."""

    def _quiesce(self) -> None:
        """Before releasing at close: wait for anything still queued on the device; nothing by default."""

    def _queued(self) -> None:
        """After the last step is queued (`submit`): mark the end of the batch; nothing by default."""

    def _synchronize(self) -> None:
        """Wait for the work queued by the steps above (for the output set `_output_set`, `complete`);
        nothing by default (they were synchronous)."""

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if not self._undo:
                self._settle()  # closed without (successfully) opening
                return
            errors: list[Exception] = []
            try:  # teardown may run on another thread than open: release on the device that allocated
                self._activate("before teardown")
            except BackendError as failed:
                errors.append(failed)
            try:  # a batch submitted and never completed may still read and write the buffers
                self._quiesce()
            except Exception as failed:  # noqa: BLE001 - collected and raised below, after the release
                errors.append(failed)
            errors += self._undo.unwind()
            self._reset_state()
            raise_collected(errors, self.model_path)
