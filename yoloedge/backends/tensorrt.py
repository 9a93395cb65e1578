"""NVIDIA GPUs through TensorRT: one engine (built by trtexec) on one GPU, every buffer allocated once.

One code path for TensorRT 8.6 and 10.x: the name-based tensor API (`num_io_tensors`,
`get_tensor_name/mode/shape/dtype`, `get_tensor_profile_shape`), `set_input_shape`,
`set_tensor_address` and `execute_async_v3`; none of the binding-index calls 10.x removed.
Buffers come from cuda-python's `cuda.bindings.runtime` (see `cuda_runtime`).

Lifecycle, all on the worker thread that owns the GPU:

    open:  cudaSetDevice -> cudaStreamCreate (the worker's own stream: execute_async_v3 on the
           default stream costs extra device synchronisations) -> Runtime -> deserialize_cuda_engine
           -> create_execution_context -> one device buffer per I/O tensor, for the largest batch
           run -> pinned host buffers (cudaMallocHost): one per input set for the input, one per
           output set for every output -> set_tensor_address for every tensor, once
    run:   cudaSetDevice -> set_input_shape (dynamic batch, when the batch changes) ->
           cudaMemcpyAsync in (only the frames of this batch) -> execute_async_v3 ->
           cudaMemcpyAsync out (into the chosen output set) -> cudaStreamSynchronize
    close: exactly the reverse: pinned and device memory, context, engine, runtime, stream

Several models on one GPU: the backends of one device scope (`base.DeviceScope`: one worker
incarnation) share the device's primary context (what cudaSetDevice binds) and one stream, created
by the first and destroyed after the last closed; each keeps its own runtime (its logger names its
model), engine, execution context and buffers. One stream, not one per model: the worker runs one
model at a time and every run ends with cudaStreamSynchronize, so a stream per model would overlap
nothing, while one keeps every copy and execution of that GPU in one order. A backend given no
scope opens a private one: its own stream, as with one model.

Every acquisition pushes its own undo step, so `close` (and a failed `open`) release precisely
what was acquired, in reverse order, and a failing step does not stop the ones after it. The
open/run/close skeleton around these calls is `device.PinnedDeviceBackend`'s, shared with the
other backends that own pinned host buffers; this module holds only the device calls.

The letterbox writes straight into the pinned memory: each of `input_buffers` is a numpy view of
one pinned input set, typed as the engine's input (float16 for an engine built with an FP16 input),
and the arrays `run` returns are views of one pinned output set. The device side needs one buffer
per tensor: copies happen inside `run`, so only the host side needs a set per batch in flight.

Batches: an engine with a dynamic batch axis runs each batch at its real size (`set_input_shape`),
raised to the profile's minimum when smaller; a static engine always runs its fixed batch, the
slots beyond n being padding. An engine carries no Ultralytics metadata: labels and format come
from the `model:` section of the config.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Iterable

import numpy as np
import tensorrt as trt

from ..config.tensorrt import TensorRTConfig
from ..errors import BackendError, ModelError
from ..model.spec import DYNAMIC, ModelSpec, image_hwc
from .base import require_model_file
from .cuda_runtime import DEVICE_TO_HOST, HOST_TO_DEVICE, checked, cudart, host_array, native_handle
from .device import DeviceTensor, PinnedDeviceBackend
from .gpu_smi import GpuKind, gpu_telemetry

log = logging.getLogger(__name__)

#: numpy dtype name -> the short name `description` shows for the engine's input.
IO_NAMES = {"float32": "fp32", "float16": "fp16", "int8": "int8", "uint8": "uint8"}


class TensorRTError(BackendError):
    """A TensorRT call refused its arguments (returned False or None); `call` names it."""

    def __init__(self, call: str, detail: str):
        self.call = call
        super().__init__(f"{call} failed: {detail}")


class TrtLog(trt.ILogger):
    """TensorRT's messages into our log; the last errors are kept, because TensorRT reports the
    reason for a False or a None only here."""

    def __init__(self, source: str):
        trt.ILogger.__init__(self)
        self.source = source
        self.errors: collections.deque[str] = collections.deque(maxlen=4)
        self._levels = {trt.ILogger.INTERNAL_ERROR: logging.ERROR, trt.ILogger.ERROR: logging.ERROR,
                        trt.ILogger.WARNING: logging.WARNING, trt.ILogger.INFO: logging.DEBUG,
                        trt.ILogger.VERBOSE: logging.DEBUG}

    def log(self, severity: Any, msg: str) -> None:
        level = self._levels.get(severity, logging.DEBUG)
        if level >= logging.ERROR:
            self.errors.append(str(msg))
        log.log(level, "TensorRT (%s): %s", self.source, msg)

    def last_error(self) -> str:
        """What TensorRT said last (then forgotten, so a later failure never shows a stale reason)."""
        said = self.errors[-1] if self.errors else "TensorRT logged no reason"
        self.errors.clear()
        return said


def create_stream(device: int) -> Any:
    """The worker's own stream on `device` (execute_async_v3 on the default stream costs extra
    device synchronisations)."""
    checked(cudart.cudaSetDevice(device), "cudaSetDevice", f"GPU {device}")
    return checked(cudart.cudaStreamCreate(), "cudaStreamCreate", f"GPU {device}")


def destroy_stream(stream: Any) -> None:
    checked(cudart.cudaStreamDestroy(stream), "cudaStreamDestroy")


#: one engine I/O tensor; its pinned host buffers are kept as their pointers
Tensor = DeviceTensor[int]


def dims(shape: Iterable[Any]) -> tuple[int, ...]:
    """A TensorRT `Dims` as a tuple of ints (-1 where the engine leaves an axis open)."""
    return tuple(int(d) for d in shape)


def require_name_based_api() -> None:
    """TensorRT 8.4 (JetPack 5.0) has only the binding-index API, which 10.x removed: say so before
    any device is touched instead of failing on a missing attribute half-way through `open`."""
    if not hasattr(trt.IExecutionContext, "execute_async_v3"):
        raise BackendError(f"TensorRT {trt.__version__} is too old for the tensorrt backend, which needs "
                           f"8.5 or later (JetPack 5.1 or later on a Jetson); use backend onnxruntime "
                           f"with the CUDA provider on this machine, or upgrade TensorRT")


class TensorRTBackend(PinnedDeviceBackend[int]):
    """`device.PinnedDeviceBackend` filled in with TensorRT and CUDA runtime calls."""

    name = "tensorrt"
    fixed_when = "when it was built"

    def __init__(self, model_path: str, config: TensorRTConfig | None = None):
        self._trt_log = TrtLog(str(model_path))
        super().__init__(model_path, config or TensorRTConfig())
        self.config: TensorRTConfig

    def _reset_state(self) -> None:
        super()._reset_state()
        self._stream: Any = None
        self._stream_handle = 0
        self._runtime: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._profile: tuple[int, int, int] | None = None  # (min, opt, max) batch; None for a static engine
        self._static_batch = 0
        self._run_max = 0  # the largest batch the engine runs (device buffers hold this many)
        self._batch_set = 0  # the batch the context's input shape is set to

    # -- open ----------------------------------------------------------------------------------
    def _open(self, max_batch: int, input_sets: int, output_sets: int) -> ModelSpec:
        require_model_file(self.model_path)
        require_name_based_api()
        blob = self._read_engine_file()
        self._open_device()
        self._load_engine(blob)
        self._describe(max_batch)
        self._allocate(input_sets, output_sets)
        self._bind_addresses()
        spec = self._spec = self._model_spec()
        log.info("loaded %s on %s: input %s %s %s, outputs %s", self.model_path, self.description,
                 spec.input.name, list(spec.input.shape), spec.input.dtype,
                 ", ".join(f"{o.name} {list(o.shape)}" for o in spec.outputs))
        return spec

    def _read_engine_file(self) -> bytes:
        try:
            with open(self.model_path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ModelError(f"cannot read the engine {self.model_path}: {exc.strerror or exc}") from exc

    def _open_device(self) -> None:
        """The device's primary context (cudaSetDevice) and the scope's one stream, shared by every
        engine of this backend's scope: created by the first, destroyed after the last closed."""
        device = self.config.device_id
        checked(cudart.cudaSetDevice(device), "cudaSetDevice", f"GPU {device}")
        stream = self._shared(f"cuda stream GPU {device}", lambda: create_stream(device), destroy_stream)
        self._stream, self._stream_handle = stream, native_handle(stream)

    def _load_engine(self, blob: bytes) -> None:
        """Runtime, engine, context. The undo steps drop our references (TensorRT frees each object
        with its last reference; an engine keeps its runtime alive, a context its engine)."""
        self._runtime = trt.Runtime(self._trt_log)
        self._undo.push("release the TensorRT runtime", lambda: setattr(self, "_runtime", None))
        self._engine = self._runtime.deserialize_cuda_engine(blob)
        if self._engine is None:  # TensorRT says why only through the logger
            raise ModelError(f"{self.model_path}: TensorRT {trt.__version__} cannot deserialise this engine "
                             f"({self._trt_log.last_error()}); an engine runs only with the TensorRT version "
                             f"and on the GPU model it was built with: rebuild it on this machine "
                             f"(yoloedge convert trt)")
        self._undo.push("release the engine", lambda: setattr(self, "_engine", None))
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise TensorRTError("ICudaEngine.create_execution_context",
                                f"returned None ({self._trt_log.last_error()}; out of GPU memory?)")
        self._undo.push("release the execution context", lambda: setattr(self, "_context", None))

    # -- what the engine wants -----------------------------------------------------------------
    def _describe(self, max_batch: int) -> None:
        """Everything comes from the engine: the image input, its batch range, the outputs."""
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or not outputs:
            raise ModelError(f"{self.model_path}: expected one image input and at least one output, the "
                             f"engine has inputs {inputs} and outputs {outputs}")
        name = inputs[0]
        shape = dims(engine.get_tensor_shape(name))
        if len(shape) != 4 or min(shape[1:]) < 1:
            raise ModelError(f"{self.model_path}: expected a 4-D image input with a fixed size, got {name} "
                             f"{list(shape)}; build the engine with min/opt/max shapes that differ only "
                             f"in the batch")
        self._check_profile_index()
        if shape[0] == DYNAMIC:
            self._plan_profile(name, shape, max_batch)
        else:
            self._static_batch = shape[0]
            self._capacity, self._run_max = min(max_batch, shape[0]), shape[0]
        if self._capacity != max_batch:
            log.info("%s: batches of up to %d frames (asked for %d; the engine's %s)", self.model_path,
                     self._capacity, max_batch,
                     f"profile allows {self._profile[2]}" if self._profile else "batch is fixed")
        self._input = self._tensor(name, shape[1:])
        if self._profile is not None:
            self._set_batch(self._run_max)
        self._outputs = [self._output(n) for n in outputs]

    def _check_profile_index(self) -> None:
        """Static engines too: one built without profiles has just the implicit profile 0, so a
        `tensorrt.profile` past it is a mistake to report, not a setting to ignore."""
        index, count = self.config.profile, int(self._engine.num_optimization_profiles)
        if index >= count:
            raise ModelError(f"{self.model_path}: tensorrt.profile {index} asked for, the engine has "
                             f"{count} optimisation profile(s) (0..{count - 1})")

    def _plan_profile(self, name: str, shape: tuple[int, ...], max_batch: int) -> None:
        """A dynamic batch: the configured optimisation profile's min..max bounds every run. Another
        profile than 0 is switched to before any input shape is set (the shapes belong to it)."""
        engine, index = self._engine, self.config.profile
        bounds = [dims(d) for d in engine.get_tensor_profile_shape(name, index)]
        if len(bounds) != 3 or any(len(b) != 4 or b[1:] != shape[1:] for b in bounds):
            raise ModelError(f"{self.model_path}: profile {index} of input {name} is {bounds}; only the batch "
                             f"may vary (fixed {list(shape[1:])})")
        low, opt, high = (b[0] for b in bounds)
        self._profile = (low, opt, high)
        self._capacity = min(max_batch, high)
        self._run_max = max(self._capacity, low)
        if index:
            self._select_profile(index)

    def _select_profile(self, index: int) -> None:
        """The bindings raise RuntimeError for a refusal (they never return False); the reason is
        in TensorRT's log. The switch is queued on our stream, which `_allocate` synchronises."""
        try:
            selected = self._context.set_optimization_profile_async(index, self._stream_handle)
        except RuntimeError as exc:
            raise TensorRTError("IExecutionContext.set_optimization_profile_async",
                                f"profile {index}: {self._trt_log.last_error()} ({exc})") from exc
        if not selected:
            raise TensorRTError("IExecutionContext.set_optimization_profile_async",
                                f"profile {index}: {self._trt_log.last_error()}")

    def _dtype(self, name: str) -> np.dtype:
        trt_type = self._engine.get_tensor_dtype(name)
        try:
            return np.dtype(trt.nptype(trt_type))
        except TypeError:
            raise ModelError(f"{self.model_path}: tensor {name} has type {trt_type}, which numpy cannot hold; "
                             f"build the engine with FP32, FP16, INT8 or UINT8 I/O "
                             f"(trtexec --inputIOFormats/--outputIOFormats)") from None

    def _tensor(self, name: str, item_shape: tuple[int, ...]) -> Tensor:
        dtype = self._dtype(name)
        item_bytes = int(np.prod(item_shape)) * dtype.itemsize
        return Tensor(name, dtype, item_shape, item_bytes, self._run_max * item_bytes)

    def _output(self, name: str) -> Tensor:
        """Shapes as the context resolves them for the largest batch: outputs must carry the batch
        on their first axis and have no data-dependent sizes."""
        shape = dims(self._context.get_tensor_shape(name))
        if len(shape) < 2 or min(shape) < 1 or shape[0] != self._run_max:
            raise ModelError(f"{self.model_path}: output {name} has shape {list(shape)} for a batch of "
                             f"{self._run_max}; outputs must be [batch, ...] with sizes known before the run")
        return self._tensor(name, shape[1:])

    def _set_batch(self, batch: int) -> None:
        inp = self._image
        if not self._context.set_input_shape(inp.name, (batch, *inp.item_shape)):
            raise TensorRTError("IExecutionContext.set_input_shape",
                                f"{inp.name} batch {batch}: {self._trt_log.last_error()}")
        self._batch_set = batch

    # -- buffers -------------------------------------------------------------------------------
    def _allocate(self, input_sets: int, output_sets: int) -> None:
        """Device buffers for the largest batch run; pinned host buffers for `capacity` frames, one
        per input set (the input) and per output set (every output). All zeroed, so every page is
        touched now and padding slots never hold garbage."""
        self._allocate_sets(input_sets, output_sets)
        inp = self._image
        for start in range(0, self._run_max, self._capacity):  # zero the device input, capacity at a time
            count = min(self._capacity, self._run_max - start) * inp.item_bytes
            checked(cudart.cudaMemcpyAsync(inp.device_ptr + start * inp.item_bytes, inp.hosts[0], count,
                                           HOST_TO_DEVICE, self._stream), "cudaMemcpyAsync", "zeroing the input")
        checked(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def _malloc(self, nbytes: int) -> int:
        device = self.config.device_id
        ptr = checked(cudart.cudaMalloc(nbytes), "cudaMalloc", f"{nbytes} bytes on GPU {device}")
        self._undo.push("free device memory", lambda: checked(cudart.cudaFree(ptr), "cudaFree"))
        return int(ptr)

    def _pinned(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Zeroed, so every page is touched now and padding slots never hold garbage."""
        ptr = checked(cudart.cudaMallocHost(nbytes), "cudaMallocHost", f"{nbytes} bytes of pinned memory")
        self._undo.push("free pinned memory", lambda: checked(cudart.cudaFreeHost(ptr), "cudaFreeHost"))
        array = host_array(int(ptr), nbytes)
        array.fill(0)
        return int(ptr), array

    def _bind_addresses(self) -> None:
        """The device buffers never move, so every tensor's address is set once."""
        for tensor in (self._image, *self._outputs):
            if not self._context.set_tensor_address(tensor.name, tensor.device_ptr):
                raise TensorRTError("IExecutionContext.set_tensor_address",
                                    f"{tensor.name}: {self._trt_log.last_error()}")

    def _output_batch(self) -> int:
        return DYNAMIC if self._profile else self._static_batch

    def _imgsz(self) -> tuple[int, int]:
        h, w, _ = image_hwc((self._capacity, *self._image.item_shape))
        return h, w

    # -- running -------------------------------------------------------------------------------
    @property
    def batch_sizes(self) -> tuple[int, ...]:
        if self._spec is None:
            return ()
        if self._profile is None:
            return (self._static_batch,)
        return tuple(range(self._profile[0], self._run_max + 1))

    @property
    def description(self) -> str:
        io = IO_NAMES.get(self._input.dtype.name, self._input.dtype.name) if self._input else "?"
        batch = (f"batch {self._profile[0]}..{self._run_max}" if self._profile
                 else f"batch {self._static_batch}")
        return f"tensorrt {trt.__version__} GPU {self.config.device_id} {io} ({batch})"

    def _activate(self, detail: str = "") -> None:
        checked(cudart.cudaSetDevice(self.config.device_id), "cudaSetDevice", detail)

    def _set_batch_for(self, n: int) -> None:
        """A dynamic engine runs the real batch, raised to the profile's minimum."""
        if self._profile is not None:
            batch = max(n, self._profile[0])
            if batch != self._batch_set:
                self._set_batch(batch)

    def _copy_input(self, inp: Tensor, n: int, input_set: int) -> None:
        count = n * inp.item_bytes
        checked(cudart.cudaMemcpyAsync(inp.device_ptr, inp.hosts[input_set], count, HOST_TO_DEVICE, self._stream),
                "cudaMemcpyAsync", f"input {inp.name}, {count} bytes to the GPU")

    def _execute(self) -> None:
        if not self._context.execute_async_v3(self._stream_handle):
            raise TensorRTError("IExecutionContext.execute_async_v3", self._trt_log.last_error())

    def _copy_output(self, out: Tensor, n: int, output_set: int) -> None:
        count = n * out.item_bytes
        checked(cudart.cudaMemcpyAsync(out.hosts[output_set], out.device_ptr, count, DEVICE_TO_HOST, self._stream),
                "cudaMemcpyAsync", f"output {out.name}, {count} bytes from the GPU")

    def _synchronize(self) -> None:
        checked(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    # -- telemetry -----------------------------------------------------------------------------
    def telemetry(self) -> dict | None:
        """The GPU's temperature, load, memory and power from nvidia-smi (tegrastats on a Jetson),
        cached process-wide for a few seconds; None where neither tool works or telemetry is off.
        Makes no CUDA call, so any thread (the status socket's) may ask."""
        if not self.config.telemetry:
            return None
        return gpu_telemetry(GpuKind.CUDA, self.config.device_id)
