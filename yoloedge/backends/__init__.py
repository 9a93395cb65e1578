"""Creating backends from the catalogue (`config.catalogue`), importing only the one in use.

Only the chosen backend's module is imported, so `acl` or `tensorrt` are never needed on a machine
that does not use them, and a missing runtime gives one `BackendUnavailableError` that says what to
install.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..config.catalogue import BACKEND_NAMES, CATALOGUE, BackendEntry
from ..errors import BackendUnavailableError
from .base import Backend, DeviceScope


def backend_names() -> tuple[str, ...]:
    return BACKEND_NAMES


def create_backend(name: str, model_path: str, config: Any = None) -> Backend:
    """Import the backend named `name` and construct it (no device is touched yet).

    `name` is a catalogue entry or, for custom backends, "package.module:ClassName".
    """
    entry = CATALOGUE.get(name)
    if entry is not None:
        module_name, class_name, install = entry.module, entry.class_name, entry.install
    elif ":" in name:
        module_name, class_name = name.split(":", 1)
        install = f"make the module {module_name!r} importable"
    else:
        raise BackendUnavailableError(
            f"unknown backend {name!r}: choose one of {', '.join(CATALOGUE)} or give package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot load its runtime ({exc}); install it: {install}") from exc
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise BackendUnavailableError(f"backend {name!r}: {module_name} has no {class_name}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendUnavailableError(f"backend {name!r}: {module_name}.{class_name} is not a "
                                      f"subclass of yoloedge.backends.base.Backend")
    return cls(model_path, config)


def backend_config_for(accelerator: Any, device: int) -> Any:
    """The per-device settings handed to a backend's constructor: the catalogue entry's settings
    object, or for a custom backend its `options` with the device index added."""
    entry = CATALOGUE.get(accelerator.backend)
    if entry is not None:
        return entry.device_config(accelerator, device)
    return {**dict(accelerator.options), "device_id": device}


__all__ = ["Backend", "BackendEntry", "CATALOGUE", "DeviceScope", "backend_config_for", "backend_names",
           "create_backend"]
