"""Lazy registry of accelerator backends.

Only the chosen backend's module is imported, so `acl` or `tensorrt` are never needed on a machine
that does not use them, and a missing runtime gives one `BackendUnavailableError` that says what to
install.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import BackendUnavailableError
from .base import Backend

#: backend name -> (module, class, what to install when its runtime is missing)
REGISTRY: dict[str, tuple[str, str, str]] = {
    "onnxruntime": (
        "yoloedge.backends.onnxruntime", "OnnxRuntimeBackend",
        "pip install onnxruntime (CPU), onnxruntime-gpu (CUDA/TensorRT) or onnxruntime-migraphx (AMD)",
    ),
}


def backend_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def create_backend(name: str, model_path: str, config: Any = None) -> Backend:
    """Import the backend named `name` and construct it (no device is touched yet)."""
    try:
        module_name, class_name, install = REGISTRY[name]
    except KeyError:
        raise BackendUnavailableError(
            f"unknown backend {name!r}: choose one of {', '.join(REGISTRY)}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot load its runtime ({exc}); install it: {install}") from exc
    return getattr(module, class_name)(model_path, config)


__all__ = ["Backend", "REGISTRY", "backend_names", "create_backend"]
