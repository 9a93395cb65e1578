"""The cuda-python side of the TensorRT backend: return-code checking, copy kinds, handles, host views.

Only `cuda.bindings.runtime` is used (cuda-python 12.6.1 and later): the older `cuda.cudart` name
was deprecated in 12.9 and is gone in 13. Every call returns a tuple whose first element is a
`cudaError_t` (cudaSuccess == 0) and whose other elements are the results (None on failure).
`checked` turns a failure into one `CudaError` that names the call, the code and what it usually
means, and hands back the results otherwise.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cuda.bindings import runtime as cudart

from ..errors import BackendError

try:  # cuda-python 12.9.1+ has get_cuda_native_handle there (int(handle) is deprecated since)
    from cuda.bindings import utils as _utils
except ImportError:  # older releases have no utils module: int() is the way
    _utils = None

HOST_TO_DEVICE = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
DEVICE_TO_HOST = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

#: what the codes a deployment meets usually mean, for someone reading the log.
MEANINGS: dict[str, str] = {
    "cudaErrorInvalidValue": "invalid argument (pointer, size or copy direction)",
    "cudaErrorMemoryAllocation": "out of GPU or pinned host memory",
    "cudaErrorInitializationError": "the CUDA driver could not be initialised",
    "cudaErrorInsufficientDriver": "the NVIDIA driver is older than this CUDA runtime needs",
    "cudaErrorNoDevice": "no CUDA GPU visible (driver loaded? /dev/nvidia* in the container? "
                         "CUDA_VISIBLE_DEVICES?)",
    "cudaErrorInvalidDevice": "no GPU with this index",
    "cudaErrorInvalidResourceHandle": "invalid stream or handle",
    "cudaErrorIllegalAddress": "the GPU touched an invalid address; the CUDA context is lost, "
                               "restart the process",
    "cudaErrorLaunchFailure": "a kernel failed on the GPU",
}


class CudaError(BackendError):
    """A cuda-python call returned an error; `call`, `code` and `code_name` say which."""

    def __init__(self, call: str, code: Any, detail: str = ""):
        self.call = call
        self.code = int(code)
        self.code_name = code_name(code)
        meaning = MEANINGS.get(self.code_name)
        text = f"{call} failed with {self.code} ({self.code_name}{': ' + meaning if meaning else ''})"
        super().__init__(f"{text}; {detail}" if detail else text)


def code_name(code: Any) -> str:
    """`cudaErrorMemoryAllocation` for 2 (or its enum member); "unknown code" for anything else."""
    try:
        return cudart.cudaError_t(int(code)).name
    except ValueError:
        return "unknown code"


def checked(result: tuple, call: str, detail: str = "") -> Any:
    """The result(s) of a call (None when it has none); `CudaError` unless it succeeded."""
    err, *values = result
    if int(err) != 0:
        raise CudaError(call, err, detail)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def native_handle(handle: Any) -> int:
    """A stream (or other handle object) as the integer TensorRT's `execute_async_v3` takes:
    `get_cuda_native_handle` where this cuda-python has it, else `int()` (the only way before 12.9.1)."""
    convert = getattr(_utils, "get_cuda_native_handle", None)
    return int(convert(handle)) if convert is not None else int(handle)


def host_array(ptr: int, nbytes: int) -> np.ndarray:
    """A writable uint8 array over `nbytes` of host memory at `ptr` (pinned by cudaMallocHost), no copy."""
    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
