"""A fake TensorRT Python API (`import tensorrt`) for tests: the real names, return values and
refusals of the runtime side, with the GPU replaced by ONNX Runtime on the CPU.

Importable as `tensorrt` when tests/fakes is on sys.path (the daemon harness puts it on PYTHONPATH).
It pretends to be TensorRT 8.6 or 10.x (`_fake.reset(version=...)`, or $YOLOEDGE_FAKE_TRT_VERSION).

Real behaviours modelled (API fact sheet section 2, GPU facts "TensorRT Python"):
* `Runtime(logger)` takes an `ILogger` (a subclass must call `ILogger.__init__`); messages go to
  `logger.log(severity, msg)`; `deserialize_cuda_engine` returns None (and logs an error) for a
  blob it cannot deserialise, never raises; an engine keeps its runtime alive and a context its
  engine, as the bindings' keep_alive does;
* the name-based tensor API of both versions: `num_io_tensors`, `get_tensor_name`,
  `get_tensor_mode` (TensorIOMode), `get_tensor_shape` / `get_tensor_dtype`,
  `get_tensor_profile_shape(name, profile)` -> [min, opt, max]; shapes are `Dims` (not tuples);
  `nptype` raises TypeError for FP8/BF16/INT4;
* `set_input_shape` returns False (and logs) for a shape outside the active profile, of the wrong
  rank, or differing on a static axis; output shapes from `context.get_tensor_shape` resolve once
  every dynamic input shape is set;
* `set_tensor_address(name, ptr)` returns False for an unknown name, a NULL or misaligned
  address, or one inside no live device allocation of the engine's GPU;
* `execute_async_v3(stream)` takes the stream as an int (size_t) and returns False when an input
  shape or an I/O address is not set, an address no longer holds the tensor's current size (freed,
  too small), the stream is unknown or of another GPU, or the thread's current device is not the
  engine's; otherwise it queues the run on the stream (results appear at cudaStreamSynchronize);
  a run on the default stream (0) works and is counted (`STATE.default_stream_executes`);
* APIs removed in 10.x (`num_bindings`, `get_binding_shape`, `binding_is_input`,
  `get_binding_name`, `get_binding_index`, `get_binding_dtype`, `get_profile_shape`,
  `max_batch_size`, `has_implicit_batch_dimension`, `set_binding_shape`, `execute_async_v2`,
  `execute_async`, `execute`, `build_engine`, `max_workspace_size`) are absent on a 10.x fake
  (AttributeError, like the real module) and counted in `STATE.legacy_calls` on an 8.6 fake.
* several optimisation profiles (`write_engine(profiles=...)`): `set_optimization_profile_async(index,
  stream)` switches (a refusal is logged and raised as RuntimeError, as the bindings do, not
  returned as False), and `set_input_shape` checks the active profile's bounds.
* before 8.5 (`reset(version="8.4.1")`) the name-based API is absent (AttributeError); such a fake
  only shows that a backend refuses it: its binding-index calls are not made to run.
Not modelled: building networks, the ONNX parser, refit, shape tensors, one profile shared by
two contexts.
Fake-only strictness for several models on one GPU: `set_tensor_address` refuses (False, an error
through the logger) device memory that a live execution context of another engine is bound to.
"""

from __future__ import annotations

import enum
import sys
import warnings
import weakref
from functools import reduce
from typing import Any, Iterable

import numpy as np

from . import _fake
from ._fake import STATE as _INITIAL_STATE

__version__ = _INITIAL_STATE.version


def _state():
    return _fake.STATE


def _count(name: str) -> None:
    _fake.STATE.counts[name] += 1


# -- enums, Dims, helpers ------------------------------------------------------------------------------
class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9


_NUMPY_TO_TRT = {"float32": DataType.FLOAT, "float16": DataType.HALF, "int8": DataType.INT8,
                 "int32": DataType.INT32, "bool": DataType.BOOL, "uint8": DataType.UINT8, "int64": DataType.INT64}
_TRT_TO_NUMPY = {v: np.dtype(k).type for k, v in _NUMPY_TO_TRT.items()}
#: io_dtypes names of a fake engine for the TensorRT types numpy has no equivalent of.
_TRT_ONLY = {"bfloat16": DataType.BF16, "fp8": DataType.FP8}


def nptype(trt_type: DataType) -> type:
    """The numpy type of a TensorRT type; TypeError for those numpy has none of (FP8, BF16, INT4)."""
    if trt_type not in _TRT_TO_NUMPY or (trt_type == DataType.INT64 and _state().major < 10):
        raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
    return _TRT_TO_NUMPY[trt_type]


def volume(iterable: Iterable[int]) -> int:
    return reduce(lambda a, b: a * b, iterable, 1)


class Dims:
    """A shape as the bindings return it: indexable, iterable, sized, not a tuple."""

    def __init__(self, shape: Iterable[int] = ()):
        self._dims = tuple(int(d) for d in shape)

    def __len__(self) -> int:
        return len(self._dims)

    def __getitem__(self, index):
        return self._dims[index]

    def __iter__(self):
        return iter(self._dims)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dims):
            return other._dims == self._dims
        if isinstance(other, (tuple, list)):
            return tuple(other) == self._dims
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._dims)

    def __repr__(self) -> str:
        return repr(self._dims)


# -- logging -------------------------------------------------------------------------------------------
class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR = Severity.INTERNAL_ERROR
    ERROR = Severity.ERROR
    WARNING = Severity.WARNING
    INFO = Severity.INFO
    VERBOSE = Severity.VERBOSE

    def __init__(self) -> None:
        self._initialised = True

    def log(self, severity, msg: str) -> None:  # pragma: no cover - abstract in the real API
        raise NotImplementedError


class Logger(ILogger):
    """TensorRT's own logger: prints messages at or above `min_severity` to stderr."""

    def __init__(self, min_severity=ILogger.Severity.WARNING):
        super().__init__()
        self.min_severity = min_severity

    def log(self, severity, msg: str) -> None:
        if severity <= self.min_severity:
            print(f"[TRT] [{severity.name[0]}] {msg}", file=sys.stderr)


def _emit(logger: ILogger, severity: ILogger.Severity, msg: str) -> None:
    _state().log.append((severity.name, msg))
    logger.log(severity, msg)


def _track(obj: Any, kind: str) -> None:
    """Creation and destruction, for the teardown-order and nothing-left tests."""
    state = _state()
    with state.lock:  # two GPUs' device threads create and destroy at once
        state.live[kind] += 1
        state.events.append(f"create {kind}")

    def gone(state=state) -> None:
        with state.lock:
            state.live[kind] -= 1
            state.events.append(f"destroy {kind}")
        if kind == "runtime":  # a daemon may leave through os._exit: report at each teardown
            _fake.write_report()

    weakref.finalize(obj, gone)


# -- runtime and engine --------------------------------------------------------------------------------
class Runtime:
    def __init__(self, logger: ILogger):
        if not isinstance(logger, ILogger) or not getattr(logger, "_initialised", False):
            raise TypeError("__init__(): incompatible constructor arguments: Runtime(logger: tensorrt.ILogger)")
        _count("Runtime")
        self.logger = logger
        _track(self, "runtime")

    def deserialize_cuda_engine(self, serialized_engine) -> "ICudaEngine | None":
        _count("Runtime.deserialize_cuda_engine")
        try:
            blob = bytes(memoryview(serialized_engine))
        except TypeError:
            raise TypeError("deserialize_cuda_engine(): incompatible function arguments "
                            "(serialized_engine: buffer)") from None
        try:
            spec = _fake.parse_engine(blob)
        except ValueError as exc:
            _emit(self.logger, ILogger.ERROR, str(exc))
            return None
        memory = _fake.memory()
        return ICudaEngine(self, spec, memory, memory.current_device())


class ICudaEngine:
    def __init__(self, runtime: Runtime, spec, memory, device: int):
        self._runtime = runtime  # keep_alive: the runtime outlives its engines
        self._spec = spec
        self._memory = memory
        self._device = device
        self._by_name = {t.name: t for t in spec.tensors}
        _track(self, "engine")

    @property
    def logger(self) -> ILogger:
        return self._runtime.logger

    @property
    def num_io_tensors(self) -> int:
        _count("ICudaEngine.num_io_tensors")
        return len(self._spec.tensors)

    @property
    def num_optimization_profiles(self) -> int:
        """At least 1 (a static engine has the one implicit profile)."""
        return max(1, len(self._spec.profiles))

    @property
    def name(self) -> str:
        return "fake engine of " + self._spec.onnx

    def get_tensor_name(self, index: int) -> str | None:
        _count("ICudaEngine.get_tensor_name")
        tensors = self._spec.tensors
        return tensors[index].name if 0 <= index < len(tensors) else None

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        _count("ICudaEngine.get_tensor_mode")
        tensor = self._by_name.get(name)
        if tensor is None:
            return TensorIOMode.NONE
        return TensorIOMode.INPUT if tensor.is_input else TensorIOMode.OUTPUT

    def get_tensor_shape(self, name: str) -> Dims:
        _count("ICudaEngine.get_tensor_shape")
        tensor = self._by_name.get(name)
        return Dims(tensor.shape if tensor else (-1,))

    def get_tensor_dtype(self, name: str) -> DataType:
        _count("ICudaEngine.get_tensor_dtype")
        tensor = self._by_name.get(name)
        if tensor is None:
            return DataType.FLOAT
        return _TRT_ONLY.get(tensor.dtype) or _NUMPY_TO_TRT[tensor.dtype]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        _count("ICudaEngine.get_tensor_profile_shape")
        tensor = self._by_name.get(name)
        profiles = self._spec.profiles
        if tensor is None or not tensor.is_input or not profiles or not 0 <= profile_index < len(profiles):
            _emit(self.logger, ILogger.ERROR, f"3: [engine.cpp::getProfileShape] Error Code 3: API Usage Error "
                                              f"(no profile {profile_index} shape for tensor {name!r})")
            return []
        return [Dims((b, *tensor.shape[1:])) for b in profiles[profile_index]]

    def create_execution_context(self) -> "IExecutionContext":
        _count("ICudaEngine.create_execution_context")
        return IExecutionContext(self)

    # 8.6 only (installed by _install): the binding-index API
    def _bindings(self) -> list:
        return self._spec.tensors


class IExecutionContext:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine  # keep_alive: the engine outlives its contexts
        self._shapes: dict[str, tuple] = {t.name: t.shape for t in engine._spec.tensors if t.is_input}
        self._addresses: dict[str, int] = {}
        self._profile = 0
        _track(self, "context")

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def _input_batch(self) -> int | None:
        """The batch every input agrees on; None while a dynamic input shape is unset."""
        batches = {shape[0] for shape in self._shapes.values()}
        return None if -1 in batches or len(batches) != 1 else batches.pop()

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        """As the bindings do: a refusal is logged and raised as RuntimeError (never a False).
        Switching forgets the dynamic input shapes: they are set again for the new profile."""
        _count("IExecutionContext.set_optimization_profile_async")
        for value, what in ((profile_index, "profile_index: int"), (stream_handle, "stream_handle: int")):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"set_optimization_profile_async(): incompatible function arguments ({what})")
        count = self.engine.num_optimization_profiles
        why = None
        if not 0 <= profile_index < count:
            why = f"profile index {profile_index} out of range (the engine has {count})"
        else:
            why = self.engine._memory.stream_problem(stream_handle, self.engine._device)
        if why:
            _emit(self.engine.logger, ILogger.ERROR, f"3: [executionContext.cpp::setOptimizationProfileInternal] "
                                                     f"Error Code 3: API Usage Error ({why})")
            raise RuntimeError("Error in set optimization profile async.")
        self._profile = profile_index
        for t in self.engine._spec.tensors:
            if t.is_input and -1 in t.shape:
                self._shapes[t.name] = t.shape
        return True

    def set_input_shape(self, name: str, shape) -> bool:
        _count("IExecutionContext.set_input_shape")
        spec = self.engine._spec
        tensor = self.engine._by_name.get(name)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
            raise TypeError("set_input_shape(): incompatible function arguments (shape: Dims, a sequence of ints)")
        wanted = tuple(int(d) for d in shape)
        why = None
        if tensor is None or not tensor.is_input:
            why = f"{name!r} is not an input tensor"
        elif len(wanted) != len(tensor.shape):
            why = f"rank {len(wanted)} for a rank-{len(tensor.shape)} tensor"
        elif any(s != -1 and s != w for s, w in zip(tensor.shape, wanted)):
            why = f"{list(wanted)} differs from the static dimensions {list(tensor.shape)}"
        elif spec.profiles and not spec.profiles[self._profile][0] <= wanted[0] <= spec.profiles[self._profile][2]:
            low, _, high = spec.profiles[self._profile]
            why = f"batch {wanted[0]} is outside the optimization profile [{low}, {high}] (profile {self._profile})"
        if why:
            _emit(self.engine.logger, ILogger.ERROR, f"3: [executionContext.cpp::setInputShape] Error Code 3: API "
                                                     f"Usage Error (Parameter check failed: {why})")
            return False
        self._shapes[name] = wanted
        return True

    def get_tensor_shape(self, name: str) -> Dims:
        _count("IExecutionContext.get_tensor_shape")
        tensor = self.engine._by_name.get(name)
        if tensor is None:
            return Dims((-1,))
        if tensor.is_input:
            return Dims(self._shapes[name])
        batch = self._input_batch()
        return Dims(((-1 if batch is None else batch) if tensor.shape[0] == -1 else tensor.shape[0], *tensor.shape[1:]))

    def infer_shapes(self) -> list[str]:
        return [n for n, s in self._shapes.items() if -1 in s]

    def _nbytes(self, name: str) -> int:
        tensor = self.engine._by_name[name]
        shape = tuple(self.get_tensor_shape(name))
        return volume(max(d, 0) for d in shape) * np.dtype(tensor.dtype).itemsize

    def set_tensor_address(self, name: str, memory: int) -> bool:
        _count("IExecutionContext.set_tensor_address")
        if not isinstance(memory, int) or isinstance(memory, bool):
            raise TypeError("set_tensor_address(): incompatible function arguments (name: str, memory: int)")
        tensor = self.engine._by_name.get(name)
        why = None
        if tensor is None:
            why = f"{name!r} is not an I/O tensor of this engine"
        elif memory == 0 or memory % np.dtype(tensor.dtype).itemsize:
            why = f"address {memory:#x} is NULL or not aligned to {np.dtype(tensor.dtype).itemsize} bytes"
        else:
            why = self.engine._memory.problem(memory, 1, self.engine._device) or _bound_elsewhere(self, memory)
        if why:
            _emit(self.engine.logger, ILogger.ERROR, f"3: [executionContext.cpp::setTensorAddress] Error Code 3: "
                                                     f"API Usage Error ({why})")
            return False
        self._addresses[name] = memory
        _state().bound[memory] = weakref.ref(self)
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def execute_async_v3(self, stream_handle: int) -> bool:
        _count("IExecutionContext.execute_async_v3")
        if not isinstance(stream_handle, int) or isinstance(stream_handle, bool):
            raise TypeError("execute_async_v3(): incompatible function arguments (stream_handle: int)")
        engine, spec = self.engine, self.engine._spec
        why = self._not_ready(stream_handle)
        if why:
            _emit(engine.logger, ILogger.ERROR, f"3: [executionContext.cpp::enqueueV3] Error Code 3: API Usage "
                                                f"Error ({why})")
            return False
        if stream_handle == 0:
            _state().default_stream_executes += 1
        batch = self._input_batch()
        addresses, memory = dict(self._addresses), engine._memory
        nbytes = {name: self._nbytes(name) for name in addresses}

        def read(tensor, n):
            return np.frombuffer(memory.read(addresses[tensor.name], nbytes[tensor.name]),
                                 tensor.dtype).reshape(n, *tensor.shape[1:])

        def write(tensor, array):
            memory.write(addresses[tensor.name], array.tobytes())

        memory.enqueue(stream_handle, lambda: _fake.compute(spec, batch, read, write))
        return True

    def _not_ready(self, stream_handle: int) -> str | None:
        engine = self.engine
        unset = self.infer_shapes()
        if unset:
            return f"input shapes not specified: {', '.join(unset)} (set_input_shape)"
        missing = [t.name for t in engine._spec.tensors if t.name not in self._addresses]
        if missing:
            return f"no address set for tensor(s) {', '.join(missing)} (set_tensor_address)"
        device = engine._memory.current_device()
        if device != engine._device:
            return f"the current device is {device}, the engine was deserialised on device {engine._device}"
        for name, ptr in self._addresses.items():
            why = engine._memory.problem(ptr, self._nbytes(name), engine._device)
            if why:
                return f"tensor {name}: {why}"
        return engine._memory.stream_problem(stream_handle, engine._device)

    def execute_v2(self, bindings) -> bool:
        """Synchronous, on the default stream (present in 8.6 and 10.x)."""
        _count("IExecutionContext.execute_v2")
        for tensor, ptr in zip(self.engine._spec.tensors, bindings):
            if not self.set_tensor_address(tensor.name, int(ptr)):
                return False
        return self.execute_async_v3(0)


def _bound_elsewhere(context: "IExecutionContext", memory: int) -> str | None:
    """Fake-only strictness: device memory bound by a live execution context of another engine is
    another model's buffer (TensorRT would let the two models overwrite each other's tensors)."""
    ref = _state().bound.get(memory)
    other = ref() if ref is not None else None
    if other is None or other is context or other.engine is context.engine:
        return None
    return f"address {memory:#x} is bound by an execution context of another engine ({other.engine.name})"


# -- builder (only what the 8.6/10.x difference needs) ---------------------------------------------------
class IBuilderConfig:
    def set_memory_pool_limit(self, pool, pool_size: int) -> None:
        _count("IBuilderConfig.set_memory_pool_limit")


class Builder:
    def __init__(self, logger: ILogger):
        self.logger = logger

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def build_serialized_network(self, network, config):
        raise NotImplementedError("the fake TensorRT builds no networks: tests write engines with _fake.write_engine")


# -- APIs removed in 10.x: present (and counted) only on an 8.6 fake ------------------------------------
def _legacy(name: str, fn):
    def call(self, *args, **kwargs):
        _state().legacy_calls[name] += 1
        warnings.warn(f"{name} is deprecated", DeprecationWarning, stacklevel=2)
        return fn(self, *args, **kwargs)
    return call


def _legacy_property(name: str, fn):
    return property(_legacy(name, fn))


def _binding_shape(engine: ICudaEngine, index: int) -> Dims:
    return Dims(engine._spec.tensors[index].shape)


def _profile_shape(engine: ICudaEngine, profile: int, binding) -> list[Dims]:
    name = binding if isinstance(binding, str) else engine._spec.tensors[binding].name
    return engine.get_tensor_profile_shape(name, profile)


def _set_binding_shape(context: IExecutionContext, index: int, shape) -> bool:
    return context.set_input_shape(context.engine._spec.tensors[index].name, shape)


def _execute_bindings(context: IExecutionContext, bindings, stream_handle: int) -> bool:
    for tensor, ptr in zip(context.engine._spec.tensors, bindings):
        if not context.set_tensor_address(tensor.name, int(ptr)):
            return False
    return context.execute_async_v3(stream_handle)


def _build_engine(builder: Builder, network, config):
    raise NotImplementedError("the fake TensorRT builds no networks")


LEGACY: dict[type, dict[str, Any]] = {
    ICudaEngine: {
        "num_bindings": _legacy_property("num_bindings", lambda e: len(e._spec.tensors)),
        "max_batch_size": _legacy_property("max_batch_size", lambda e: 1),
        "has_implicit_batch_dimension": _legacy_property("has_implicit_batch_dimension", lambda e: False),
        "get_binding_shape": _legacy("get_binding_shape", _binding_shape),
        "binding_is_input": _legacy("binding_is_input", lambda e, i: e._spec.tensors[i].is_input),
        "get_binding_name": _legacy("get_binding_name", lambda e, i: e._spec.tensors[i].name),
        "get_binding_index": _legacy("get_binding_index",
                                     lambda e, n: next((i for i, t in enumerate(e._spec.tensors) if t.name == n), -1)),
        "get_binding_dtype": _legacy("get_binding_dtype", lambda e, i: _NUMPY_TO_TRT[e._spec.tensors[i].dtype]),
        "get_profile_shape": _legacy("get_profile_shape", _profile_shape),
    },
    IExecutionContext: {
        "set_binding_shape": _legacy("set_binding_shape", _set_binding_shape),
        "get_binding_shape": _legacy("get_binding_shape",
                                     lambda c, i: c.get_tensor_shape(c.engine._spec.tensors[i].name)),
        "execute_async_v2": _legacy("execute_async_v2", _execute_bindings),
        "execute_async": _legacy("execute_async",
                                 lambda c, batch, bindings, stream: _execute_bindings(c, bindings, stream)),
        "execute": _legacy("execute", lambda c, batch, bindings: _execute_bindings(c, bindings, 0)),
    },
    Builder: {
        "build_engine": _legacy("build_engine", _build_engine),
    },
    IBuilderConfig: {
        "max_workspace_size": property(_legacy("max_workspace_size", lambda c: 0),
                                       _legacy("max_workspace_size", lambda c, v: None)),
    },
}


#: the name-based tensor API, new in TensorRT 8.5 (JetPack 5.0's 8.4 has only the binding indices).
NAME_BASED: dict[type, dict[str, Any]] = {
    ICudaEngine: {name: ICudaEngine.__dict__[name] for name in (
        "num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_shape", "get_tensor_dtype",
        "get_tensor_profile_shape")},
    IExecutionContext: {name: IExecutionContext.__dict__[name] for name in (
        "set_input_shape", "set_tensor_address", "get_tensor_address", "execute_async_v3")},
}


def _install(version: str) -> None:
    """Make the module look like TensorRT `version`: the legacy APIs exist only before 10, the
    name-based ones only from 8.5."""
    global __version__
    __version__ = version
    major, minor = (int(part) for part in version.split(".")[:2])
    legacy = major < 10
    for cls, members in LEGACY.items():
        for name, member in members.items():
            if legacy:
                setattr(cls, name, member)
            elif name in cls.__dict__:
                delattr(cls, name)
    named = (major, minor) >= (8, 5)
    for cls, members in NAME_BASED.items():
        for name, member in members.items():
            if named:
                setattr(cls, name, member)
            elif name in cls.__dict__:
                delattr(cls, name)


_install(__version__)
