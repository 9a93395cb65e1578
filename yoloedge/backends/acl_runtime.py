"""The process-wide side of pyACL: return-code checking, constants, init/finalize, host memory views.

pyACL (`import acl`, shipped with Huawei CANN) never raises on failure: every call returns an int
error code, alone (`ret`), last in a tuple (`(value, ret)`, `get_mem_info`'s `(free, total, ret)`),
or not at all (bare values). `check` and `checked` turn a non-zero code into one `AclError` that
names the call, the code and what it means, so a log line says what went wrong without a manual.

The `acl` module defines no constants (section 9 of the API fact sheet): the values below are the
C enums of `acl_base.h` / `acl_rt.h` / `acl_mdl.h`, kept here as the CANN samples keep theirs.

`acl.init` may be called once per process and must precede every other call; `acl.finalize` must
come after the last one. Several backends (one per card, each on its own worker thread) share the
process, so `AclProcess` counts them: the first `acquire` initialises, the last `release`
finalises, whatever order the workers stop in and whether or not they failed.

`DeviceContext` is what the models of one device scope (one worker incarnation, see
`base.DeviceScope`) share on one card: the device set once, one explicit context and one stream in
it. Every model of the scope is loaded, run and unloaded under that context (pyACL requires load,
execute and unload under the same context), and the context is destroyed after the last model of
the scope was unloaded (destroying it under a loaded model is refused).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import acl
import numpy as np

from ..errors import BackendError
from .undo import UndoStack, raise_collected

log = logging.getLogger(__name__)

ACL_SUCCESS = 0

# aclrtMemcpyKind
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3

# aclrtMemMallocPolicy
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2

# aclrtRunMode: where this process runs (on the card's own control CPU, or on a host).
ACL_DEVICE = 0
ACL_HOST = 1

# aclmdlInputAippType
ACL_DATA_WITHOUT_AIPP = 0
ACL_DATA_WITH_STATIC_AIPP = 1
ACL_DATA_WITH_DYNAMIC_AIPP = 2
ACL_DYNAMIC_AIPP_NODE = 3

# aclFormat
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1

#: the extra input ATC adds to a dynamic-batch (or dynamic image size) model.
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
#: the extra input of a dynamic-AIPP model (its parameters per run; not supported here).
ACL_DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"

#: aclDataType -> numpy
ACL_DTYPES: dict[int, np.dtype] = {
    0: np.dtype(np.float32),   # ACL_FLOAT
    1: np.dtype(np.float16),   # ACL_FLOAT16
    2: np.dtype(np.int8),      # ACL_INT8
    3: np.dtype(np.int32),     # ACL_INT32
    4: np.dtype(np.uint8),     # ACL_UINT8
    6: np.dtype(np.int16),     # ACL_INT16
    7: np.dtype(np.uint16),    # ACL_UINT16
    8: np.dtype(np.uint32),    # ACL_UINT32
    9: np.dtype(np.int64),     # ACL_INT64
    10: np.dtype(np.uint64),   # ACL_UINT64
    11: np.dtype(np.float64),  # ACL_DOUBLE
    12: np.dtype(np.bool_),    # ACL_BOOL
}

#: numpy type number of uint8 for `acl.util.ptr_to_numpy` (NPY_UINT8).
NPY_UINT8 = 2

#: error code -> (C name, what it means for someone reading the log).
ERRORS: dict[int, tuple[str, str]] = {
    100000: ("ACL_ERROR_INVALID_PARAM", "invalid parameter"),
    100001: ("ACL_ERROR_UNINITIALIZE", "pyACL is not initialised (acl.init was not called)"),
    100002: ("ACL_ERROR_REPEAT_INITIALIZE", "acl.init was already called in this process"),
    100003: ("ACL_ERROR_INVALID_FILE", "invalid file"),
    100011: ("ACL_ERROR_INVALID_MODEL_ID", "invalid model id"),
    100012: ("ACL_ERROR_DESERIALIZE_MODEL", "the model cannot be deserialised (an .om for another CANN "
                                            "version or --soc_version?)"),
    100013: ("ACL_ERROR_PARSE_MODEL", "the model cannot be parsed"),
    100014: ("ACL_ERROR_READ_MODEL_FAILURE", "the model file cannot be read"),
    100017: ("ACL_ERROR_MODEL_INPUT_NOT_MATCH", "the input dataset does not match the model's inputs"),
    100018: ("ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", "the output dataset does not match the model's outputs"),
    100019: ("ACL_ERROR_MODEL_NOT_DYNAMIC", "the model has no dynamic batch"),
    100037: ("ACL_ERROR_REPEAT_FINALIZE", "acl.finalize was already called"),
    107000: ("ACL_ERROR_RT_PARAM_INVALID", "invalid runtime parameter (pointer, size or copy direction)"),
    107001: ("ACL_ERROR_RT_INVALID_DEVICEID", "no such device id"),
    107002: ("ACL_ERROR_RT_CONTEXT_NULL", "this thread has no current context (acl.rt.set_context first)"),
    107003: ("ACL_ERROR_RT_STREAM_CONTEXT", "the stream belongs to another context"),
    107004: ("ACL_ERROR_RT_MODEL_CONTEXT", "the model was loaded under another context"),
    145000: ("ACL_ERROR_GE_PARAM_INVALID", "invalid parameter"),
    145003: ("ACL_ERROR_GE_EXEC_MODEL_ID_INVALID", "invalid model id"),
    145006: ("ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID", "a data buffer is smaller than the model needs"),
    145007: ("ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID", "a data buffer address is invalid"),
    145011: ("ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID", "wrong index or buffer for the dynamic batch input"),
    145012: ("ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID", "the dynamic batch input buffer is too small"),
    145013: ("ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID", "the batch size is not one of the model's gears"),
    200000: ("ACL_ERROR_BAD_ALLOC", "out of memory"),
    200001: ("ACL_ERROR_API_NOT_SUPPORT", "not supported on this device or CANN version"),
    200002: ("ACL_ERROR_INVALID_DEVICE", "invalid device"),
    207000: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "not supported by the runtime"),
    207001: ("ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory exhausted"),
    207004: ("ACL_ERROR_RT_NO_DEVICE", "no NPU found (driver loaded? /dev/davinci* present?)"),
    207006: ("ACL_ERROR_RT_NO_PERMISSION", "no permission for the NPU (is the user in the HwHiAiUser group?)"),
    245000: ("ACL_ERROR_GE_MEMORY_ALLOCATION", "model memory allocation failed"),
    300000: ("ACL_ERROR_STORAGE_OVER_LIMIT", "storage over limit"),
    500000: ("ACL_ERROR_INTERNAL_ERROR", "internal error"),
    500001: ("ACL_ERROR_FAILURE", "failure"),
    500002: ("ACL_ERROR_GE_FAILURE", "graph engine failure"),
    500003: ("ACL_ERROR_RT_FAILURE", "runtime failure"),
    500004: ("ACL_ERROR_DRV_FAILURE", "driver failure"),
    507000: ("ACL_ERROR_RT_INTERNAL_ERROR", "runtime internal error"),
    507002: ("ACL_ERROR_RT_STREAM_TASK_FULL", "the stream's task queue is full"),
    507010: ("ACL_ERROR_RT_LOST_HEARTBEAT", "the device stopped responding (heartbeat lost)"),
    507011: ("ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed on the device"),
    507014: ("ACL_ERROR_RT_AICORE_TIMEOUT", "AI core timeout"),
    507015: ("ACL_ERROR_RT_AICORE_EXCEPTION", "AI core exception"),
    507899: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
    545000: ("ACL_ERROR_GE_INTERNAL_ERROR", "graph engine internal error"),
    545001: ("ACL_ERROR_GE_LOAD_MODEL", "the model cannot be loaded"),
}


def describe_code(code: int) -> tuple[str, str]:
    """(name, meaning) of an error code; unknown codes get their class from the leading digit."""
    if code in ERRORS:
        return ERRORS[code]
    kind = {1: "caller error", 2: "resource or permission problem", 5: "internal or driver fault"}
    return "unknown code", kind.get(code // 100000, "unrecognised error code")


class AclError(BackendError):
    """A pyACL call returned a non-zero code; `call`, `code`, `code_name` and `meaning` say which."""

    def __init__(self, call: str, code: int, detail: str = ""):
        self.call = call
        self.code = int(code)
        self.code_name, self.meaning = describe_code(self.code)
        text = f"{call} failed with {self.code} ({self.code_name}: {self.meaning})"
        super().__init__(f"{text}; {detail}" if detail else text)

    @property
    def device_fault(self) -> bool:
        """5xxxxx codes come from the runtime, driver or device, not from how it was called."""
        return self.code >= 500000


def check(ret: Any, call: str, detail: str = "") -> None:
    """Raise `AclError` unless a call that returns a bare `ret` succeeded."""
    if ret != ACL_SUCCESS:
        raise AclError(call, ret, detail)


def checked(result: Any, call: str, detail: str = "") -> Any:
    """The value(s) of a call returning `(value, ret)` (or `(a, b, ret)`); `AclError` on failure."""
    *values, ret = result
    check(ret, call, detail)
    return values[0] if len(values) == 1 else tuple(values)


class AclProcess:
    """`acl.init` before the first backend, `acl.finalize` after the last, from any thread.

    Backends register when constructed and settle when their `open` ends (either way). pyACL is
    finalised when no backend holds it and none is still on its way to `open`: a card that fails
    at start-up, before its sibling (constructed on another worker thread) has acquired pyACL,
    must not finalise it under the sibling, because pyACL cannot be initialised twice in a process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._pending: weakref.WeakSet = weakref.WeakSet()
        self._initialised = False
        self._finalized = False

    @property
    def users(self) -> int:
        return self._users

    @property
    def initialised(self) -> bool:
        return self._initialised

    def register(self, backend: object) -> None:
        """A backend that will open (and so acquire) soon: hold finalisation back for it."""
        with self._lock:
            self._pending.add(backend)

    def settle(self, backend: object) -> None:
        """The backend's `open` is over (succeeded, or failed and released what it took)."""
        with self._lock:
            self._pending.discard(backend)
            self._finalize_if_idle()

    def acquire(self) -> None:
        """Count one more user, initialising pyACL for the first."""
        with self._lock:
            if not self._initialised:
                self._init()
            self._users += 1

    def release(self) -> None:
        """Count one user less; pyACL is finalised once idle (its error, if any, is raised)."""
        with self._lock:
            if self._users <= 0:
                raise BackendError("pyACL released more often than acquired")
            self._users -= 1
            self._finalize_if_idle()

    def _finalize_if_idle(self) -> None:
        if self._initialised and self._users == 0 and not len(self._pending):
            self._initialised = False
            self._finalized = True
            check(acl.finalize(), "acl.finalize")
            log.info("pyACL finalised")

    def _init(self) -> None:
        ret = acl.init()
        if ret != ACL_SUCCESS and self._finalized:
            raise AclError("acl.init", ret, "pyACL allows one acl.init per process and this process "
                                            "already finalised it; restart yoloedge")
        check(ret, "acl.init")
        self._initialised = True
        log.info("pyACL initialised")


#: the one instance the backends share.
PROCESS = AclProcess()


@dataclass
class DeviceContext:
    """One card's context and stream, shared by the models of one device scope."""

    device: int
    context: int = 0
    stream: int = 0
    memcpy_in: int = ACL_MEMCPY_HOST_TO_DEVICE
    memcpy_out: int = ACL_MEMCPY_DEVICE_TO_HOST
    soc: str = ""
    cann: str = ""  # "major.minor.patch" from acl.get_version
    undo: UndoStack = field(default_factory=UndoStack)


def open_context(device: int) -> DeviceContext:
    """set_device -> create_context (bound to this thread) -> create_stream -> run mode; a failure
    releases what was taken (newest first) before its error is raised."""
    ctx = DeviceContext(device)
    try:
        check(acl.rt.set_device(device), "acl.rt.set_device", f"device {device}")
        ctx.undo.push("reset device", lambda: check(acl.rt.reset_device(device), "acl.rt.reset_device"))
        context = checked(acl.rt.create_context(device), "acl.rt.create_context", f"device {device}")
        ctx.context = context
        ctx.undo.push("destroy context", lambda: check(acl.rt.destroy_context(context), "acl.rt.destroy_context"))
        stream = checked(acl.rt.create_stream(), "acl.rt.create_stream")
        ctx.stream = stream
        ctx.undo.push("destroy stream", lambda: check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream"))
        run_mode = checked(acl.rt.get_run_mode(), "acl.rt.get_run_mode") if hasattr(acl.rt, "get_run_mode") \
            else ACL_HOST
    except BaseException:
        for err in ctx.undo.unwind():
            log.error("while releasing device %d after a failed open: %s", device, err)
        raise
    if run_mode == ACL_DEVICE:  # on the card's own CPU "host" memory is device memory
        ctx.memcpy_in = ctx.memcpy_out = ACL_MEMCPY_DEVICE_TO_DEVICE
    ctx.soc = acl.get_soc_name() if hasattr(acl, "get_soc_name") else ""
    ctx.cann = cann_version()
    return ctx


def cann_version() -> str:
    """"major.minor.patch" of the CANN runtime (`acl.get_version` -> (major, minor, patch, ret));
    "" where this pyACL has no such call or it fails (logged)."""
    if not hasattr(acl, "get_version"):
        return ""
    *parts, ret = acl.get_version()
    if ret != ACL_SUCCESS:
        name, meaning = describe_code(ret)
        log.warning("acl.get_version returned %s (%s: %s)", ret, name, meaning)
        return ""
    return ".".join(str(int(p)) for p in parts)


def close_context(ctx: DeviceContext) -> None:
    """destroy_stream -> destroy_context -> reset_device, on whichever thread closes the last model
    (its context bound first); every step runs, the first failure is raised."""
    errors: list[Exception] = []
    try:
        check(acl.rt.set_context(ctx.context), "acl.rt.set_context", "before destroying the stream")
    except AclError as exc:
        errors.append(exc)
    errors += ctx.undo.unwind()
    raise_collected(errors, f"the context of device {ctx.device}")


def host_array(ptr: int, nbytes: int) -> np.ndarray | None:
    """A writable uint8 array over `nbytes` of host memory at `ptr`, sharing it (no copy).

    Uses `acl.util.ptr_to_numpy` (zero-copy; deprecated but present in every documented CANN
    release), else a ctypes view of the address (real pyACL pointers are process addresses).
    Returns None when the array turns out not to share the memory: then the caller stages
    copies through `bytes` instead.
    """
    if hasattr(acl.util, "ptr_to_numpy"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # pyACL warns on every call of its deprecated helpers
            array = acl.util.ptr_to_numpy(ptr, (nbytes,), NPY_UINT8)
        for w in caught:
            log.debug("acl.util.ptr_to_numpy: %s", w.message)
    else:
        array = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
    array = np.asarray(array).reshape(-1)
    if array.dtype != np.uint8 or array.size != nbytes or not array.flags.writeable:
        return None
    return array if _shares_memory(array, ptr) else None


def _shares_memory(array: np.ndarray, ptr: int) -> bool:
    """Write a probe through the array and read it back through pyACL, where pyACL can read."""
    if not hasattr(acl.util, "ptr_to_bytes"):
        return True  # nothing to compare with: trust the documented zero-copy behaviour
    n = min(16, array.size)
    probe = np.arange(1, n + 1, dtype=np.uint8)
    saved = array[:n].copy()
    array[:n] = probe
    seen = acl.util.ptr_to_bytes(ptr, n)
    array[:n] = saved
    return bytes(seen) == probe.tobytes()


def can_stage() -> bool:
    """Whether this pyACL can copy through `bytes` (needed when no shared view is possible)."""
    return hasattr(acl.util, "bytes_to_ptr") and hasattr(acl.util, "ptr_to_bytes")
