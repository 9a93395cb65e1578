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
    "ascend": (
        "yoloedge.backends.ascend", "AscendBackend",
        "pyACL comes with Huawei CANN: source /usr/local/Ascend/ascend-toolkit/set_env.sh "
        "(it is NOT the PyPI package 'pyacl')",
    ),
    "simulated": (
        "yoloedge.backends.simulated", "SimulatedBackend",
        "pip install onnxruntime (the simulated device records its outputs with it)",
    ),
}


def backend_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def create_backend(name: str, model_path: str, config: Any = None) -> Backend:
    """Import the backend named `name` and construct it (no device is touched yet).

    `name` is a registered backend or, for custom backends, "package.module:ClassName".
    """
    if name in REGISTRY:
        module_name, class_name, install = REGISTRY[name]
    elif ":" in name:
        module_name, class_name = name.split(":", 1)
        install = f"make the module {module_name!r} importable"
    else:
        raise BackendUnavailableError(
            f"unknown backend {name!r}: choose one of {', '.join(REGISTRY)} or give package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot load its runtime ({exc}); install it: {install}") from exc
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise BackendUnavailableError(f"backend {name!r}: {module_name} has no {class_name}") from None
    return cls(model_path, config)


def backend_config_for(accelerator: Any, device: int) -> Any:
    """The per-device settings handed to a backend's constructor."""
    from dataclasses import replace

    if accelerator.backend == "onnxruntime":
        return replace(accelerator.onnxruntime, device_id=device)
    if accelerator.backend == "ascend":
        from ..config.ascend import ascend_config

        return ascend_config(accelerator.options, device)
    if accelerator.backend == "simulated":
        from ..config.simulated import simulated_config

        return simulated_config(accelerator.options, device)
    return {**dict(accelerator.options), "device_id": device}


__all__ = ["Backend", "REGISTRY", "backend_config_for", "backend_names", "create_backend"]
