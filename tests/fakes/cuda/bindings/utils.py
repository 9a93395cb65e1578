"""Fake `cuda.bindings.utils`: `get_cuda_native_handle` exists from cuda-python 12.9.1 (where
`int(handle)` became deprecated); `_fake.reset(native_handle=False)` removes it, like an older release."""

from __future__ import annotations

import sys
from typing import Any


def _get_cuda_native_handle(obj: Any) -> int:
    from .runtime import cudaStream_t

    if isinstance(obj, cudaStream_t):
        return obj._handle
    raise TypeError(f"Unsupported type {type(obj).__name__}")


def install(native_handle: bool) -> None:
    module = sys.modules[__name__]
    if native_handle:
        module.get_cuda_native_handle = _get_cuda_native_handle  # type: ignore[attr-defined]
    elif hasattr(module, "get_cuda_native_handle"):
        del module.get_cuda_native_handle  # type: ignore[attr-defined]


install(True)
