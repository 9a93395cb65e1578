"""State, engine files and test controls of the fake TensorRT (not part of the real API: tests
import it as `tensorrt._fake`). The public module `tensorrt` only calls into here.

The fake engine file (what trtexec's --saveEngine would write) is a magic line and a JSON header,
written by `write_engine`:

    {"onnx": "/abs/yolov8n.onnx",          # the source ONNX, run through ONNX Runtime on execute
     "trt_version": "10.3",                # major.minor of the TensorRT that "built" it
     "precision": "fp16",                  # fp32 | fp16 | int8 (trtexec --fp16/--int8; only a tag)
     "batch": 1,                           # static engine: its fixed batch
     "profile": [1, 2, 4],                 # or a dynamic batch axis with this min/opt/max profile
     "profiles": [[1, 2, 4], [1, 8, 16]],  # or several optimisation profiles
     "io_dtypes": {"images": "float16"}}   # tensors built with --inputIOFormats/--outputIOFormats

The engine's tensors are the ONNX inputs and outputs with the batch axis replaced (-1 when a
profile is given); an axis past the batch that ONNX Runtime reports by name stays -1 (a
data-dependent size, as of TopK with a computed k). `io_dtypes` may also name "bfloat16" or "fp8",
types TensorRT has and numpy lacks. An ONNX whose batch is fixed at 1 runs one frame at a time, so
a dynamic-batch engine can stand for one built from a batch-1 export. Deserialising fails (None, and an error
through the logger) for a file without the magic line, a broken header, or another TensorRT
version, as a real plan from another release does.

Device memory is reached through the fake `cuda.bindings` when it is the one imported (strict: an
address must lie in a live device allocation of the engine's GPU, big enough for the tensor), or
through real cuda-python's synchronous copies otherwise, so the same fake engine can run over real
GPU memory where a GPU but no TensorRT is present.

Test controls: `reset(version="10.3.0")` (a fresh process as TensorRT `version`; removes or
installs the APIs that 10.x dropped), `STATE.counts` (calls per API name), `STATE.legacy_calls`
(any use of an API removed in 10.x), `STATE.default_stream_executes`, `STATE.executed_batches`,
`STATE.events` (creation and destruction of runtimes, engines and contexts, in order),
`STATE.log` (every message sent to the application's logger), `live()` (objects not yet destroyed).
Environment (for subprocess daemons): YOLOEDGE_FAKE_TRT_VERSION, YOLOEDGE_FAKE_TRT_REPORT.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

MAGIC = b"YOLOEDGE-FAKE-TRT-ENGINE\n"
DEFAULT_VERSION = "10.3.0"
_SESSIONS: dict[str, Any] = {}
_SESSIONS_LOCK = threading.Lock()
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(uint8)": "uint8",
               "tensor(int8)": "int8", "tensor(int32)": "int32", "tensor(int64)": "int64"}


@dataclass
class TensorInfo:
    name: str
    is_input: bool
    shape: tuple  # -1 on the batch axis of a dynamic engine
    dtype: str  # numpy name
    onnx_dtype: str


@dataclass
class EngineSpec:
    path_hint: str
    onnx: str
    version: str
    precision: str
    batch: int  # static batch (0 when dynamic)
    profile: tuple | None  # (min, opt, max) batch of profile 0
    tensors: list  # TensorInfo, inputs first, in ONNX order
    onnx_batch_fixed: bool
    profiles: tuple = ()  # every optimisation profile's (min, opt, max) batch; () for a static engine


class State:
    def __init__(self, version: str = DEFAULT_VERSION):
        self.lock = threading.RLock()
        self.version = version
        self.counts: Counter = Counter()
        self.legacy_calls: Counter = Counter()
        self.default_stream_executes = 0
        self.executed_batches: list[int] = []
        self.events: list[str] = []
        self.log: list[tuple[str, str]] = []
        self.live: Counter = Counter()
        self.bound: dict[int, Any] = {}  # device address -> weakref of the execution context bound to it

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def tag(self) -> str:
        return ".".join(self.version.split(".")[:2])


STATE = State(os.environ.get("YOLOEDGE_FAKE_TRT_VERSION", DEFAULT_VERSION))


def reset(version: str = DEFAULT_VERSION) -> State:
    """A fresh process of TensorRT `version` ("8.6.1", "10.3.0", ...)."""
    global STATE
    STATE = State(version)
    import tensorrt

    tensorrt._install(version)
    return STATE


def live() -> dict:
    with STATE.lock:
        return {k: v for k, v in STATE.live.items() if v}


def report() -> dict:
    with STATE.lock:
        return {"version": STATE.version, "calls": dict(STATE.counts), "legacy_calls": dict(STATE.legacy_calls),
                "default_stream_executes": STATE.default_stream_executes,
                "executed_batches": dict(Counter(STATE.executed_batches)), "live": live(),
                "errors": [m for s, m in STATE.log if s in ("INTERNAL_ERROR", "ERROR")][:200]}


#: one report at a time, taken and written under it: two GPUs' runtimes are destroyed on two
#: device threads at once, and a report taken before the other's teardown must not be written
#: after that one's (the file would then show the other GPU's objects as never released)
_REPORT_LOCK = threading.Lock()


def write_report() -> None:
    path = os.environ.get("YOLOEDGE_FAKE_TRT_REPORT")
    if path:
        with _REPORT_LOCK:
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(report(), f, indent=1, sort_keys=True)
            os.replace(tmp, path)


atexit.register(write_report)


# -- engine files ----------------------------------------------------------------------------------
def write_engine(path, onnx, *, batch: int = 1, profile: Sequence[int] | None = None, precision: str = "fp32",
                 io_dtypes: dict | None = None, version: str | None = None,
                 profiles: Sequence[Sequence[int]] | None = None) -> str:
    """Write a fake engine for `onnx` (see the module docstring); returns its path. `profiles`
    gives several optimisation profiles (the first is also `profile`)."""
    if profiles:
        profile = profiles[0]
    header = {"onnx": os.path.abspath(str(onnx)), "trt_version": version or STATE.tag(), "precision": precision,
              "batch": batch, "profile": list(profile) if profile else None, "io_dtypes": io_dtypes or {}}
    if profiles:
        header["profiles"] = [list(p) for p in profiles]
    with open(path, "wb") as f:
        f.write(MAGIC + json.dumps(header).encode())
    return str(path)


def session(path: str):
    """One ONNX Runtime session per ONNX file for the test process, with the options yoloedge's ONNX
    Runtime backend uses by default (asked of it, so a parity test compares the same numbers)."""
    import onnxruntime as ort

    from yoloedge.backends.onnxruntime import session_options
    from yoloedge.config.model import OnnxRuntimeConfig

    with _SESSIONS_LOCK:
        if path not in _SESSIONS:
            _SESSIONS[path] = ort.InferenceSession(path, sess_options=session_options(OnnxRuntimeConfig()),
                                                   providers=["CPUExecutionProvider"])
        return _SESSIONS[path]


def parse_engine(blob: bytes) -> EngineSpec:
    """The engine a serialized blob describes; ValueError with TensorRT's kind of message when the
    blob is not one this runtime can deserialise."""
    if not blob.startswith(MAGIC):
        raise ValueError("1: [stdArchiveReader.cpp::StdArchiveReader::32] Error Code 1: Serialization "
                         "(Serialization assertion magicTagRead == kMAGIC_TAG failed.Magic tag does not match)")
    try:
        header = json.loads(blob[len(MAGIC):].decode())
        onnx, built = str(header["onnx"]), str(header["trt_version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"1: Error Code 1: Serialization (corrupt plan: {exc})") from None
    if built != STATE.tag():
        raise ValueError(f"1: [stdArchiveReader.cpp::StdArchiveReader::40] Error Code 1: Serialization (Serialization "
                         f"assertion stdVersionRead == kSERIALIZATION_VERSION failed.Version tag does not match. "
                         f"Note: the engine was built with TensorRT {built}, this is {STATE.version})")
    sess = session(onnx)
    profile = tuple(int(b) for b in header["profile"]) if header.get("profile") else None
    profiles = tuple(tuple(int(b) for b in p) for p in header.get("profiles") or ([profile] if profile else []))
    for bounds in profiles:
        if len(bounds) != 3 or not (1 <= bounds[0] <= bounds[1] <= bounds[2]):
            raise ValueError(f"1: Error Code 1: Serialization (bad profile {list(bounds)})")
    batch = 0 if profile else int(header.get("batch", 1))
    overrides = header.get("io_dtypes") or {}
    tensors = []
    for node, is_input in [(i, True) for i in sess.get_inputs()] + [(o, False) for o in sess.get_outputs()]:
        # a named (symbolic) axis past the batch is data-dependent, -1 even once the inputs are set,
        # as TensorRT reports the outputs of NonZero or an NMS layer
        rest = tuple(d if isinstance(d, int) else -1 for d in node.shape[1:])
        onnx_dtype = _ORT_DTYPES[node.type]
        shape = ((-1 if profile else batch), *rest)
        tensors.append(TensorInfo(node.name, is_input, shape, overrides.get(node.name, onnx_dtype), onnx_dtype))
    first = sess.get_inputs()[0].shape[0]
    return EngineSpec(onnx, onnx, built, str(header.get("precision", "fp32")), batch, profile, tensors,
                      isinstance(first, int) and first == 1, profiles)


def compute(spec: EngineSpec, batch: int, read: Callable[[TensorInfo, int], np.ndarray],
            write: Callable[[TensorInfo, np.ndarray], None]) -> None:
    """Run the source ONNX on `batch` frames read from the input tensors and write the outputs."""
    sess = session(spec.onnx)
    inputs = [t for t in spec.tensors if t.is_input]
    outputs = [t for t in spec.tensors if not t.is_input]
    feeds = {t.name: read(t, batch).astype(t.onnx_dtype) for t in inputs}
    names = [t.name for t in outputs]
    if spec.onnx_batch_fixed and batch > 1:
        runs = [sess.run(names, {k: v[i:i + 1] for k, v in feeds.items()}) for i in range(batch)]
        results = [np.concatenate([r[k] for r in runs]) for k in range(len(names))]
    else:
        results = sess.run(names, feeds)
    for tensor, result in zip(outputs, results):
        write(tensor, np.ascontiguousarray(result, dtype=tensor.dtype))
    STATE.executed_batches.append(batch)


# -- device memory: the fake cuda-python, or real copies ----------------------------------------------
class FakeCudaMemory:
    """Strict: through the fake `cuda.bindings` state (live allocations, per-GPU, stream order)."""

    def __init__(self, fake):
        self.fake = fake

    def current_device(self) -> int:
        return self.fake.STATE.current_device()

    def problem(self, ptr: int, nbytes: int, device: int) -> str | None:
        """Why `ptr` cannot hold `nbytes` for an engine on `device`; None when it can."""
        try:
            self.fake.STATE.device_region(ptr, nbytes, device)
        except self.fake.Refused as refused:
            return str(refused)
        return None

    def stream_problem(self, handle: int, device: int) -> str | None:
        if handle == 0:
            return None
        stream = self.fake.STATE.streams.get(handle)
        if stream is None:
            return f"unknown or destroyed CUDA stream {handle:#x}"
        if stream.device != device:
            return f"stream {handle:#x} belongs to GPU {stream.device}, the engine to GPU {device}"
        return None

    def read(self, ptr: int, nbytes: int) -> bytes:
        return self.fake.STATE.read(ptr, nbytes)

    def write(self, ptr: int, data: bytes) -> None:
        self.fake.STATE.write(ptr, data)

    def enqueue(self, handle: int, task: Callable[[], None]) -> None:
        with self.fake.STATE.lock:
            self.fake.STATE.enqueue(handle, task)


class RealCudaMemory:
    """Over real GPU memory: the stream is synchronised, the inputs copied out, the source ONNX run
    on the host and the outputs copied back, all before execute_async_v3 returns."""

    def __init__(self, cudart):
        self.cudart = cudart

    def _check(self, result, call: str):
        if int(result[0]) != 0:
            raise RuntimeError(f"{call} failed: {result[0]!r}")
        return result[1:]

    def current_device(self) -> int:
        return int(self._check(self.cudart.cudaGetDevice(), "cudaGetDevice")[0])

    def problem(self, ptr: int, nbytes: int, device: int) -> str | None:
        return None if ptr else "a NULL address"

    def stream_problem(self, handle: int, device: int) -> str | None:
        return None

    def read(self, ptr: int, nbytes: int) -> bytes:
        out = np.empty(nbytes, np.uint8)
        self._check(self.cudart.cudaMemcpy(out.ctypes.data, ptr, nbytes,
                                           self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
        return out.tobytes()

    def write(self, ptr: int, data: bytes) -> None:
        src = np.frombuffer(data, np.uint8).copy()
        self._check(self.cudart.cudaMemcpy(ptr, src.ctypes.data, len(data),
                                           self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")

    def enqueue(self, handle: int, task: Callable[[], None]) -> None:
        self._check(self.cudart.cudaStreamSynchronize(handle), "cudaStreamSynchronize")
        task()


def memory():
    try:
        from cuda.bindings import _fake as fake_cuda  # type: ignore[attr-defined]
    except ImportError:
        from cuda.bindings import runtime as cudart

        return RealCudaMemory(cudart)
    return FakeCudaMemory(fake_cuda)
